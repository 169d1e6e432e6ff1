"""Reconcile with the launcher's refusal in a pod: the revision stops, the stable one serves."""

from __future__ import annotations

from typing import Any

from fake_kube import FakeKube
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler
from test_reconcile import NODES, sd_body

LINE = "draft was trained for verifier other/target, but the target is meta-llama/x"


def refused_pod(revision: str) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"chat-{revision}-abc",
            "namespace": "ns",
            "labels": {"specdeploy.dev/name": "chat", "specdeploy.dev/revision": revision},
        },
        "status": {
            "containerStatuses": [
                {
                    "name": "engine",
                    "restartCount": 1,
                    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 3, "message": LINE}},
                }
            ]
        },
    }


def test_a_refused_new_pair_is_stopped_while_the_stable_one_serves_then_goes_quiet() -> None:
    kube = FakeKube(NODES)
    body = sd_body("r1")
    kube.objects[("SpeculativeDeployment", "ns", "chat")] = body
    events: list[tuple[str, str, str]] = []
    reconciler = Reconciler(
        kube,  # type: ignore[arg-type]
        OperatorConfig(),
        lambda _body, type_, reason, message: events.append((type_, reason, message)),
    )
    reconciler.reconcile("ns", "chat")
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    [stable_name] = kube.deployments()
    stable = stable_name.removeprefix("chat-")

    sd = kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["pair"]["draft"]["revision"] = "r2"
    sd["metadata"]["generation"] = 2
    reconciler.reconcile("ns", "chat")
    [new_name] = [n for n in kube.deployments() if n != stable_name]
    new = new_name.removeprefix("chat-")
    assert kube.deployments() == {stable_name: 1, new_name: 1}

    kube.pods = [refused_pod(new)]
    events.clear()
    reconciler.reconcile("ns", "chat")
    assert kube.deployments() == {stable_name: 1, new_name: 0}
    status = kube.objects[("SpeculativeDeployment", "ns", "chat")]["status"]
    pair = next(c for c in status["conditions"] if c["type"] == "PairCompatible")
    assert (pair["status"], pair["reason"], pair["message"]) == ("False", "PairIncompatible", LINE)
    assert status["stableRevision"] == stable
    assert status["phase"] == "Degraded"
    assert {r["revision"]: r["phase"] for r in status["revisions"]} == {
        stable: "Stable",
        new: "Failed",
    }
    assert ("Warning", "PairIncompatible") in [(t, r) for t, r, _ in events]

    # The pod is gone once scaled to zero; the refusal holds and nothing is written again.
    kube.pods = []
    kube.make_ready()
    reconciler.reconcile("ns", "chat")
    writes = kube.write_requests
    events.clear()
    for _ in range(3):
        reconciler.reconcile("ns", "chat")
    assert kube.write_requests == writes
    assert events == []
    assert kube.deployments() == {stable_name: 1, new_name: 0}
