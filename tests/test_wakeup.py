"""A verdict is taken when it falls due, not at the next periodic round (plan.rollout.wakeup)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import cast

from specdeploy.api.models import AnalysisStatus, CollapseStatus
from specdeploy.handlers.reconcile import Reconciler
from specdeploy.handlers.run import reconcile_when_due
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


def test_the_reconcile_notes_the_canary_verdict_and_hands_it_out_once() -> None:
    world = started()
    world.new_draft("bad")
    world.step()  # the canary's pods are ready: its analysis starts now
    began = world.now
    assert world.reconciler.take_due(began) == []
    due = began + timedelta(seconds=10) + MARGIN
    assert world.reconciler.take_due(due) == [("ns", "chat")]
    assert world.reconciler.take_due(due) == [], "handed out once"
    world.now = due
    world.measured[world.status["canaryRevision"]] = BAD
    world.reconciler.reconcile("ns", "chat")
    assert world.status["analysis"]["failures"] == 1
    # The next interval's end is noted by that reconcile.
    assert world.reconciler.take_due(due + timedelta(seconds=10)) == [("ns", "chat")]


class DueOnce:
    """A reconciler with one SD due at once; notes when it is reconciled."""

    def __init__(self) -> None:
        self.due = [("ns", "chat")]
        self.reconciled: list[float] = []

    def clock(self) -> datetime:
        return datetime.now(UTC)

    def take_due(self, now: datetime) -> list[tuple[str, str]]:
        found, self.due = self.due, []
        return found

    def reconcile(self, namespace: str, name: str) -> None:
        self.reconciled.append(time.monotonic())


def test_an_sd_due_is_reconciled_within_a_tick() -> None:
    reconciler = DueOnce()

    async def main() -> float:
        began = time.monotonic()
        task = asyncio.create_task(reconcile_when_due(cast(Reconciler, reconciler), 0.05))
        await asyncio.sleep(0.5)
        task.cancel()
        return began

    began = asyncio.run(main())
    assert len(reconciler.reconciled) == 1
    assert reconciler.reconciled[0] - began < 0.3
