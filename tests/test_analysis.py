"""Canary verdicts per interval and what a run of them decides."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specdeploy.api.config import AnalysisSettings
from specdeploy.plan.rollout.analysis import (
    AnalysisState,
    IntervalVerdict,
    Measurement,
    Outcome,
    Result,
    advance,
    interval_number,
    judge_interval,
)

CRITERIA = AnalysisSettings()
GOOD = Measurement(acceptance_rate=0.82, mean_acceptance_length=3.1, draft_tokens=2412)
PASS = IntervalVerdict(Result.PASS, "")
FAIL = IntervalVerdict(Result.FAIL, "")
NO_DATA = IntervalVerdict(Result.INCONCLUSIVE, "")


def test_a_bad_draft_fails_with_its_figures() -> None:
    bad = Measurement(acceptance_rate=0.08, draft_tokens=2412)
    verdict = judge_interval(bad, None, stable_has_draft=False, criteria=CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.message == "acceptance 0.08 < 0.60 over 2,412 draft tokens"


def test_a_good_draft_passes() -> None:
    verdict = judge_interval(GOOD, None, stable_has_draft=False, criteria=CRITERIA)
    assert verdict.result == Result.PASS
    assert "0.82" in verdict.message


@pytest.mark.parametrize(
    ("canary", "why"),
    [
        (Measurement(acceptance_rate=0.9, draft_tokens=1999), "fewer than the 2,000"),
        (Measurement(acceptance_rate=None, draft_tokens=0), "fewer than the 2,000"),
        (Measurement(error="connection refused"), "metrics unavailable: connection refused"),
    ],
)
def test_too_little_data_or_no_prometheus_is_inconclusive(canary: Measurement, why: str) -> None:
    verdict = judge_interval(canary, GOOD, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert why in verdict.message


def test_a_drop_against_a_stable_with_a_draft_fails_but_not_against_one_without() -> None:
    canary = Measurement(acceptance_rate=0.65, draft_tokens=5000)
    stable = Measurement(acceptance_rate=0.85, draft_tokens=5000)
    with_draft = judge_interval(canary, stable, stable_has_draft=True, criteria=CRITERIA)
    assert with_draft.result == Result.FAIL
    assert "0.20 below the stable's 0.85" in with_draft.message
    without = judge_interval(canary, stable, stable_has_draft=False, criteria=CRITERIA)
    assert without.result == Result.PASS


def test_an_accepted_but_slow_draft_fails_on_latency() -> None:
    canary = Measurement(acceptance_rate=0.95, draft_tokens=5000, inter_token_latency_p50=0.030)
    stable = Measurement(inter_token_latency_p50=0.020)
    verdict = judge_interval(canary, stable, stable_has_draft=False, criteria=CRITERIA)
    assert verdict.result == Result.FAIL
    assert "1.50x the stable's 20.0 ms" in verdict.message
    close = Measurement(acceptance_rate=0.95, draft_tokens=5000, inter_token_latency_p50=0.021)
    assert judge_interval(close, stable, False, CRITERIA).result == Result.PASS


def run(verdicts: list[IntervalVerdict], criteria: AnalysisSettings = CRITERIA) -> list[Outcome]:
    state = AnalysisState()
    outcomes = []
    for number, verdict in enumerate(verdicts):
        state, outcome = advance(state, number, verdict, criteria)
        outcomes.append(outcome)
    return outcomes


def test_rollback_when_failures_reach_the_limit_counted_over_the_whole_run() -> None:
    assert run([FAIL, PASS, FAIL]) == [Outcome.CONTINUE, Outcome.CONTINUE, Outcome.ROLLBACK]
    assert run([FAIL], AnalysisSettings(failure_limit=1)) == [Outcome.ROLLBACK]


def test_promote_after_passes_in_a_row_and_a_failure_starts_the_count_again() -> None:
    assert run([PASS, PASS, PASS])[-1] == Outcome.PROMOTE
    assert run([PASS, PASS, FAIL, PASS, PASS])[-1] == Outcome.CONTINUE


def test_missing_data_never_promotes_under_hold_and_judging_goes_on() -> None:
    assert run([PASS, PASS, NO_DATA, NO_DATA]) == [
        Outcome.CONTINUE,
        Outcome.CONTINUE,
        Outcome.HOLD,
        Outcome.HOLD,
    ]
    assert run([PASS, PASS, NO_DATA, PASS])[-1] == Outcome.PROMOTE


def test_inconclusive_follows_the_policy() -> None:
    assert run([NO_DATA], AnalysisSettings(on_inconclusive="Rollback")) == [Outcome.ROLLBACK]
    assert run([NO_DATA], AnalysisSettings(on_inconclusive="Promote")) == [Outcome.PROMOTE]


def test_an_interval_is_counted_once_so_a_restart_cannot_count_it_again() -> None:
    state, _ = advance(AnalysisState(), 0, FAIL, CRITERIA)
    again, outcome = advance(state, 0, FAIL, CRITERIA)
    assert again == state
    assert outcome == Outcome.CONTINUE
    state, outcome = advance(again, 1, FAIL, CRITERIA)
    assert outcome == Outcome.ROLLBACK


def test_intervals_are_numbered_from_the_canary_start() -> None:
    assert interval_number(100, 159, 60) == -1
    assert interval_number(100, 160, 60) == 0
    assert interval_number(100, 400, 60) == 4
    with pytest.raises(ValueError, match="positive"):
        interval_number(0, 1, 0)


# A tuned canary (only its autotuned k differs from the stable) is judged by tokens per second.
# Stable k=3: a = 0.9, 0.8, 0.7 -> acceptance 2.4/3 = 0.80, mean length 1 + 2.4 = 3.4 tokens
# per step, 20 ms a step -> 170 tokens/s per sequence.
STABLE_K3 = Measurement(
    acceptance_rate=0.80,
    mean_acceptance_length=3.4,
    draft_tokens=6000,
    step_seconds=0.020,
)


def _k6(step_seconds: float, acceptance: float = 0.65) -> Measurement:
    # k=6: a = 0.9 .. 0.4 -> acceptance 3.9/6 = 0.65, mean length 4.9 tokens per step.
    return Measurement(
        acceptance_rate=acceptance,
        mean_acceptance_length=4.9,
        draft_tokens=6000,
        step_seconds=step_seconds,
    )


def test_a_longer_tuned_k_with_a_lower_acceptance_rate_but_more_tokens_per_second_passes() -> None:
    canary = _k6(0.026)  # 4.9 / 0.026 = 188.5 tokens/s, +10.9 % on 170
    verdict = judge_interval(canary, STABLE_K3, True, CRITERIA, tuned=True)
    assert verdict.result == Result.PASS
    assert "188.5 tokens/s per sequence vs the stable's 170.0 (+10.9%)" in verdict.message
    # The acceptance criteria alone would have failed it: 0.15 below the stable's 0.80.
    assert judge_interval(canary, STABLE_K3, True, CRITERIA).result == Result.FAIL


def test_a_longer_tuned_k_with_fewer_tokens_per_second_fails() -> None:
    canary = _k6(0.032)  # 4.9 / 0.032 = 153.1 tokens/s, -9.9 % on 170
    verdict = judge_interval(canary, STABLE_K3, True, CRITERIA, tuned=True)
    assert verdict.result == Result.FAIL
    assert "153.1 tokens/s per sequence vs the stable's 170.0 (-9.9%)" in verdict.message


def test_a_tuned_k_within_the_tolerance_passes_and_just_beyond_it_fails() -> None:
    # 2 % below 170 is 166.6 tokens/s: 4.9 / 166.6 = 29.41 ms a step.
    assert judge_interval(_k6(0.0294), STABLE_K3, True, CRITERIA, tuned=True).result == Result.PASS
    assert judge_interval(_k6(0.0295), STABLE_K3, True, CRITERIA, tuned=True).result == Result.FAIL
    # maxThroughputDrop 0.10: 10 % below 170 is 153 tokens/s, 4.9 / 153 = 32.03 ms a step.
    looser = CRITERIA.model_copy(update={"max_throughput_drop": 0.10})
    assert judge_interval(_k6(0.032), STABLE_K3, True, looser, tuned=True).result == Result.PASS
    verdict = judge_interval(_k6(0.0321), STABLE_K3, True, looser, tuned=True)
    assert verdict.result == Result.FAIL
    assert verdict.message.endswith("more than 10% slower")


def test_a_tuned_k_is_judged_by_its_mean_step_time_not_the_bucketed_median() -> None:
    # vLLM's first inter-token latency bucket ends at 10 ms: two engines whose steps all take
    # under 10 ms get the same interpolated p50 (5 ms), whatever their real step times. The mean
    # (histogram sum over count) tells them apart: the k=6 at 32 ms a step is 153.1 tokens/s
    # against the stable's 170, and fails although its median equals the stable's.
    canary = replace(_k6(0.032), inter_token_latency_p50=0.005)
    stable = replace(STABLE_K3, inter_token_latency_p50=0.005)
    verdict = judge_interval(canary, stable, True, CRITERIA, tuned=True)
    assert verdict.result == Result.FAIL
    assert "153.1 tokens/s per sequence vs the stable's 170.0" in verdict.message


def test_a_tuned_k_keeps_the_acceptance_floor() -> None:
    canary = _k6(0.020, acceptance=0.55)  # 245 tokens/s, but below minAcceptanceRate 0.60
    verdict = judge_interval(canary, STABLE_K3, True, CRITERIA, tuned=True)
    assert verdict.result == Result.FAIL
    assert verdict.message.startswith("acceptance 0.55 < 0.60")


def test_a_tuned_k_without_the_stable_s_step_time_is_inconclusive() -> None:
    stable = Measurement(acceptance_rate=0.80, mean_acceptance_length=3.4, draft_tokens=6000)
    verdict = judge_interval(_k6(0.026), stable, True, CRITERIA, tuned=True)
    assert verdict.result == Result.INCONCLUSIVE
    assert "the stable's tokens per second" in verdict.message
