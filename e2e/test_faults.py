"""Faults of the platform under a SpeculativeDeployment: what survives what.

The test bed's components are real local processes (testbed/faults.py stops, pauses and
restarts them). GPU pods are KWOK-run (no engine), except in the crash-loop test, where the
process kubelet runs the engine command for real with an environment that makes it exit 1.

- kube-apiserver restarted mid-rollout, etcd paused mid-rollout (seen in flight: the new
  revision a canary under analysis, the old one still stable, when the fault begins; the verdict
  that promotes it comes after): the rollout ends in the new revision, once, with no duplicate
  revision and some revision serving at every sample the API server answered (the others are
  counted as unknown and reported).
- Kueue's controller down: its webhooks fail closed, so no new pod can be created; what was
  admitted keeps serving, the SD says it is waiting, and Kueue back finishes the rollout.
- A KWOK node deleted under a serving revision: its pods are replaced on another node by the
  revision's own ReplicaSet; no new revision.
- An engine that crash-loops (exit 1 after starting, again and again): a condition says so, the
  revision is never promoted, and no new revision is made for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import OperatorProcess, operator_config, operator_running, tiny_sd
from engine_harness import engine_python, tiny_models
from fault_injection import ServingSampler
from sd_bodies import H100, llama_8b
from specdeploy.api.times import parse_time
from test_operator import items, sd_of, wait_ready
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import condition, is_ready, is_serving
from testbed.faults import paused, restart, stopped

pytestmark = pytest.mark.e2e

__all__ = ["engine_python", "tiny_models"]  # fixtures used here (operator: conftest)

NAME = "faulty"
REVISION_LABEL = "specdeploy.dev/revision"


def serving(kubectl: Kubectl, namespace: str, other_than: str | None = None) -> str | None:
    """The stable revision once the SD is Ready on it (and it is not `other_than`)."""
    sd = sd_of(kubectl, namespace, NAME)
    stable = (sd.get("status") or {}).get("stableRevision")
    ready = is_ready(sd)
    return stable if ready and stable and stable != other_than else None


def revisions(kubectl: Kubectl, namespace: str) -> dict[str, int]:
    """Replicas of each revision Deployment of the SD."""
    return {
        d["metadata"]["labels"][REVISION_LABEL]: int(d["spec"].get("replicas") or 0)
        for d in items(kubectl, "deployments", namespace, NAME)
    }


@contextlib.contextmanager
def apiserver_restarted(cluster: ClusterEnv) -> Iterator[None]:
    restart(cluster, "kube-apiserver")
    yield


@contextlib.contextmanager
def etcd_paused(cluster: ClusterEnv) -> Iterator[None]:
    with paused(cluster, "etcd"):
        # A few seconds frozen: the API server's requests to etcd hang and time out.
        eventually(
            lambda: cluster.kubectl().run("get", "--raw", "/readyz", check=False).returncode != 0,
            30,
            "the API server to notice etcd is gone",
        )
    yield


FAULTS: dict[str, Callable[[ClusterEnv], contextlib.AbstractContextManager[None]]] = {
    "kube-apiserver restarted": apiserver_restarted,
    "etcd paused": etcd_paused,
}


#: A canary judged every 30 s on metrics KWOK pods never have: each verdict is Inconclusive, and
#: the first one promotes (onInconclusive: Promote). So the rollout stays in flight for an
#: interval after the canary is ready: time for a fault to land while it is, and be seen to.
IN_FLIGHT_ROLLOUT = {
    "canary": {"replicas": 1},
    "analysis": {"interval": "30s", "window": "30s", "onInconclusive": "Promote"},
}


def in_flight(kubectl: Kubectl, namespace: str, stable: str) -> dict[str, Any] | None:
    """The SD's status while a canary beside `stable` is under analysis with no outcome yet."""
    status = sd_of(kubectl, namespace, NAME).get("status") or {}
    canary = status.get("canaryRevision")
    analysis = status.get("analysis") or {}
    judging = analysis.get("revision") == canary and analysis.get("startedAt")
    undecided = analysis.get("outcome") not in ("Promote", "Rollback")
    ours = canary not in (None, stable) and status.get("stableRevision") == stable
    return status if ours and judging and undecided else None


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_rollout_survives_a_control_plane_fault_and_ends_once_in_the_new_revision(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    fault: str,
) -> None:
    kubectl.apply([llama_8b(NAME, namespace, "eagle3-r1", rollout=IN_FLIGHT_ROLLOUT)])
    wait_ready(kubectl, namespace, NAME)
    first = sd_of(kubectl, namespace, NAME)["status"]["stableRevision"]
    with ServingSampler(kubectl, namespace, NAME, period=0.5) as sampler:
        kubectl.apply([llama_8b(NAME, namespace, "eagle3-r2", rollout=IN_FLIGHT_ROLLOUT)])
        # Mid-rollout, seen: the new revision is a canary under analysis, the stable is still
        # the first revision, and no outcome yet.
        try:
            status = eventually(
                lambda: in_flight(kubectl, namespace, first), 60, "the canary analysed"
            )
        except TimeoutError as error:
            last = sd_of(kubectl, namespace, NAME).get("status")
            raise AssertionError(f"not in flight: {last}") from error
        second = status["canaryRevision"]
        log_offset = len(operator.log_text())
        fault_began = datetime.now(UTC)
        with FAULTS[fault](cluster):
            pass
        promoted = eventually(
            lambda: serving(kubectl, namespace, other_than=first), 180, "the new revision Ready"
        )
        eventually(
            lambda: revisions(kubectl, namespace) == {first: 0, second: 1},
            60,
            "the first revision at zero",
        )
    assert promoted == second
    assert operator.process is not None
    assert operator.process.poll() is None, "the operator died"
    sampler.check()
    print(f"\n{fault}: {sampler.report()}")
    # kopf retried the requests the fault failed: warnings, not errors (handlers/logs.py).
    retried = [
        line for line in operator.log_text()[log_offset:].splitlines() if "Request attempt" in line
    ]
    assert not [line for line in retried if " ERROR " in line], retried
    print(f"{fault}: {len(retried)} retried requests logged as warnings")
    status = sd_of(kubectl, namespace, NAME)["status"]
    assert [r["revision"] for r in status["revisions"]].count(second) == 1, status["revisions"]
    assert {r["revision"] for r in status["revisions"]} >= {first, second}
    # The verdict that promoted the canary came after the fault began: the fault landed while
    # the rollout was in flight.
    [record] = [r for r in status["revisions"] if r["revision"] == second]
    promoting = record["verdicts"][-1]
    assert parse_time(promoting["time"]) >= fault_began.replace(microsecond=0), (
        promoting,
        fault_began,
    )
    assert status["analysis"]["outcome"] == "Promote", status["analysis"]

    def pod_revisions() -> set[str]:
        return {
            p["metadata"]["labels"][REVISION_LABEL] for p in items(kubectl, "pods", namespace, NAME)
        }

    eventually(lambda: pod_revisions() == {second}, 60, "only the new revision's pods")


