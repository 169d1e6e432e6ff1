"""Faults of the platform under a SpeculativeDeployment: what survives what.

The test bed's components are real local processes (testbed/faults.py stops, pauses and
restarts them). GPU pods are KWOK-run (no engine), except in the crash-loop test, where the
process kubelet runs the engine command for real with an environment that makes it exit 1.

- kube-apiserver restarted mid-rollout, etcd paused mid-rollout: the rollout ends in the new
  revision, once, with no duplicate revision and some revision serving at every sample.
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
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import OperatorProcess, operator_config, tiny_sd
from engine_harness import engine_python, tiny_models
from fault_injection import ServingSampler
from sd_bodies import H100, llama_8b
from test_operator import condition, items, operator, sd_of, wait_ready
from testbed import ClusterEnv, Kubectl, eventually
from testbed.faults import paused, restart, stopped

pytestmark = pytest.mark.e2e

__all__ = ["engine_python", "operator", "tiny_models"]  # fixtures used here

NAME = "faulty"
REVISION_LABEL = "specdeploy.dev/revision"


def serving(kubectl: Kubectl, namespace: str, other_than: str | None = None) -> str | None:
    """The stable revision once the SD is Ready on it (and it is not `other_than`)."""
    sd = sd_of(kubectl, namespace, NAME)
    stable = (sd.get("status") or {}).get("stableRevision")
    ready = condition(sd, "Ready").get("status") == "True"
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


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_rollout_survives_a_control_plane_fault_and_ends_once_in_the_new_revision(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    fault: str,
) -> None:
    kubectl.apply([llama_8b(NAME, namespace, draft_revision="eagle3-r1")])
    wait_ready(kubectl, namespace, NAME)
    first = sd_of(kubectl, namespace, NAME)["status"]["stableRevision"]
    with ServingSampler(kubectl, namespace, NAME, period=0.5) as sampler:
        kubectl.apply([llama_8b(NAME, namespace, draft_revision="eagle3-r2")])
        # Mid-rollout: the new revision's Deployment made, its pods not yet serving.
        eventually(lambda: len(revisions(kubectl, namespace)) == 2, 60, "the new revision")
        with FAULTS[fault](cluster):
            pass
        second = eventually(
            lambda: serving(kubectl, namespace, other_than=first), 180, "the new revision Ready"
        )
        eventually(
            lambda: revisions(kubectl, namespace) == {first: 0, second: 1},
            60,
            "the first revision at zero",
        )
    assert operator.process is not None and operator.process.poll() is None, "operator died"
    sampler.check()
    print(f"\n{fault}: {len(sampler.samples)} samples, {len(sampler.errors)} without the API")
    status = sd_of(kubectl, namespace, NAME)["status"]
    assert [r["revision"] for r in status["revisions"]].count(second) == 1, status["revisions"]
    assert {r["revision"] for r in status["revisions"]} >= {first, second}

    def pod_revisions() -> set[str]:
        return {
            p["metadata"]["labels"][REVISION_LABEL] for p in items(kubectl, "pods", namespace, NAME)
        }

    eventually(lambda: pod_revisions() == {second}, 60, "only the new revision's pods")
