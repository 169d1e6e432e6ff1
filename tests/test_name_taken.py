"""An SD never takes over an object of a child's name that it does not own: the object is left
exactly as it is, the SD says so (status.refusedWrites, Ready NameTaken, a Warning), and the rest
of its reconcile goes on (plan.children.ownership, the apply path of handlers.reconcile)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import test_reconcile
from specdeploy.api import labels
from specdeploy.plan.children.ownership import foreign_holder
from test_reconcile import condition, sd_body, status

VICTIM_SERVICE: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {
        "name": "chat",
        "namespace": "ns",
        "uid": "u-victim",
        "resourceVersion": "7",
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "generation": 1,
    },
    "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
}


def test_a_persons_service_of_the_sds_name_is_left_untouched_and_named_in_status() -> None:
    kube, reconciler, events = test_reconcile.setup(sd_body())
    kube.objects[("Service", "ns", "chat")] = copy.deepcopy(VICTIM_SERVICE)
    reconciler.reconcile("ns", "chat")

    assert kube.objects[("Service", "ns", "chat")] == VICTIM_SERVICE, "the Service was written"
    # The rest goes on: the revision and the PodMonitor are made, sizing is said.
    [name] = kube.deployments()
    assert ("PodMonitor", "ns", "chat") in kube.objects
    assert condition(kube, "Sized")["status"] == "True"
    ready = condition(kube, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameTaken")
    assert "Service chat is not this SD's (not made by specdeploy for this SD)" in ready["message"]
    (refused,) = status(kube)["refusedWrites"]
    assert (refused["kind"], refused["name"], refused["reason"]) == ("Service", "chat", "NameTaken")
    assert [r for r, _ in events].count("NameTaken") == 1

    kube.make_ready()
    writes, told = kube.write_requests, len(events)
    reconciler.reconcile("ns", "chat")
    assert status(kube)["phase"] == "Degraded", "ready pods, but no Service of its own"
    for _ in range(3):
        reconciler.reconcile("ns", "chat")
    assert kube.objects[("Service", "ns", "chat")] == VICTIM_SERVICE
    assert [r for r, _ in events[told:]].count("NameTaken") == 0, "the refusal was told again"
    assert kube.write_requests - writes <= 1, "more than the one status write of Ready pods"

    # Its owner removes it: the next reconcile makes the SD's own.
    del kube.objects[("Service", "ns", "chat")]
    reconciler.reconcile("ns", "chat")
    service = kube.objects[("Service", "ns", "chat")]
    assert service["spec"]["selector"] == {labels.NAME: "chat"}
    assert service["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert status(kube)["refusedWrites"] == []
    assert condition(kube, "Ready")["status"] == "True"
    assert status(kube)["phase"] == "Serving"
    assert name in kube.deployments()


def test_a_revision_deployment_name_another_controller_owns_is_not_applied() -> None:
    kube, reconciler, events = test_reconcile.setup(sd_body())
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    # The name now belongs to someone else's Deployment (another owner, labels of ours).
    theirs = copy.deepcopy(kube.objects[("Deployment", "ns", name)])
    theirs["metadata"]["ownerReferences"] = [
        {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "other", "uid": "u-other"}
    ]
    theirs["spec"]["replicas"] = 0
    kube.objects[("Deployment", "ns", name)] = theirs
    reconciler.reconcile("ns", "chat")

    assert kube.objects[("Deployment", "ns", name)] == theirs
    ready = condition(kube, "Ready")
    assert ready["reason"] == "NameTaken"
    assert f"Deployment {name} is not this SD's (owned by ReplicaSet other)" in ready["message"]
    progressing = condition(kube, "Progressing")
    assert (progressing["status"], progressing["reason"]) == ("False", "NameTaken")
    assert "NameTaken" in [r for r, _ in events]


def test_an_orphan_labelled_as_this_sds_child_is_adopted() -> None:
    kube, reconciler, _ = test_reconcile.setup(sd_body())
    orphan = copy.deepcopy(VICTIM_SERVICE)
    orphan["metadata"]["labels"] = {labels.NAME: "chat", labels.MANAGED_BY: "specdeploy"}
    kube.objects[("Service", "ns", "chat")] = orphan
    reconciler.reconcile("ns", "chat")
    service = kube.objects[("Service", "ns", "chat")]
    assert service["spec"]["selector"] == {labels.NAME: "chat"}
    assert service["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert "refusedWrites" not in status(kube)


def _object(
    owners: list[dict[str, Any]] | None = None, marks: dict[str, str] | None = None
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "chat", "labels": dict(marks or {})}
    if owners is not None:
        metadata["ownerReferences"] = owners
    return {"metadata": metadata}


OURS = {"kind": "SpeculativeDeployment", "name": "chat", "uid": "u-1", "controller": True}
MARKS = {labels.NAME: "chat", labels.MANAGED_BY: "specdeploy"}


@pytest.mark.parametrize(
    ("live", "holder"),
    [
        (None, None),
        (_object([OURS]), None),
        (_object([OURS]) | {"extra": 1}, None),
        (_object(marks=MARKS), None),
        (_object(), "not made by specdeploy for this SD"),
        (_object(marks={labels.NAME: "chat"}), "not made by specdeploy for this SD"),
        (_object(marks={labels.MANAGED_BY: "specdeploy"}), "not made by specdeploy for this SD"),
        (_object(marks=MARKS | {labels.NAME: "other"}), "not made by specdeploy for this SD"),
        (_object([OURS | {"uid": "u-0"}], MARKS), "owned by SpeculativeDeployment chat"),
        (
            _object(
                [
                    {"kind": "Job", "name": "a"},
                    {"kind": "Deployment", "name": "web", "controller": True},
                ]
            ),
            "owned by Deployment web",
        ),
        (_object([{"kind": "Job", "name": "a"}, OURS]), None),
    ],
)
def test_whose_object_a_childs_name_holds(live: dict[str, Any] | None, holder: str | None) -> None:
    assert foreign_holder(live, "chat", "u-1") == holder