def test_kueue_down_blocks_new_pods_the_stable_serves_and_kueue_back_finishes_the_rollout(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl.apply([llama_8b(NAME, namespace, draft_revision="eagle3-r1")])
    wait_ready(kubectl, namespace, NAME)
    first = sd_of(kubectl, namespace, NAME)["status"]["stableRevision"]
    with ServingSampler(kubectl, namespace, NAME) as sampler:
        with stopped(cluster, "kueue"):
            offset = len(operator.log_text())
            kubectl.apply([llama_8b(NAME, namespace, draft_revision="eagle3-r2")])
            # Kueue's webhooks fail closed: the API server refuses the new revision's
            # Deployment (its pods would be refused too). The operator retries; nothing moves.
            eventually(
                lambda: operator.log_text().count("mdeployment.kb.io", offset) >= 2,
                90,
                "the operator's Deployment create refused twice by Kueue's webhook",
            )
            sd = sd_of(kubectl, namespace, NAME)
            assert revisions(kubectl, namespace) == {first: 1}, "no new revision without Kueue"
            assert [
                p["metadata"]["labels"][REVISION_LABEL]
                for p in items(kubectl, "pods", namespace, NAME)
            ] == [first]
            # The status still describes the last generation it acted on: the new spec is
            # not observed yet, and the stable revision serves.
            assert sd["status"]["observedGeneration"] < sd["metadata"]["generation"], sd["status"]
            assert sd["status"]["stableRevision"] == first
            assert condition(sd, "Ready")["status"] == "True"
        second = eventually(
            lambda: serving(kubectl, namespace, other_than=first), 120, "the new revision Ready"
        )
    sampler.check()
    sd = sd_of(kubectl, namespace, NAME)
    assert sd["status"]["observedGeneration"] == sd["metadata"]["generation"]
    assert condition(sd, "Admitted")["status"] == "True"
    eventually(lambda: revisions(kubectl, namespace) == {first: 0, second: 1}, 60, "first at zero")


def test_a_deleted_node_under_a_serving_revision_has_its_pods_replaced_without_a_new_revision(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    body = llama_8b(NAME, namespace)
    # Whole H100s, which two nodes have. (With MIG the pod would go to the only MIG node: its
    # deletion changes the sizing itself, and so the revision.)
    body["spec"]["placement"]["gpu"] = {"product": H100, "mig": "Never"}
    kubectl.apply([body])
    wait_ready(kubectl, namespace, NAME)
    revision = sd_of(kubectl, namespace, NAME)["status"]["stableRevision"]
    [pod] = items(kubectl, "pods", namespace, NAME)
    node = pod["spec"]["nodeName"]
    saved = kubectl.get_json("node", node)
    try:
        kubectl.run("delete", "node", node)

        def replaced() -> dict[str, Any] | None:
            pods = [
                p
                for p in items(kubectl, "pods", namespace, NAME)
                if p["metadata"]["name"] != pod["metadata"]["name"]
            ]
            ready = [p for p in pods if p["spec"].get("nodeName") and is_serving(p)]
            return ready[0] if ready and serving(kubectl, namespace) else None

        # The pod garbage collector deletes pods bound to a node that is gone; the revision's
        # ReplicaSet makes a new one, which Kueue admits and the scheduler puts elsewhere.
        new = eventually(replaced, 240, "a replacement pod Ready on another node")
        assert new["spec"]["nodeName"] != node
        assert new["metadata"]["labels"][REVISION_LABEL] == revision
        assert revisions(kubectl, namespace) == {revision: 1}, "no new revision"
        status = sd_of(kubectl, namespace, NAME)["status"]
        assert status["stableRevision"] == revision
        assert [r["revision"] for r in status["revisions"]] == [revision]
    finally:
        restore_node(kubectl, saved)


def restore_node(kubectl: Kubectl, saved: dict[str, Any]) -> None:
    """Creates the deleted KWOK node again as it was (KWOK takes it back by its annotation)."""
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            k: v for k, v in saved["metadata"].items() if k in ("name", "labels", "annotations")
        },
        "spec": {},
        "status": {
            k: v for k, v in saved["status"].items() if k in ("capacity", "allocatable", "nodeInfo")
        },
    }
    kubectl.apply([node])


