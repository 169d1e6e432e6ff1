"""The speculation-length model and the autotuner's decision, against figures worked by hand."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

import pytest

from specdeploy.api.conditions import Reason
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import (
    AnalysisStatus,
    AutotuneStatus,
    AutotuneStepCost,
    ScheduleStep,
    SpeculativeDeploymentSpec,
)
from specdeploy.plan.children.revision import revision_hash
from specdeploy.plan.children.vllm_args import schedule_ranges, speculative_config
from specdeploy.plan.rollout.analysis import Outcome
from specdeploy.plan.rollout.autotune import (
    AutotuneMeasurement,
    BatchCost,
    Prediction,
    Tuning,
    acceptance_by_position,
    batch_ranges,
    choose_schedule,
    choose_tokens,
    continue_acceptance,
    decide_tuning,
    expected_tokens_per_step,
    extend_acceptance,
    fit_batch_cost,
    fit_cost_ratio,
    fit_paired_cost_ratio,
    measurement_due,
    record_trial,
    schedule_key,
    tokens_per_second,
    tuned_spec,
)

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


# --- the model ---------------------------------------------------------------------------------


def test_acceptance_per_position_is_accepted_over_drafts() -> None:
    assert acceptance_by_position(100, [80, 60, 30]) == pytest.approx([0.8, 0.6, 0.3])


def test_acceptance_per_position_is_clamped_to_a_probability_that_never_rises() -> None:
    # Counters read a moment apart can disagree by a sample; probabilities cannot.
    assert acceptance_by_position(100, [50, 60, 120]) == pytest.approx([0.5, 0.5, 0.5])
    assert acceptance_by_position(100, [120]) == pytest.approx([1.0])
    with pytest.raises(ValueError, match="no drafts"):
        acceptance_by_position(0, [1])


def test_positions_beyond_the_measured_ones_decay_from_the_last_conditional_acceptance() -> None:
    # Conditional acceptance of position 1 is 0.6 / 0.8 = 0.75. Position 2: 0.75 * 0.9 =
    # 0.675, so a_2 = 0.6 * 0.675 = 0.405; position 3: 0.675 * 0.9 = 0.6075, so
    # a_3 = 0.405 * 0.6075 = 0.2460375.
    assert extend_acceptance([0.8, 0.6], 4) == pytest.approx([0.8, 0.6, 0.405, 0.2460375])
    # One measured position: its conditional acceptance is a_0 itself (0.5): 0.45, then 0.405.
    assert extend_acceptance([0.5], 3) == pytest.approx([0.5, 0.225, 0.091125])
    # Fewer positions than measured: the measured ones, cut.
    assert extend_acceptance([0.8, 0.6, 0.3], 2) == pytest.approx([0.8, 0.6])


def test_extrapolation_never_exceeds_the_last_measured_conditional_acceptance() -> None:
    # A draft perfect so far (conditional 1.0) is still not assumed perfect further on.
    assert extend_acceptance([1.0, 1.0], 4) == pytest.approx([1.0, 1.0, 0.9, 0.729])
    rates = extend_acceptance([0.9, 0.8, 0.7], 12)
    conditionals = [b / a for a, b in itertools.pairwise(rates[2:])]
    assert all(c <= 0.7 / 0.8 for c in conditionals)
    assert conditionals == sorted(conditionals, reverse=True)


def test_a_longer_measurement_continues_the_served_acceptance_with_its_conditionals() -> None:
    # Served at k=2: 0.8, 0.6. Measured at k=4 (another window): 0.9, 0.7, 0.56, 0.35, whose
    # conditional acceptance at positions 2 and 3 is 0.56 / 0.7 = 0.8 and 0.35 / 0.56 = 0.625.
    # So a_2 = 0.6 x 0.8 = 0.48 and a_3 = 0.48 x 0.625 = 0.3; the served positions stay.
    assert continue_acceptance([0.8, 0.6], [0.9, 0.7, 0.56, 0.35]) == pytest.approx(
        [0.8, 0.6, 0.48, 0.3]
    )
    # Nothing longer: the served rates alone. A position after a zero one stays zero.
    assert continue_acceptance([0.8, 0.6], [0.9]) == pytest.approx([0.8, 0.6])
    assert continue_acceptance([0.5], [0.2, 0.0, 0.0]) == pytest.approx([0.5, 0.0, 0.0])
    # Then extend_acceptance extrapolates from the continued rates' last conditional (0.625):
    # a_4 = 0.3 x 0.625 x 0.9 = 0.16875.
    continued = continue_acceptance([0.8, 0.6], [0.9, 0.7, 0.56, 0.35])
    assert extend_acceptance(continued, 5)[4] == pytest.approx(0.16875)


def test_expected_tokens_per_step() -> None:
    rates = [0.8, 0.6, 0.3]
    assert [expected_tokens_per_step(rates, k) for k in range(4)] == pytest.approx(
        [1.0, 1.8, 2.4, 2.7]
    )


def test_tokens_per_second_divides_by_the_step_cost() -> None:
    # k=2: E = 2.4 tokens per step of 0.01 s * (1 + 0.1 * 2) = 0.012 s: 200 tokens/s.
    assert tokens_per_second([0.8, 0.6, 0.3], 2, 0.1, 0.01) == pytest.approx(200.0)


GOOD_RATES = [0.9, 0.8, 0.7]  # measured at k=3


def choose(rates: list[float] = GOOD_RATES, **overrides: float) -> Prediction:
    """choose_tokens for the hand-worked case: measured at k=3, a 13 ms step, r = 0.1,
    k in 1..5, minGain 5 %; `overrides` change any of it."""
    settings: dict[str, float] = {
        "current_tokens": 3,
        "step_seconds": 0.013,
        "cost_ratio": 0.1,
        "min_tokens": 1,
        "max_tokens": 5,
        "min_gain": 0.05,
    }
    settings.update(overrides)
    return choose_tokens(
        rates,
        current_tokens=int(settings["current_tokens"]),
        step_seconds=settings["step_seconds"],
        cost_ratio=settings["cost_ratio"],
        min_tokens=int(settings["min_tokens"]),
        max_tokens=int(settings["max_tokens"]),
        min_gain=settings["min_gain"],
    )


def test_a_draft_that_predicts_well_gets_a_longer_k_than_measured() -> None:
    # Measured at k=3 with a 13 ms step and r = 0.1: t0 = 0.013 / 1.3 = 10 ms.
    # E(1..5) = 1.9, 2.7, 3.4, 3.95125 (a_3 = 0.7 * 0.7875), 4.34194844 (a_4 = 0.55125 *
    # 0.70875); tokens/s = E / (0.01 * (1 + 0.1 k)) = 172.73, 225.0, 261.54, 282.23, 289.46.
    prediction = choose()
    assert prediction.by_tokens == pytest.approx(
        {1: 172.7273, 2: 225.0, 3: 261.5385, 4: 282.2321, 5: 289.4632}, rel=1e-5
    )
    assert prediction.best_tokens == 5
    assert prediction.changed
    assert prediction.gain == pytest.approx(289.4632 / 261.5385 - 1, rel=1e-5)  # +10.7 %


def test_max_tokens_bounds_the_choice() -> None:
    prediction = choose(max_tokens=4)
    assert (prediction.best_tokens, prediction.changed) == (4, True)
    assert prediction.gain == pytest.approx(282.2321 / 261.5385 - 1, rel=1e-5)  # +7.9 %


def test_a_gain_below_min_gain_keeps_the_current_k() -> None:
    prediction = choose(min_gain=0.2)
    assert (prediction.best_tokens, prediction.changed) == (3, False)
    assert "below minGain 20%" in prediction.message


def test_a_draft_that_predicts_badly_gets_a_shorter_k() -> None:
    # Measured at k=5, each position accepted 0.3 of the time after the previous: a_i = 0.3^(i+1).
    # Step 15 ms, r = 0.1: t0 = 10 ms. k=1: 1.3 / 0.011 = 118.18 tokens/s; k=5: E = 1.42753 (1 +
    # 0.3 + 0.09 + 0.027 + 0.0081 + 0.00243) / 0.015 = 95.17 tokens/s.
    rates = [0.3, 0.09, 0.027, 0.0081, 0.00243]
    prediction = choose(rates, current_tokens=5, step_seconds=0.015, max_tokens=8)
    assert prediction.best_tokens == 1
    assert prediction.by_tokens[1] == pytest.approx(118.1818, rel=1e-5)
    assert prediction.by_tokens[5] == pytest.approx(95.1687, rel=1e-5)
    assert prediction.gain == pytest.approx(118.1818 / 95.1687 - 1, rel=1e-4)


def test_a_dearer_draft_shortens_the_best_k() -> None:
    cheap = choose(cost_ratio=0.05, min_gain=0, max_tokens=8)
    dear = choose(cost_ratio=0.5, min_gain=0, max_tokens=8)
    assert dear.best_tokens < cheap.best_tokens


def test_ties_go_to_the_shorter_k() -> None:
    # Nothing accepted and speculation free: every k predicts the same; the shortest wins.
    prediction = choose(
        [0.0], current_tokens=4, cost_ratio=0, min_tokens=2, max_tokens=6, min_gain=0
    )
    assert prediction.best_tokens == 2


def test_a_current_k_outside_the_bounds_is_replaced_whatever_the_gain() -> None:
    prediction = choose([1.0] * 10, current_tokens=10, cost_ratio=0, max_tokens=8, min_gain=0.5)
    assert (prediction.best_tokens, prediction.changed) == (8, True)
    assert prediction.gain < 0  # 8 is worse than 10 here, but 10 is out of bounds


def cost(k: int, seconds: float) -> AutotuneStepCost:
    return AutotuneStepCost(num_speculative_tokens=k, step_seconds=seconds)


def test_the_cost_ratio_is_fitted_from_two_or_more_lengths() -> None:
    # t = t0 (1 + r k): (0, 10 ms) and (4, 14 ms) give t0 = 10 ms, slope 1 ms per token: r = 0.1.
    assert fit_cost_ratio([cost(0, 0.010), cost(4, 0.014)]) == pytest.approx(0.1)
    assert fit_cost_ratio([cost(1, 0.011), cost(3, 0.013), cost(5, 0.015)]) == pytest.approx(0.1)
    assert fit_cost_ratio([cost(3, 0.013)]) is None, "one length cannot separate t0 from r"
    assert fit_cost_ratio([cost(1, 0.02), cost(3, 0.01)]) == 0.0, "noise is no negative cost"


def paired(k: int, seconds: float, beside: int, ratio: float) -> AutotuneStepCost:
    return AutotuneStepCost(
        num_speculative_tokens=k, step_seconds=seconds, beside_tokens=beside, step_ratio=ratio
    )


def test_step_times_measured_beside_the_stable_fit_the_ratio_whatever_the_load() -> None:
    # k=6 measured beside a stable k=5 while the machine ran 1.5 times slower: 16 ms against
    # 15 ms, a ratio of 1.0667 = (1 + 6r) / (1 + 5r), so r = 0.0667 / (6 - 1.0667 x 5) = 0.1.
    # The stable's own step time, measured since in a quiet window, is 10 ms: as one line,
    # (5, 10 ms) and (6, 16 ms) would be 6 ms per token from an intercept of -20 ms, no cost.
    slow = [cost(5, 0.010), paired(6, 0.016, 5, 16 / 15)]
    assert fit_cost_ratio([cost(5, 0.010), cost(6, 0.016)]) is None
    assert fit_cost_ratio(slow) == pytest.approx(0.1)
    # Two pairs, least squares: k=3 beside k=5 at r = 0.1 is 1.3 / 1.5.
    assert fit_cost_ratio([*slow, paired(3, 0.02, 5, 1.3 / 1.5)]) == pytest.approx(0.1)
    # A pair of one k with itself says nothing; a cheaper longer k is no negative cost.
    assert fit_cost_ratio([cost(5, 0.010), paired(5, 0.011, 5, 1.1)]) is None
    assert fit_cost_ratio([paired(6, 0.009, 5, 0.9)]) == 0.0
    # (1 + 6r) / (1 + 5r) < 6 / 5 whatever r: a k=6 step 1.38 times k=5's is no cost ratio
    # (least squares would make it r = 0.38 / (6 - 6.9) < 0, i.e. a free draft). Ignored:
    # the fit is the other pair's, or none (then the line through the step times).
    noise = paired(6, 0.0138, 5, 1.38)
    assert fit_cost_ratio([noise, paired(3, 0.02, 5, 1.3 / 1.5)]) == pytest.approx(0.1)
    assert fit_paired_cost_ratio([noise]) is None
    # The same bound for a shorter trial: k=3 at under 3 / 5 of k=5's step is no cost either.
    assert fit_paired_cost_ratio([paired(3, 0.0055, 5, 0.55)]) is None


# --- the decision ------------------------------------------------------------------------------


def spec(mode: str = "Recommend", k: int = 3, **tune: object) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(
        {
            "pair": {
                "version": "1",
                "target": {"model": "org/target"},
                "draft": {
                    "method": "draft_model",
                    "model": "org/draft",
                    "numSpeculativeTokens": k,
                    "autotune": {"mode": mode, "maxTokens": 5, "draftCostRatio": 0.1, **tune},
                },
            },
            "rollout": {"canary": {"replicas": 1}},
        }
    )


# Measured at k=3: 1000 drafts, a = 0.9, 0.8, 0.7, step 13 ms (as the hand-worked case above).
MEASURED = AutotuneMeasurement(
    drafts=1000,
    draft_tokens=3000,
    accepted_per_position=(900, 800, 700),
    step_seconds=0.013,
    mean_batch_size=1.5,
    max_batch_size=3,
)


def tune(
    sd_spec: SpeculativeDeploymentSpec,
    previous: AutotuneStatus | None = None,
    *,
    measured: AutotuneMeasurement | None = MEASURED,
    settled: bool = True,
    analysis: AnalysisStatus | None = None,
    now: datetime = NOW,
    stable_schedule: list[ScheduleStep] | None = None,
    trial_measured: AutotuneMeasurement | None = None,
    stable_tokens: int | None = None,
) -> Tuning:
    """decide_tuning with the stable serving `stable_tokens` (default: the applied k, else 3)."""
    if stable_tokens is None:
        stable_tokens = previous.applied_tokens if previous and previous.applied_tokens else 3
    return decide_tuning(
        sd_spec,
        previous,
        stable_revision="stable0001",
        stable_tokens=stable_tokens,
        settled=settled,
        analysis=analysis,
        measured=measured,
        window="5m",
        min_draft_tokens=2000,
        default_cost_ratio=0.1,
        revision_for=lambda k, s: f"tuned0000{k}" + (f"s{schedule_key(s)}" if s else ""),
        now=now,
        stable_schedule=stable_schedule,
        trial_measured=trial_measured,
    )


def test_off_computes_nothing_and_clears_the_status() -> None:
    tuning = tune(spec("Off"), AutotuneStatus(applied_tokens=5))
    assert (tuning.state, tuning.tokens, tuning.events) == (None, None, ())


def test_recommend_writes_the_recommendation_and_its_inputs_and_serves_the_spec() -> None:
    tuning = tune(spec("Recommend"))
    assert tuning.tokens is None
    assert tuning.events == ()
    state = tuning.state
    assert state is not None
    assert state.recommendation is not None
    assert state.recommendation.num_speculative_tokens == 5
    assert state.recommendation.changed
    assert state.recommendation.predicted_gain == pytest.approx(0.1068, abs=1e-4)
    assert state.computed_at == "2026-11-23T12:00:00Z"
    assert state.inputs is not None
    assert state.inputs.acceptance_per_position == [0.9, 0.8, 0.7]
    assert (state.inputs.draft_cost_ratio, state.inputs.draft_cost_source) == (0.1, "Spec")
    assert state.inputs.step_costs == [cost(3, 0.013).model_copy(update={"batch_size": 1.5})]
    assert state.inputs.max_batch_size == 3


def test_no_recommendation_from_too_few_draft_tokens() -> None:
    few = AutotuneMeasurement(drafts=100, draft_tokens=300, accepted_per_position=(90, 80, 70))
    state = tune(spec("Apply"), measured=few).state
    assert state is not None
    assert state.recommendation is None
    assert "300 draft tokens in 5m, fewer than the 2,000" in state.message
    assert tune(spec("Apply"), measured=few).tokens is None


def test_without_a_measurement_the_previous_recommendation_stands() -> None:
    first = tune(spec("Recommend")).state
    again = tune(spec("Recommend"), first, measured=None).state
    assert again == first


def test_apply_rolls_out_the_recommendation_once_with_an_event() -> None:
    tuning = tune(spec("Apply"))
    assert tuning.tokens == 5
    assert tuning.state is not None
    assert tuning.state.trial_revision == "tuned00005"
    assert tuning.state.applied_at == "2026-11-23T12:00:00Z"
    [event] = tuning.events
    assert event.reason == "TunedRevisionRolledOut"
    assert "numSpeculativeTokens 3 -> 5" in event.message


def test_apply_waits_while_a_canary_runs() -> None:
    tuning = tune(spec("Apply"), settled=False)
    assert tuning.tokens is None
    assert tuning.events == ()
    assert tuning.state is not None
    assert tuning.state.recommendation is not None


def test_apply_ignores_a_gain_below_min_gain() -> None:
    tuning = tune(spec("Apply", minGain=0.2))
    assert tuning.tokens is None
    assert tuning.events == ()


def promoted_at_5(now: datetime) -> AutotuneStatus:
    state = tune(spec("Apply"), now=now).state
    assert state is not None
    analysis = AnalysisStatus(revision="tuned00005", started_at="x", outcome="Promote")
    after = tune(spec("Apply"), state, measured=None, analysis=analysis, now=now)
    assert [e.reason for e in after.events] == ["TunedRevisionPromoted"]
    assert after.tokens == 5
    assert after.state is not None
    assert after.state.trial_revision is None
    return after.state


def test_a_promoted_tuned_k_keeps_serving_and_the_cooldown_holds_the_next_change() -> None:
    state = promoted_at_5(NOW)
    # Measured at k=5 now, with a bad draft: k=1 would be much better, but the cooldown (30m
    # by default) has not passed.
    bad = AutotuneMeasurement(
        drafts=1000,
        draft_tokens=5000,
        accepted_per_position=(300, 90, 27, 8, 2),
        step_seconds=0.015,
    )
    soon = tune(spec("Apply"), state, measured=bad, now=NOW + timedelta(minutes=10))
    assert soon.tokens == 5
    assert soon.events == ()
    assert soon.state is not None
    assert soon.state.recommendation is not None
    assert soon.state.recommendation.num_speculative_tokens == 1
    later = tune(spec("Apply"), state, measured=bad, now=NOW + timedelta(minutes=31))
    assert later.tokens == 1
    assert later.state is not None
    assert later.state.previous_tokens == 5


def test_a_rejected_tuned_k_reverts_and_is_not_tried_again_until_the_spec_changes() -> None:
    state = tune(spec("Apply")).state
    rolled_back = AnalysisStatus(
        revision="tuned00005", started_at="x", outcome="Rollback", message="latency"
    )
    after = tune(spec("Apply"), state, measured=None, analysis=rolled_back)
    assert after.tokens is None, "back to the spec's k"
    [event] = after.events
    assert (event.reason, event.warning) == ("TunedRevisionRejected", True)
    assert after.state is not None
    assert after.state.rejected_tokens == [5]
    # The same recommendation an hour later is not rolled out again...
    hour = NOW + timedelta(hours=1)
    again = tune(spec("Apply"), after.state, now=hour)
    assert again.tokens is None
    assert again.events == ()
    assert again.state is not None
    assert again.state.recommendation is not None
    assert again.state.recommendation.num_speculative_tokens == 5
    # ... until the spec names another pair (or bounds).
    changed = spec("Apply").model_copy(deep=True)
    changed.pair.draft.revision = "r2"
    fresh = tune(changed, again.state, now=hour)
    assert fresh.tokens == 5
    assert fresh.state is not None
    assert fresh.state.rejected_tokens == []


# --- calibration: the draft's cost ratio measured from a second length -------------------------


def test_apply_with_an_unmeasured_cost_ratio_serves_a_neighbouring_k_once_to_measure_it() -> None:
    # With the default ratio 0.1 the model would keep k=3 (k=5 +10.7 % < minGain 20 %). Base
    # step 13 ms / 1.3 = 10 ms. k=2: (1 + 0.9 + 0.8) / 12 ms = 225 tok/s; k=4: a_3 = 0.7 x
    # (0.875 x 0.9) = 0.55125, (3.4 + 0.55125) / 14 ms = 282.23 tok/s; k=3: 3.4 / 13 ms =
    # 261.54 tok/s. The faster neighbour is k=4, +7.91 %.
    tuning = tune(spec("Apply", minGain=0.2, draftCostRatio=None))
    assert tuning.tokens == 4
    state = tuning.state
    assert state is not None
    assert state.recommendation is not None
    assert state.recommendation.calibration
    assert state.recommendation.predicted_gain == pytest.approx(0.0791, abs=1e-4)
    assert state.inputs is not None
    assert state.inputs.draft_cost_source == "OperatorDefault"
    [event] = tuning.events
    assert "numSpeculativeTokens 3 -> 4" in event.message
    assert "calibration" in event.message


def test_no_calibration_with_a_ratio_in_the_spec_or_in_mode_recommend() -> None:
    given = tune(spec("Apply", minGain=0.2))
    assert given.tokens is None
    assert given.state is not None
    assert given.state.recommendation is not None
    assert not given.state.recommendation.calibration
    shown = tune(spec("Recommend", minGain=0.2, draftCostRatio=None)).state
    assert shown is not None
    assert shown.recommendation is not None
    assert not shown.recommendation.calibration
    assert shown.recommendation.num_speculative_tokens == 3, "below minGain: keeps k=3"


CALIBRATING = spec("Apply", minGain=0.2, draftCostRatio=None)


def calibration_rolled_back(accepted: tuple[float, ...], draft_tokens: float = 3200) -> Tuning:
    """The calibration trial at k=4 (800 drafts, 14.2 ms a step) rolled back by the canary."""
    at_4 = AutotuneMeasurement(
        drafts=800,
        draft_tokens=draft_tokens,
        accepted_per_position=accepted,
        step_seconds=0.0142,
    )
    rolled_back = AnalysisStatus(
        revision="tuned00004", started_at="x", outcome="Rollback", message="slower"
    )
    state = tune(CALIBRATING).state
    return tune(CALIBRATING, state, measured=None, analysis=rolled_back, trial_measured=at_4)


def test_the_trials_step_time_is_kept_when_it_is_rolled_back_and_the_ratio_is_then_fitted() -> None:
    after = calibration_rolled_back((720, 640, 560, 440))
    assert after.tokens is None
    assert after.state is not None
    assert after.state.rejected_tokens == [4]
    assert after.state.inputs is not None
    assert [(c.num_speculative_tokens, c.step_seconds) for c in after.state.inputs.step_costs] == [
        (3, 0.013),
        (4, 0.0142),
    ]
    # An interval later, at k=3 again: (3, 13 ms) and (4, 14.2 ms) give 1.2 ms per token over
    # t0 = 9.4 ms, r = 0.1277; no second calibration.
    later = tune(CALIBRATING, after.state, now=NOW + timedelta(hours=1)).state
    assert later is not None
    assert later.inputs is not None
    assert later.recommendation is not None
    assert later.inputs.draft_cost_source == "Measured"
    assert later.inputs.draft_cost_ratio == pytest.approx(0.1277, abs=1e-4)
    assert not later.recommendation.calibration


def test_a_trial_measured_beside_the_stable_keeps_its_step_ratio_for_the_fit() -> None:
    # The calibration trial at k=4 and the stable k=3 over the same slow window: 21 ms and
    # 19.5 ms (1.5 times 14 and 13 ms), a ratio 1.0769 = 1.4 / 1.3, so r = 0.1. An interval
    # later the stable measures 13 ms alone: the ratio still gives r = 0.1, where the line
    # through (3, 13 ms) and (4, 21 ms) has a negative intercept and would measure nothing.
    at_4 = AutotuneMeasurement(
        drafts=800,
        draft_tokens=3200,
        accepted_per_position=(720, 640, 560, 440),
        step_seconds=0.021,
    )
    slow_stable = dataclasses.replace(MEASURED, step_seconds=0.0195)
    rolled_back = AnalysisStatus(
        revision="tuned00004", started_at="x", outcome="Rollback", message="slower"
    )
    state = tune(CALIBRATING).state
    after = tune(
        CALIBRATING,
        state,
        measured=slow_stable,
        analysis=rolled_back,
        trial_measured=at_4,
        settled=False,
        stable_tokens=3,
    ).state
    assert after is not None
    assert after.inputs is not None
    [trial] = [c for c in after.inputs.step_costs if c.num_speculative_tokens == 4]
    assert trial.beside_tokens == 3
    assert trial.step_ratio == pytest.approx(1.0769, abs=1e-4)
    later = tune(CALIBRATING, after, now=NOW + timedelta(hours=1)).state
    assert later is not None
    assert later.inputs is not None
    assert later.inputs.draft_cost_source == "Measured"
    assert later.inputs.draft_cost_ratio == pytest.approx(0.1, abs=1e-3)
    assert [(c.num_speculative_tokens, c.step_seconds) for c in later.inputs.step_costs] == [
        (3, 0.013),
        (4, 0.021),
    ]
    # Measured again alone (as a promoted trial is), k=4 keeps its ratio with its new time.
    again = record_trial(
        later.model_copy(update={"trial_revision": "tuned00004", "applied_tokens": 4}),
        dataclasses.replace(at_4, step_seconds=0.014),
        min_draft_tokens=2000,
    )
    assert again.inputs is not None
    [alone] = [c for c in again.inputs.step_costs if c.num_speculative_tokens == 4]
    assert (alone.step_seconds, alone.beside_tokens, alone.step_ratio) == (0.014, 3, 1.0769)


def test_a_rolled_back_trials_acceptance_replaces_the_extrapolation_beyond_the_served_k() -> None:
    # The calibration trial at k=4 measured a fourth position the stable k=3 never drafts:
    # 532 / 800 = 0.665, a conditional acceptance of 0.665 / 0.7 = 0.95 (the extrapolation
    # assumed 0.875 x 0.9 = 0.7875). Back at k=3 an interval later, r = 0.1277 from the two
    # step times (as above), t0 = 13 ms / (1 + 3r) = 9.399 ms:
    #   a_3 = 0.7 x 0.95 = 0.665; a_4 = 0.665 x (0.95 x 0.9) = 0.568575
    #   k=5: E = 3.4 + 0.665 + 0.568575 = 4.633575 over 9.399 ms x (1 + 5r) = 300.88 tok/s
    #   k=3: 3.4 / 13 ms = 261.54 tok/s: +15.04 % (the extrapolation alone gave +7.8 %).
    after = calibration_rolled_back((720, 640, 560, 532))
    assert after.state is not None
    assert after.state.inputs is not None
    kept = after.state.inputs.longest_acceptance
    assert kept is not None
    assert (kept.revision, kept.num_speculative_tokens) == ("tuned00004", 4)
    assert kept.acceptance_per_position == pytest.approx([0.9, 0.8, 0.7, 0.665])
    later = tune(CALIBRATING, after.state, now=NOW + timedelta(hours=1)).state
    assert later is not None
    assert later.recommendation is not None
    assert later.recommendation.predicted_gain == pytest.approx(0.1504, abs=1e-4)
    assert later.recommendation.num_speculative_tokens == 3, "below minGain 20 %: kept"
    assert "position 3 from k=4's acceptance (tuned00004)" in later.recommendation.message
    # The served k=3's own positions are still the serving pods' (0.9, 0.8, 0.7).
    assert later.inputs is not None
    assert later.inputs.acceptance_per_position == pytest.approx([0.9, 0.8, 0.7])
    assert later.inputs.longest_acceptance == kept


def test_a_trial_keeps_its_acceptance_only_from_enough_draft_tokens_and_more_positions() -> None:
    served = tune(CALIBRATING).state
    assert served is not None
    assert served.inputs is not None
    assert served.inputs.longest_acceptance is not None
    assert served.inputs.longest_acceptance.revision == "stable0001"
    after = calibration_rolled_back((72, 64, 56, 53), draft_tokens=400)
    assert after.state is not None
    assert after.state.inputs is not None
    assert after.state.inputs.longest_acceptance == served.inputs.longest_acceptance, (
        "400 draft tokens < 2000"
    )
    assert [c.num_speculative_tokens for c in after.state.inputs.step_costs] == [3, 4]
    # A shorter trial, however well measured, does not replace three positions with two.
    shorter = record_trial(
        after.state.model_copy(update={"trial_revision": "tuned00002", "applied_tokens": 2}),
        AutotuneMeasurement(
            drafts=1000, draft_tokens=2000, accepted_per_position=(950, 900), step_seconds=0.012
        ),
        min_draft_tokens=2000,
    )
    assert shorter.inputs is not None
    assert shorter.inputs.longest_acceptance == served.inputs.longest_acceptance
    assert [c.num_speculative_tokens for c in shorter.inputs.step_costs] == [2, 3, 4]
    # New bounds (or a new pair): what was measured of the old (acceptance, step times) goes.
    other = spec("Apply", minGain=0.2, draftCostRatio=None, maxTokens=4)
    moved = tune(other, after.state, measured=None).state
    assert moved is not None
    assert moved.inputs is not None
    assert moved.inputs.longest_acceptance is None
    assert moved.inputs.step_costs == []


def test_recommend_mode_never_serves_a_tuned_k() -> None:
    state = tune(spec("Apply")).state
    assert tune(spec("Recommend"), state, measured=None).tokens is None


def test_measurement_is_due_once_per_interval_and_only_when_on() -> None:
    state = AutotuneStatus(computed_at="2026-11-23T12:00:00Z")
    assert not measurement_due(spec("Off"), None, "60s", NOW)
    assert measurement_due(spec("Recommend"), None, "60s", NOW)
    assert not measurement_due(spec("Recommend"), state, "60s", NOW + timedelta(seconds=59))
    assert measurement_due(spec("Recommend"), state, "60s", NOW + timedelta(seconds=60))


def test_the_autotune_block_is_not_part_of_the_revision_but_the_tuned_k_is() -> None:
    config = OperatorConfig()
    plain = spec("Off").model_copy(deep=True)
    plain.pair.draft.autotune = None
    base = revision_hash(plain, None, config)
    assert revision_hash(tuned_spec(spec("Recommend"), None), None, config) == base
    assert revision_hash(tuned_spec(spec("Apply", minGain=0.3), None), None, config) == base
    assert revision_hash(tuned_spec(spec("Apply"), 3), None, config) == base
    assert revision_hash(tuned_spec(spec("Apply"), 5), None, config) != base


# --- the batch-size schedule -------------------------------------------------------------------

# T(b, k) = F (1 + r k) + B b (k + 1) with F = 10 ms, r = 0.1, B = 0.5 ms per verified token.
BATCH_COST = BatchCost(fixed=0.010, per_token=0.0005, ratio=0.1)


def test_the_batch_step_cost_grows_with_the_tokens_verified() -> None:
    # b=1, k=3: 10 ms * 1.3 + 0.5 ms * 1 * 4 = 15 ms; b=8: 13 ms + 0.5 ms * 32 = 29 ms.
    assert BATCH_COST.step_seconds(1, 3) == pytest.approx(0.015)
    assert BATCH_COST.step_seconds(8, 3) == pytest.approx(0.029)
    # With B = 0 it is the single-k model: t0 (1 + r k).
    assert BatchCost(0.010, 0.0, 0.1).step_seconds(16, 3) == pytest.approx(0.013)


def test_the_batch_cost_is_fitted_from_two_or_more_batch_sizes() -> None:
    costs = [
        AutotuneStepCost(num_speculative_tokens=3, step_seconds=0.015, batch_size=1),
        AutotuneStepCost(num_speculative_tokens=3, step_seconds=0.029, batch_size=8),
        # b=4, k=5: 10 ms * 1.5 + 0.5 ms * 4 * 6 = 27 ms.
        AutotuneStepCost(num_speculative_tokens=5, step_seconds=0.027, batch_size=4),
    ]
    fitted = fit_batch_cost(costs, 0.1)
    assert fitted is not None
    assert (fitted.fixed, fitted.per_token) == pytest.approx((0.010, 0.0005))
    assert fit_batch_cost(costs[:1], 0.1) is None, "one batch size cannot tell F from B"
    same_range = [costs[0].model_copy(update={"batch_size": 1.0}), costs[0]]
    assert fit_batch_cost(same_range, 0.1) is None
    # A larger batch measured faster (noise) is no negative cost: B = 0, F from the mean.
    noisy = [costs[0], costs[1].model_copy(update={"step_seconds": 0.013})]
    flat = fit_batch_cost(noisy, 0.1)
    assert flat is not None
    assert flat.per_token == 0.0
    assert flat.fixed == pytest.approx(0.014 / 1.3)


def test_the_schedule_shortens_k_as_the_batch_grows() -> None:
    # a = 0.9, 0.8, 0.7 measured; beyond them 0.55125 (k=4) and 0.390699 (k=5) (extrapolated):
    # E(k) = 1.9, 2.7, 3.4, 3.95125, 4.34195 for k = 1..5.
    # b=1: T = 10.5 + 1.5k ms: k=4 3.95125/16.5 = 239.5, k=5 4.34195/18 = 241.2 tok/s: k=5.
    # b=2: T = 11 + 2k: k=4 3.95125/19 = 208.0, k=5 4.34195/21 = 206.8: k=4.
    # b=4: T = 12 + 3k: k=3 3.4/21 = 161.9, k=4 3.95125/24 = 164.6, k=5 160.8: k=4.
    # b=8: T = 14 + 5k: k=3 3.4/29 = 117.2, k=4 3.95125/34 = 116.2: k=3.
    # b=16: T = 18 + 9k: k=2 2.7/36 = 75.0, k=3 3.4/45 = 75.6, k=4 73.2: k=3.
    steps = choose_schedule(GOOD_RATES, BATCH_COST, min_tokens=1, max_tokens=5, max_num_seqs=16)
    assert [(lo, hi, k) for lo, hi, k, _ in steps] == [(1, 1, 5), (2, 4, 4), (5, 16, 3)]
    assert [tps for *_, tps in steps] == pytest.approx([241.219, 164.635, 75.556], abs=1e-3)
    # Without a batch cost (B = 0) the batch changes nothing: one range, the single-k choice.
    flat = choose_schedule(
        GOOD_RATES, BatchCost(0.010, 0.0, 0.1), min_tokens=1, max_tokens=5, max_num_seqs=16
    )
    assert [(lo, hi, k) for lo, hi, k, _ in flat] == [(1, 16, 5)]
    assert batch_ranges(12) == [(1, 1), (2, 2), (3, 4), (5, 8), (9, 12)]


def scheduled_spec() -> SpeculativeDeploymentSpec:
    base = spec("Recommend", schedule="Auto").model_dump(by_alias=True, exclude_none=True)
    return SpeculativeDeploymentSpec.model_validate({**base, "engine": {"maxNumSeqs": 16}})


def test_recommend_shows_a_schedule_once_two_batch_sizes_were_measured() -> None:
    at_batch_1 = dataclasses.replace(MEASURED, step_seconds=0.015, mean_batch_size=1.0)
    first = tune(scheduled_spec(), measured=at_batch_1).state
    assert first is not None
    assert first.recommendation is not None
    assert first.recommendation.schedule is None
    assert "two or more batch-size ranges" in first.recommendation.schedule_message
    at_batch_8 = dataclasses.replace(MEASURED, step_seconds=0.029, mean_batch_size=8.0)
    second = tune(scheduled_spec(), first, measured=at_batch_8).state
    assert second is not None
    assert second.inputs is not None
    assert [(c.batch_size, c.step_seconds) for c in second.inputs.step_costs] == [
        (1.0, 0.015),
        (8.0, 0.029),
    ]
    rec = second.recommendation
    assert rec is not None
    assert rec.schedule is not None
    assert [(s.max_batch_size, s.tokens) for s in rec.schedule] == [(1, 5), (4, 4), (16, 3)]
    assert "b 1-1: k=5 241.2 tok/s" in rec.schedule_message
    # vLLM's num_speculative_tokens_per_batch_size for it (first range starts at 1).
    assert schedule_ranges(rec.schedule, 16) == [[1, 1, 5], [2, 4, 4], [5, 16, 3]]


def test_schedule_off_or_without_max_num_seqs_gives_no_schedule() -> None:
    state = tune(spec("Recommend")).state
    assert state is not None
    assert state.recommendation is not None
    assert (state.recommendation.schedule, state.recommendation.schedule_message) == (None, "")
    no_limit = tune(spec("Recommend", schedule="Auto")).state
    assert no_limit is not None
    assert no_limit.recommendation is not None
    assert "maxNumSeqs" in no_limit.recommendation.schedule_message


def applied_scheduled_spec() -> SpeculativeDeploymentSpec:
    base = spec("Apply", schedule="Auto").model_dump(by_alias=True, exclude_none=True)
    return SpeculativeDeploymentSpec.model_validate({**base, "engine": {"maxNumSeqs": 16}})


def schedule_trial() -> tuple[AutotuneStatus, Tuning]:
    """Measured at batch 1 then batch 8 (the case above): b 1: k=5, 2-4: k=4, 5-16: k=3."""
    at_batch_1 = dataclasses.replace(MEASURED, step_seconds=0.015, mean_batch_size=1.0)
    first = tune(applied_scheduled_spec(), measured=at_batch_1).state
    assert first is not None
    # One batch size: no schedule yet, so the single-k rule acts (k=3 -> 5 here).
    first = first.model_copy(update={"applied_tokens": None, "trial_revision": None})
    first = first.model_copy(update={"applied_at": None, "previous_tokens": None})
    at_batch_8 = dataclasses.replace(MEASURED, step_seconds=0.029, mean_batch_size=8.0)
    return first, tune(applied_scheduled_spec(), first, measured=at_batch_8)


def test_apply_rolls_out_the_recommended_schedule() -> None:
    _, tuning = schedule_trial()
    state = tuning.state
    assert state is not None
    steps = [(s.max_batch_size, s.tokens) for s in state.applied_schedule or []]
    assert steps == [(1, 5), (4, 4), (16, 3)]
    assert state.applied_tokens == 5, "numSpeculativeTokens is the schedule's largest k"
    assert state.trial_revision == "tuned00005sb<=1:5,b<=4:4,b<=16:3"
    assert tuning.tokens == 5
    assert tuning.schedule is not None
    assert [e.reason for e in tuning.events] == [Reason.TUNED_REVISION_ROLLED_OUT]
    assert "schedule b<=1:5,b<=4:4,b<=16:3" in tuning.events[0].message
    # The pods of that trial: vLLM gets the schedule and k=5.
    served = tuned_spec(applied_scheduled_spec(), tuning.tokens, tuning.schedule)
    assert served.pair.draft.autotune is None
    assert served.pair.draft.num_speculative_tokens == 5
    config = speculative_config(served, None)
    assert config is not None
    assert config["num_speculative_tokens"] == 5
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 5], [2, 4, 4], [5, 16, 3]]
    # The revision changes with the schedule (through the spec).
    oc = OperatorConfig()
    plain = revision_hash(tuned_spec(applied_scheduled_spec(), 5), None, oc)
    assert revision_hash(served, None, oc) != plain


def test_a_stable_that_serves_the_schedule_is_not_tuned_to_it_again() -> None:
    _, tuning = schedule_trial()
    assert tuning.state is not None
    promoted_analysis = AnalysisStatus(
        revision=tuning.state.trial_revision, started_at="x", outcome=Outcome.PROMOTE
    )
    later = NOW + timedelta(hours=2)
    promoted = tune(
        applied_scheduled_spec(), tuning.state, measured=None, analysis=promoted_analysis, now=later
    )
    assert promoted.state is not None
    assert promoted.state.trial_revision is None
    assert [e.reason for e in promoted.events] == [Reason.TUNED_REVISION_PROMOTED]
    assert promoted.tokens == 5
    assert promoted.schedule == tuning.schedule, "the promoted schedule keeps being served"
    assert promoted.state.previous_schedule is None
    # Measured again, the stable serving the schedule: the same schedule is no new trial.
    at_batch_8 = dataclasses.replace(MEASURED, step_seconds=0.029, mean_batch_size=8.0)
    served = tuning.state.applied_schedule
    again = tune(
        applied_scheduled_spec(),
        promoted.state.model_copy(update={"applied_schedule": served}),
        measured=dataclasses.replace(at_batch_8, step_seconds=0.015, mean_batch_size=1.0),
        now=later + timedelta(hours=2),
        stable_schedule=served,
    )
    assert again.state is not None
    rec = again.state.recommendation
    assert rec is not None
    assert rec.schedule is not None
    # These figures recommend another schedule than the one served (k=2 past batch 8, where
    # the served one keeps 3), so the served schedule is no reason to hold: a new trial.
    assert schedule_key(rec.schedule) != schedule_key(served or [])
    assert again.state.trial_revision is not None
    assert [e.reason for e in again.events] == [Reason.TUNED_REVISION_ROLLED_OUT]
    # With the stable serving exactly the recommended schedule there is no trial; with it
    # serving no schedule there is one.
    same = tune(
        applied_scheduled_spec(),
        promoted.state,
        measured=dataclasses.replace(at_batch_8, step_seconds=0.015, mean_batch_size=1.0),
        now=later + timedelta(hours=2),
        stable_schedule=rec.schedule,
    )
    assert same.state is not None
    assert (same.state.trial_revision, same.events) == (None, ())
    other = tune(
        applied_scheduled_spec(),
        promoted.state,
        measured=dataclasses.replace(at_batch_8, step_seconds=0.015, mean_batch_size=1.0),
        now=later + timedelta(hours=2),
        stable_schedule=None,
    )
    assert other.state is not None
    assert other.state.trial_revision is not None
    assert [e.reason for e in other.events] == [Reason.TUNED_REVISION_ROLLED_OUT]


def test_a_rejected_schedule_is_not_tried_again() -> None:
    _, tuning = schedule_trial()
    assert tuning.state is not None
    rolled_back = AnalysisStatus(
        revision=tuning.state.trial_revision,
        started_at="x",
        outcome=Outcome.ROLLBACK,
        message="slower",
    )
    later = NOW + timedelta(hours=2)
    at_batch_8 = dataclasses.replace(MEASURED, step_seconds=0.029, mean_batch_size=8.0)
    after = tune(
        applied_scheduled_spec(), tuning.state, measured=None, analysis=rolled_back, now=later
    )
    assert after.state is not None
    assert after.state.rejected_schedules == ["b<=1:5,b<=4:4,b<=16:3"]
    assert after.state.rejected_tokens == []
    assert (after.state.applied_schedule, after.tokens, after.schedule) == (None, None, None)
    assert [e.reason for e in after.events] == [Reason.TUNED_REVISION_REJECTED]
    assert "is not tried again" in after.events[0].message
    # The same schedule recommended again, past the cooldown: no new trial.
    again = tune(
        applied_scheduled_spec(), after.state, measured=at_batch_8, now=later + timedelta(hours=2)
    )
    assert again.state is not None
    assert again.state.recommendation is not None
    assert again.state.recommendation.schedule is not None
    rejected = schedule_key(again.state.recommendation.schedule)
    assert rejected == "b<=1:5,b<=4:4,b<=16:3", "the same measurement, the same schedule"
    assert again.state.trial_revision is None
    assert again.events == ()
