"""A revision is ready as soon as its pods are: the pod store's Ready pods count beside the
Deployment's readyReplicas, and a pod's turn to Ready asks for a reconcile."""

from __future__ import annotations

from typing import Any

from specdeploy.adapters import watch_cache as wc
from specdeploy.api import labels
from specdeploy.handlers.run import Queues, route_event
from specdeploy.plan.rollout.canary import canary_ready
from specdeploy.plan.rollout.revisions import (
    read_revision_deployment,
    ready_pods_by_revision,
)
from test_reconcile import condition, sd_body, setup


def deployment(revision: str, *, ready: int = 0, replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"chat-{revision}",
            "generation": 1,
            "labels": {labels.REVISION: revision},
        },
        "spec": {"replicas": replicas, "template": {"spec": {"containers": []}}},
        "status": {"observedGeneration": 1, "replicas": replicas, "readyReplicas": ready},
    }


def pod(
    revision: str, name: str = "p", *, ready: bool = True, deleting: bool = False, version: int = 1
) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": "ns",
        "uid": f"uid-{name}",
        "resourceVersion": str(version),
        "labels": {labels.NAME: "chat", labels.REVISION: revision},
    }
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    return {
        "metadata": metadata,
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_deployment_is_as_ready_as_its_ready_pods_when_its_status_lags() -> None:
    pods = [pod("a", "p1"), pod("a", "p2", ready=False), pod("a", "p3", deleting=True)]
    found = read_revision_deployment(deployment("a", replicas=1), ready_pods_by_revision(pods))
    assert found is not None
    assert found.ready_replicas == 1
    assert found.fully_ready
    assert found.pods == 1


def test_the_status_counts_when_it_is_ahead_and_other_revisions_pods_do_not_count() -> None:
    ready_pods = ready_pods_by_revision([pod("b", "p1"), pod("b", "p2")])
    found = read_revision_deployment(deployment("a", ready=1, replicas=2), ready_pods)
    assert found is not None
    assert found.ready_replicas == 1
    assert not found.fully_ready


def test_a_leader_worker_set_counts_groups_from_its_status_alone() -> None:
    group = deployment("a", replicas=1)
    group["spec"] = {"replicas": 1, "leaderWorkerTemplate": {"size": 2}}
    found = read_revision_deployment(group, ready_pods_by_revision([pod("a"), pod("a", "w")]))
    assert found is not None
    assert found.ready_replicas == 0


def reconciles(*events: tuple[str, dict[str, Any]]) -> list[list[tuple[str, str]]]:
    """The reconciles each pod event asks for, fed one after another into a pod store."""
    cache, asked = wc.WatchCache(["ns"]), []
    for event_type, obj in events:
        queues = Queues()
        route_event(cache, queues, wc.PODS, event_type, obj)
        keys = []
        while (key := queues.reconciles.get_nowait()) is not None:
            keys.append(key)
            queues.reconciles.done(key)
        asked.append(keys)
    return asked


def test_a_pod_turning_ready_reconciles_its_sd_once() -> None:
    assert reconciles(
        ("ADDED", pod("a", ready=False, version=1)),
        ("MODIFIED", pod("a", ready=True, version=2)),
        ("MODIFIED", pod("a", ready=True, version=3)),
        ("MODIFIED", pod("a", ready=False, version=4)),
    ) == [[], [("ns", "chat")], [], []]


def test_a_pod_first_seen_ready_reconciles_its_sd_but_not_while_deleted() -> None:
    assert reconciles(("ADDED", pod("a", ready=True))) == [[("ns", "chat")]]
    assert reconciles(("ADDED", pod("a", ready=True, deleting=True))) == [[]]


def test_an_sd_is_ready_once_its_pod_is_before_its_deployment_counts_it() -> None:
    kube, reconciler, _ = setup(sd_body())
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    revision = name.removeprefix("chat-")
    deployment_status = kube.objects[("Deployment", "ns", name)]
    deployment_status["status"] = {"observedGeneration": 1, "replicas": 1}
    kube.pods.append(pod(revision))
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Ready")["status"] == "True"
    assert kube.objects[("SpeculativeDeployment", "ns", "chat")]["status"]["readyReplicas"] == 1


def unobserved(revision: str, *, ready: int = 0, replicas: int = 1) -> dict[str, Any]:
    """A revision Deployment whose latest spec the controller has not seen: generation 2,
    its status of generation 1."""
    found = deployment(revision, ready=ready, replicas=replicas)
    found["metadata"]["generation"] = 2
    return found


def test_ready_pods_count_before_the_controller_has_seen_the_spec() -> None:
    created = deployment("a")
    created["status"] = {}
    found = read_revision_deployment(created, ready_pods_by_revision([pod("a")]))
    assert found is not None
    assert not found.observed
    assert found.fully_ready
    two = read_revision_deployment(unobserved("a", replicas=2), ready_pods_by_revision([pod("a")]))
    assert two is not None
    assert not two.fully_ready


def test_a_status_of_an_older_spec_counts_no_ready_replicas() -> None:
    # Its 3 ready replicas may be from before a scale-down and up again: no pods, no claim.
    found = read_revision_deployment(unobserved("a", ready=3, replicas=2), {})
    assert found is not None
    assert not found.fully_ready
    # Nor does a scale to zero count as done before the controller has seen it.
    zero = read_revision_deployment(unobserved("a", replicas=0), ready_pods_by_revision([]))
    assert zero is not None
    assert not zero.fully_ready


def test_a_canary_is_ready_once_its_pods_are_before_the_controller_has_seen_it() -> None:
    found = read_revision_deployment(unobserved("b"), ready_pods_by_revision([pod("b")]))
    assert found is not None
    assert canary_ready("b", [found], 1)
    alone = read_revision_deployment(unobserved("b", ready=1), {})
    assert alone is not None
    assert not canary_ready("b", [alone], 1)


def test_an_sd_is_ready_once_its_pod_is_before_its_deployment_is_observed() -> None:
    # The store holds the API's answer to our create (no status) until the controller writes
    # one; the pod's turn to Ready is enough.
    kube, reconciler, _ = setup(sd_body())
    reconciler.reconcile("ns", "chat")
    [name] = kube.deployments()
    kube.objects[("Deployment", "ns", name)]["status"] = {}
    kube.pods.append(pod(name.removeprefix("chat-")))
    reconciler.reconcile("ns", "chat")
    assert condition(kube, "Ready")["status"] == "True"
