"""A verdict is taken when it falls due, not at the next periodic round (plan.rollout.wakeup)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specdeploy.api.models import AnalysisStatus, CollapseStatus
from specdeploy.plan.rollout.wakeup import MARGIN, next_collapse_at, next_verdict_at, next_wake
from test_canary import BAD, started

START = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def analysis(last_interval: int = -1, outcome: str = "Continue") -> AnalysisStatus:
    return AnalysisStatus(
        revision="r2",
        started_at="2026-11-23T12:00:00Z",
        last_interval=last_interval,
        outcome=outcome,
    )


def test_the_next_verdict_falls_due_as_the_next_interval_closes() -> None:
    assert next_verdict_at(analysis(), "10s") == START + timedelta(seconds=10) + MARGIN
    assert next_verdict_at(analysis(0), "10s") == START + timedelta(seconds=20) + MARGIN
    assert next_verdict_at(analysis(4, "Hold"), "1m") == START + timedelta(minutes=6) + MARGIN


def test_a_finished_or_absent_analysis_has_nothing_due() -> None:
    assert next_verdict_at(None, "10s") is None
    assert next_verdict_at(analysis(1, "Rollback"), "10s") is None
    assert next_verdict_at(analysis(1, "Promote"), "10s") is None


def test_a_guard_below_its_floor_falls_due_after_for() -> None:
    below = CollapseStatus(revision="r1", below_since="2026-11-23T12:00:00Z")
    assert next_collapse_at(below, "10s") == START + timedelta(seconds=10) + MARGIN
    assert next_collapse_at(CollapseStatus(revision="r1"), "10s") is None
    fired = below.model_copy(update={"triggered": True})
    assert next_collapse_at(fired, "10s") is None
    assert next_collapse_at(below, None) is None


def test_the_earliest_future_moment_wins_and_a_past_one_is_dropped() -> None:
    below = CollapseStatus(revision="r1", below_since="2026-11-23T12:00:05Z")
    at = next_wake(analysis(0), "10s", below, "10s", START)
    assert at == START + timedelta(seconds=15) + MARGIN
    # Both moments past (no usable data at the boundary): left to the periodic round.
    assert next_wake(analysis(0), "10s", below, "10s", START + timedelta(minutes=1)) is None


def test_the_reconcile_returns_when_the_canary_verdict_falls_due() -> None:
    world = started()
    world.new_draft("bad")
    world.step()  # the canary's pods are ready: its analysis starts now
    began = world.now
    due = world.reconciler.reconcile("ns", "chat")
    assert due == began + timedelta(seconds=10) + MARGIN
    world.now = due
    world.measured[world.status["canaryRevision"]] = BAD
    after = world.reconciler.reconcile("ns", "chat")
    assert world.status["analysis"]["failures"] == 1
    # The next interval's end, returned by that reconcile (handlers.workers schedules it).
    assert after == due + timedelta(seconds=10)