@pytest.fixture
def local_process_operator(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    namespace: str,
    engine_python: Path,
    tmp_path: Path,
    *,
    sd_crd: None,
) -> Iterator[OperatorProcess]:
    """The operator in local-process mode: the process kubelet runs its pods' engine command."""
    config = operator_config(str(engine_python), cluster.prometheus_url)
    running = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    with operator_running(running, kubectl, namespace):
        yield running


def test_an_engine_that_crash_loops_is_named_in_ready_never_promoted_and_not_remade(
    kubectl: Kubectl,
    namespace: str,
    tiny_models: dict[str, str],
    tmp_path: Path,
    local_process_operator: OperatorProcess,
) -> None:
    # The process kubelet runs the engine command for real; with PYTHONPATH pointing at an
    # empty folder the launcher cannot be imported and the engine exits 1 at every start.
    body = tiny_sd(NAME, namespace, tiny_models, "draft-small", "1-crash")
    empty = tmp_path / "empty"
    empty.mkdir()
    for entry in body["spec"]["engine"]["env"]:
        if entry["name"] == "PYTHONPATH":
            entry["value"] = str(empty)
    kubectl.apply([body])

    def crash_looping() -> dict[str, Any] | None:
        ready = condition(sd_of(kubectl, namespace, NAME), "Ready")
        return ready if ready.get("reason") == "EngineCrashLooping" else None

    ready = eventually(crash_looping, 180, "Ready to name the crash loop")
    assert ready["status"] == "False"
    assert "keeps exiting (exit 1," in ready["message"], ready
    [revision] = revisions(kubectl, namespace)
    # It goes on restarting under back-off; the operator makes nothing new meanwhile.
    offset = len(local_process_operator.log_text())

    def restarts() -> int:
        [pod] = items(kubectl, "pods", namespace, NAME)
        [engine] = pod["status"]["containerStatuses"]
        return int(engine["restartCount"])

    eventually(lambda: restarts() >= 2, 180, "the engine restarted twice")
    local_process_operator.wait_for_reconciles(offset, namespace, NAME, count=10)
    assert revisions(kubectl, namespace) == {revision: 1}, "no new revision"
    sd = sd_of(kubectl, namespace, NAME)
    assert sd["status"].get("stableRevision") is None, "a crash-looping revision is not promoted"
    assert [r["revision"] for r in sd["status"]["revisions"]] == [revision]
    assert condition(sd, "Ready")["reason"] == "EngineCrashLooping"
