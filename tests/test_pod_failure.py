"""Why pods of a revision cannot start, read from the pods (plan.status.pod_failure), and how
Ready and Progressing say it (plan.status.report)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from specdeploy.api.conditions import Reason
from specdeploy.plan.status.pod_failure import read_pod_failure


def pod(
    name: str,
    revision: str = "r1",
    *,
    engine: dict[str, Any] | None = None,
    scheduled: dict[str, Any] | None = None,
    node: str | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "labels": {"specdeploy.dev/revision": revision}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status: dict[str, Any] = {"conditions": [{"type": "PodScheduled", **(scheduled or {})}]}
    if engine is not None:
        status["containerStatuses"] = [{"name": "engine", "ready": False, **engine}]
    return {"metadata": metadata, "spec": {"nodeName": node} if node else {}, "status": status}


PULL = {
    "state": {
        "waiting": {
            "reason": "ImagePullBackOff",
            "message": 'Back-off pulling image "registry.invalid/engine:1"',
        }
    }
}
CONFIG = {
    "state": {
        "waiting": {
            "reason": "CreateContainerConfigError",
            "message": 'secret "hf-token" not found',
        }
    }
}
OOM = {
    "restartCount": 2,
    "state": {"waiting": {"reason": "CrashLoopBackOff"}},
    "lastState": {"terminated": {"reason": "OOMKilled", "exitCode": 137}},
}
UNSCHEDULABLE = {
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/5 nodes are available: 5 node(s) didn't match Pod's node affinity/selector.",
}


@pytest.mark.parametrize(
    ("shown", "reason", "described"),
    [
        (
            pod("p-0", engine=PULL, node="n1"),
            Reason.IMAGE_PULL_FAILED,
            "revision r1: pod p-0 cannot pull its image: ImagePullBackOff: Back-off pulling image "
            '"registry.invalid/engine:1"',
        ),
        (
            pod("p-0", engine=CONFIG, node="n1"),
            Reason.CREATE_CONTAINER_CONFIG_ERROR,
            "revision r1: pod p-0 cannot start its engine (CreateContainerConfigError): "
            'CreateContainerConfigError: secret "hf-token" not found',
        ),
        (
            pod("p-0", engine=OOM, node="n1"),
            Reason.OOM_KILLED,
            "revision r1: the engine of pod p-0 ran out of memory: OOMKilled (exit 137) over its "
            "memory limit, 2 restarts",
        ),
        (
            pod("p-0", scheduled=UNSCHEDULABLE),
            Reason.POD_UNSCHEDULABLE,
            "revision r1: pod p-0 cannot be scheduled: 0/5 nodes are available: 5 node(s) didn't "
            "match Pod's node affinity/selector.",
        ),
    ],
)
def test_each_reason_is_named_with_the_pod(
    shown: dict[str, Any], reason: str, described: str
) -> None:
    found = read_pod_failure([shown], "r1")
    assert found is not None
    assert (found.pod, found.reason) == ("p-0", reason)
    assert found.describe("r1") == described


def test_kueues_gate_a_running_engine_and_other_revisions_are_no_failure() -> None:
    gated = {"status": "False", "reason": "SchedulingGated", "message": "gated"}
    running = {"state": {"running": {}}, "ready": False}
    ready_after_oom = {**OOM, "ready": True, "state": {"running": {}}}
    assert read_pod_failure([pod("p-0", scheduled=gated)], "r1") is None
    assert read_pod_failure([pod("p-0", engine=running, node="n1")], "r1") is None
    assert read_pod_failure([pod("p-0", engine=ready_after_oom, node="n1")], "r1") is None
    assert read_pod_failure([pod("p-0", "old", engine=PULL, node="n1")], "r1") is None
    assert read_pod_failure([pod("p-0", engine=PULL, node="n1", deleting=True)], "r1") is None
    assert read_pod_failure([pod("p-0", engine=PULL, node="n1")], None) is None


def test_the_most_telling_reason_wins_and_the_first_pod_by_name_shows_it() -> None:
    pods = [
        pod("p-2", scheduled=UNSCHEDULABLE),
        pod("p-1", engine=PULL, node="n1"),
        pod("p-3", engine=OOM, node="n1"),
        pod("p-0", engine=PULL, node="n1"),
    ]
    found = read_pod_failure(pods, "r1")
    assert found is not None
    assert (found.pod, found.reason) == ("p-3", Reason.OOM_KILLED)
    without_oom = read_pod_failure(pods[:2] + pods[3:], "r1")
    assert without_oom is not None
    assert (without_oom.pod, without_oom.reason) == ("p-0", Reason.IMAGE_PULL_FAILED)
    assert dataclasses.replace(without_oom, message="").describe("r1").endswith("its image")
