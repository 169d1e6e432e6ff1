"""The collapse guard: pure, then through the reconcile with the in-memory API."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from specdeploy.api.models import CollapseGuardSpec, CollapseStatus
from specdeploy.plan.rollout.analysis import Measurement
from specdeploy.plan.rollout.collapse import RESUME_ANNOTATION, watch_collapse
from test_canary import GOOD, World
from vllm_windows import figures

GUARD = CollapseGuardSpec.model_validate({"floor": 0.5, "for": "60s", "action": "AlertOnly"})
T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def rate(value: float) -> Measurement:
    return Measurement(acceptance_rate=value, draft_tokens=5000)


def watch(
    previous: CollapseStatus | None, measured: Measurement | None, seconds: float, **kw: Any
) -> Any:
    return watch_collapse(
        previous,
        guard=kw.get("guard", GUARD),
        pair_revision="p1",
        serving=kw.get("serving", True),
        measured=measured,
        min_draft_tokens=100,
        resume=kw.get("resume"),
        now=T0 + timedelta(seconds=seconds),
    )


def test_a_long_draft_whose_first_token_is_accepted_never_collapses() -> None:
    # k=6 at 0.8 a token: an acceptance rate of 0.49, under the 0.5 floor, while 3.95 tokens
    # come of each step. The guard reads the first position, 0.80.
    per_position = tuple(0.8 ** (i + 1) for i in range(6))
    long = Measurement(
        acceptance_rate=sum(per_position) / 6,
        draft_tokens=5000,
        acceptance_per_position=per_position,
    )
    assert long.acceptance_rate is not None
    assert long.acceptance_rate < GUARD.floor
    state = watch(None, long, 0).state
    verdict = watch(state, long, 600)
    assert not verdict.fired
    assert verdict.state.below_since is None
    assert verdict.state.message == "first-position acceptance 0.80"


def test_below_the_floor_for_the_whole_period_fires_once_and_holds() -> None:
    first = watch(None, rate(0.3), 0)
    assert not first.fired
    assert first.state.below_since == "2026-11-23T12:00:00Z"
    fired = watch(first.state, rate(0.3), 60)
    assert fired.fired
    assert [e.reason for e in fired.events] == ["AcceptanceCollapsed"]
    assert "first-position acceptance 0.30 < floor 0.50" in fired.events[0].message
    assert RESUME_ANNOTATION in fired.events[0].message
    # Held, whatever acceptance does now, and said once.
    held = watch(fired.state, rate(0.9), 120)
    assert held.fired
    assert held.events == ()


@pytest.mark.parametrize(
    "measured",
    [Measurement(error="down"), Measurement(acceptance_rate=0.1, draft_tokens=10), None],
)
def test_no_data_or_too_few_tokens_changes_nothing(measured: Measurement | None) -> None:
    first = watch(None, rate(0.3), 0)
    assert watch(first.state, measured, 600).state == first.state


def test_acceptance_flapping_around_the_floor_does_not_fire() -> None:
    state = watch(None, rate(0.45), 0).state
    # Just above the floor (within the hysteresis band): neither counts nor resets.
    assert watch(state, rate(0.52), 30).state == state
    # Clearly above: the count starts again.
    state = watch(state, rate(0.58), 40).state
    assert state.below_since is None
    state = watch(state, rate(0.45), 50).state
    assert not watch(state, rate(0.45), 100).fired
    assert watch(state, rate(0.45), 110).fired


def test_only_a_serving_pair_is_judged_and_a_person_can_resume() -> None:
    assert watch(None, rate(0.1), 0, serving=False).state.below_since is None
    fired = watch(watch(None, rate(0.1), 0).state, rate(0.1), 60)
    assert fired.fired
    resumed = watch(fired.state, rate(0.1), 70, resume="p1")
    assert not resumed.fired
    assert resumed.state.resumed_with == "p1"
    assert [e.reason for e in resumed.events] == ["SpeculationEnabled"]
    # The annotation left in place does not resume a later collapse; a new value does.
    again = watch(watch(resumed.state, rate(0.1), 80).state, rate(0.1), 140, resume="p1")
    assert again.fired
    assert not watch(again.state, rate(0.1), 150, resume="p1-2").fired


def guarded_world(action: str) -> World:
    world = World()
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["spec"]["rollout"]["collapseGuard"] = {"floor": 0.5, "for": "60s", "action": action}
    world.step()
    return world


def test_disable_speculation_rolls_out_the_target_alone_through_new_pods() -> None:
    world = guarded_world("DisableSpeculation")
    pair = world.status["stableRevision"]
    world.measured = {pair: rate(0.2)}
    world.step(10)
    assert world.status["collapse"]["belowSince"]
    world.step(60)
    fallback = world.status["stableRevision"]
    assert fallback != pair, "the target-only revision replaced the pair"
    assert world.replicas() == {pair: 0, fallback: 2}
    speculation = world.status["speculation"]
    assert (speculation["state"], speculation["reason"]) == ("Disabled", "DisabledAfterCollapse")
    assert "first-position acceptance 0.20 < floor 0.50" in speculation["message"]
    degraded = world.condition("Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "AcceptanceCollapsed")
    [fallback_record] = [r for r in world.status["revisions"] if r["revision"] == fallback]
    assert fallback_record["draft"]["method"] == "none"
    assert any(reason == "AcceptanceCollapsed" for _, reason, _ in world.events)

    # It holds (no flapping back); a person's annotation brings the pair back.
    world.measured = {fallback: Measurement()}
    world.step(600)
    assert world.status["stableRevision"] == fallback
    sd = world.kube.objects[("SpeculativeDeployment", "ns", "chat")]
    sd["metadata"].setdefault("annotations", {})[RESUME_ANNOTATION] = pair
    world.step()
    # The pair comes back the way any new pair does here: as a canary, judged, promoted.
    assert world.status["canaryRevision"] == pair
    assert world.status["speculation"]["state"] == "Enabled"
    # Judged beside the target alone: 3.2 tokens a 10 ms step against one token every 8 ms.
    world.measured = {pair: GOOD, fallback: figures(None, 1.0, 0.008)}
    world.step(10)
    world.step(10)
    world.step()
    assert world.status["stableRevision"] == pair
    assert world.status["collapse"]["triggered"] is False


def test_rollback_to_previous_serves_the_revision_before_the_collapsed_pair() -> None:
    world = guarded_world("RollbackToPrevious")
    before, pair = world.new_draft("r2")
    world.measured = {before: GOOD, pair: GOOD}
    world.step(10)
    world.step(10)
    world.step()
    assert world.status["stableRevision"] == pair
    world.measured = {pair: rate(0.2)}
    world.step(10)
    world.step(60)
    assert world.status["stableRevision"] == before
    assert world.replicas() == {before: 2, pair: 0}
    assert world.condition("Degraded")["reason"] == "AcceptanceCollapsed"


def test_alert_only_says_so_and_changes_nothing_else() -> None:
    world = guarded_world("AlertOnly")
    pair = world.status["stableRevision"]
    world.measured = {pair: rate(0.2)}
    world.step(10)
    world.step(60)
    assert world.status["stableRevision"] == pair
    assert world.replicas() == {pair: 2}
    assert world.condition("Degraded")["reason"] == "AcceptanceCollapsed"
    assert world.status["speculation"]["state"] == "Enabled"
