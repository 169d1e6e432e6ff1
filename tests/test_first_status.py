"""plan.status.first_status: when a new SD's first status may wait for its pods."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from specdeploy.plan.rollout.revisions import RolloutEvent
from specdeploy.plan.status.first_status import FIRST_STATUS_GRACE, first_status_due

CREATED = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)
SOON = CREATED + timedelta(milliseconds=400)
SIZED = RolloutEvent("Sized", "Sized=True: 1 x nvidia.com/mig-3g.40gb")


def body(**metadata: Any) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": "2026-11-29T10:00:00Z", **metadata}}


def not_ready(reason: str = "ReplicasNotReady") -> dict[str, Any]:
    return {"conditions": [{"type": "Ready", "status": "False", "reason": reason}]}


def test_a_young_sd_whose_replicas_are_only_not_ready_yet_waits_until_the_grace_ends() -> None:
    assert first_status_due(body(), not_ready(), (SIZED,), SOON) == CREATED + FIRST_STATUS_GRACE
    last = CREATED + FIRST_STATUS_GRACE - timedelta(microseconds=1)
    assert first_status_due(body(), not_ready(), (), last) == CREATED + FIRST_STATUS_GRACE


def test_the_status_is_written_now_once_the_grace_has_passed() -> None:
    assert first_status_due(body(), not_ready(), (), CREATED + FIRST_STATUS_GRACE) is None


def test_an_sd_that_has_had_a_status_is_never_held() -> None:
    held = {**body(), "status": {"phase": "Pending"}}
    assert first_status_due(held, not_ready(), (), SOON) is None


def test_ready_or_any_other_reason_on_ready_is_written_now() -> None:
    ready = {"conditions": [{"type": "Ready", "status": "True", "reason": "AllReplicasReady"}]}
    assert first_status_due(body(), ready, (), SOON) is None
    for reason in ("PodUnschedulable", "PairIncompatible", "WaitingForQuota", "ModelNotFound"):
        assert first_status_due(body(), not_ready(reason), (), SOON) is None, reason
    assert first_status_due(body(), {"conditions": []}, (), SOON) is None


def test_a_warning_is_written_now() -> None:
    bypassed = RolloutEvent("QuotaBypassed", "Admitted=False: ...", warning=True)
    assert first_status_due(body(), not_ready(), (SIZED, bypassed), SOON) is None


def test_a_creation_time_unknown_or_ahead_of_the_operators_clock_is_written_now() -> None:
    # A clock behind the API server's must not hold the status back for as long as it lags.
    assert first_status_due(body(), not_ready(), (), CREATED - timedelta(seconds=30)) is None
    assert first_status_due({"metadata": {}}, not_ready(), (), SOON) is None
    assert first_status_due(body(creationTimestamp="soon"), not_ready(), (), SOON) is None
