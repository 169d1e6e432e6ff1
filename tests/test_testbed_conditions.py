"""What the e2e tests and the benchmarks call ready, read from an object as the API answered."""

from __future__ import annotations

from typing import Any

from testbed.conditions import condition, is_ready, is_serving


def obj(*conditions: tuple[str, str], deleting: bool = False) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p"}
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-29T04:00:00Z"
    listed = [{"type": kind, "status": status} for kind, status in conditions]
    return {"metadata": metadata, "status": {"conditions": listed}}


def test_an_object_is_ready_by_its_ready_condition_alone() -> None:
    assert is_ready(obj(("Ready", "True")))
    assert is_ready(obj(("PodScheduled", "True"), ("Ready", "True")))
    assert not is_ready(obj(("Ready", "False")))
    assert not is_ready(obj(("Ready", "Unknown")))
    assert not is_ready(obj(("ContainersReady", "True")))
    assert not is_ready({"metadata": {"name": "sd"}})
    assert not is_ready({"metadata": {"name": "sd"}, "status": None})


def test_a_pod_being_deleted_serves_no_more_whatever_its_ready_condition_says() -> None:
    assert is_serving(obj(("Ready", "True")))
    assert is_ready(obj(("Ready", "True"), deleting=True))
    assert not is_serving(obj(("Ready", "True"), deleting=True))
    assert not is_serving(obj(("Ready", "False")))


def test_a_condition_is_read_whole_and_an_absent_one_is_empty() -> None:
    found = obj(("Ready", "False"))
    found["status"]["conditions"][0]["reason"] = "Unschedulable"
    ready = {"type": "Ready", "status": "False", "reason": "Unschedulable"}
    assert condition(found, "Ready") == ready
    assert condition(found, "Progressing") == {}
    # A copy: changing it leaves the object as read.
    condition(found, "Ready")["status"] = "True"
    assert not is_ready(found)
