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
    ProbeTokens,
    Result,
    advance,
    interval_number,
    judge_interval,
    live_window,
)
from vllm_windows import figures, served

CRITERIA = AnalysisSettings()
PASS = IntervalVerdict(Result.PASS, "")
FAIL = IntervalVerdict(Result.FAIL, "")
NO_DATA = IntervalVerdict(Result.INCONCLUSIVE, "")

# Target alone, 8 ms a step (every step under vLLM's first bucket bound, 10 ms), one token each.
TARGET_ALONE = served(0.008).measurement()
# A pair at k=3 with two of three draft tokens accepted: 12 ms a step (the next bucket, 10 to
# 25 ms), three tokens a step: 4 ms per token.
PAIR = served(0.012, k=3, accepted_per_step=2).measurement()


def test_a_good_pair_passes_with_its_figures_beside_the_stable_s() -> None:
    verdict = judge_interval(PAIR, TARGET_ALONE, stable_has_draft=False, criteria=CRITERIA)
    assert verdict.result == Result.PASS, verdict.message
    assert verdict.message.startswith("acceptance 0.67 (mean length 3.00) over 5,760 draft tokens")
    assert "4.0 ms per token vs the stable's 8.0 ms (0.50x)" in verdict.message
    assert "first token 20.0 ms vs 20.0 ms (1.00x)" in verdict.message
    assert "errors 0.0% of 40 requests vs the stable's 0.0%" in verdict.message


def test_a_bad_draft_fails_with_its_figures() -> None:
    bad = served(0.012, k=3, accepted_per_step=0).measurement()
    verdict = judge_interval(bad, TARGET_ALONE, stable_has_draft=False, criteria=CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.message.startswith(
        "first-position acceptance 0.00 < 0.60 over 5,760 draft tokens"
    )
    # The same draft is also slower per token than the target alone (12 ms a token), and says so.
    assert "time per output token 12.0 ms is 1.50x the stable's 8.0 ms" in verdict.message


def _drafting(per_token: float, k: int, step: float) -> Measurement:
    """A window of a draft whose every token is accepted with `per_token` odds, at k."""
    per_position = tuple(per_token ** (i + 1) for i in range(k))
    rate = sum(per_position) / k
    measured = figures(rate, 1 + sum(per_position), step, draft_tokens=2400.0 * k, steps=2400.0)
    return replace(measured, acceptance_per_position=per_position)


@pytest.mark.parametrize(
    ("per_token", "k"),
    # The acceptance rate falls with k for the same draft: 0.51, 0.54 and 0.49 here, all under
    # the 0.6 floor, while every one of them is faster per token than the target alone.
    [(0.7, 3), (0.8, 5), (0.8, 6)],
)
def test_a_good_long_draft_passes_the_floor_on_its_first_position(per_token: float, k: int) -> None:
    # Target alone 20 ms a step; the pair 30 ms a step: k=3 at 0.7 is 2.53 tokens a step,
    # 11.8 ms a token (1.69x faster).
    canary = _drafting(per_token, k, 0.030)
    assert canary.acceptance_rate is not None
    assert canary.acceptance_rate < 0.6
    verdict = judge_interval(canary, figures(None, 1.0, 0.020), False, CRITERIA)
    assert verdict.result == Result.PASS, verdict.message
    assert verdict.time_per_output_token is not None
    assert verdict.time_per_output_token < 0.6 * 0.020


def test_the_floor_reads_the_first_position_whatever_k() -> None:
    # 0.55 a token is under the floor at any k: the first position reads 0.55 at k=1 and k=5.
    for k in (1, 5):
        verdict = judge_interval(_drafting(0.55, k, 0.030), None, False, CRITERIA)
        assert verdict.result == Result.FAIL
        assert verdict.message.startswith("first-position acceptance 0.55 < 0.60"), k


@pytest.mark.parametrize(
    ("canary", "why"),
    [
        (replace(PAIR, draft_tokens=1999), "fewer than the 2,000"),
        (Measurement(acceptance_rate=None, draft_tokens=0), "fewer than the 2,000"),
    ],
)
def test_too_little_data_is_inconclusive(canary: Measurement, why: str) -> None:
    verdict = judge_interval(canary, PAIR, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert why in verdict.message


def test_no_answer_from_prometheus_is_an_error_not_a_verdict() -> None:
    unread = Measurement(error="connection refused")
    verdict = judge_interval(unread, PAIR, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == Result.ERROR
    assert "metrics unavailable: connection refused" in verdict.message
    verdict = judge_interval(PAIR, replace(PAIR, error="timed out"), True, CRITERIA)
    assert verdict.result == Result.ERROR
    assert "the stable's figures could not be read: timed out" in verdict.message


@pytest.mark.parametrize(
    ("stable", "why"),
    [
        (Measurement(error="timed out"), "the stable's figures could not be read: timed out"),
        (Measurement(), "the stable decoded nothing in the window"),
    ],
)
def test_a_failed_or_empty_stable_measurement_is_never_a_pass(
    stable: Measurement, why: str
) -> None:
    verdict = judge_interval(PAIR, stable, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == (Result.ERROR if stable.error else Result.INCONCLUSIVE)
    assert why in verdict.message
    # A floor failure still fails: the canary's own figures suffice for it.
    bad = served(0.012, k=3, accepted_per_step=0).measurement()
    assert judge_interval(bad, stable, True, CRITERIA).result == Result.FAIL


def test_a_drop_against_a_stable_with_a_draft_fails_but_not_against_one_without() -> None:
    canary = served(0.012, k=3, accepted_per_step=2).measurement()  # 0.67
    stable = served(0.012, k=4, accepted_per_step=4).measurement()  # 1.00, 5 tokens a step
    with_draft = judge_interval(canary, stable, stable_has_draft=True, criteria=CRITERIA)
    assert with_draft.result == Result.FAIL
    assert (
        "acceptance 0.67 over the first 3 positions (the canary drafts 3, the stable 4) is 0.33 "
        "below the stable's 1.00" in with_draft.message
    )
    # Judged on the probe's identical prompts instead (the drop was judged there): the live
    # acceptance of two prompt mixes is not compared, only the latency on the probe's tokens.
    same = ProbeTokens(canary=5.0, stable=5.0)
    on_probe = judge_interval(canary, stable, True, CRITERIA, probe=same)
    assert on_probe.result == Result.PASS, on_probe.message
    assert "(1.00x on the probe's tokens per step)" in on_probe.message


def with_positions(measured: Measurement, *per_position: float) -> Measurement:
    """`measured` with these per-position acceptances, and the rate they make."""
    rate = sum(per_position) / len(per_position)
    return replace(measured, acceptance_per_position=per_position, acceptance_rate=rate)


def test_a_longer_k_is_compared_on_the_positions_both_draft_not_on_its_lower_rate() -> None:
    # The same draft at k=1 and at k=6: position 0 is accepted as often under both, and the
    # later positions pull k=6's rate down (each is accepted only after all before it).
    stable = with_positions(served(0.008, k=1, accepted_per_step=1).measurement(), 0.88)
    canary = with_positions(
        served(0.012, k=6, accepted_per_step=3).measurement(), 0.88, 0.80, 0.72, 0.64, 0.56, 0.48
    )
    assert canary.acceptance_rate is not None
    assert stable.acceptance_rate is not None
    assert stable.acceptance_rate - canary.acceptance_rate > CRITERIA.max_drop_vs_stable
    verdict = judge_interval(canary, stable, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == Result.PASS, verdict.message
    # The reverse is alike: a shorter k's rate is higher and never reads as a drop.
    back = judge_interval(stable, canary, stable_has_draft=True, criteria=CRITERIA)
    assert "below the stable's" not in back.message, back.message


def test_a_worse_draft_at_another_k_still_fails_on_the_positions_both_draft() -> None:
    stable = with_positions(served(0.008, k=1, accepted_per_step=1).measurement(), 0.88)
    canary = with_positions(served(0.012, k=3, accepted_per_step=2).measurement(), 0.70, 0.66, 0.6)
    verdict = judge_interval(canary, stable, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == Result.FAIL, verdict.message
    assert (
        "acceptance 0.70 over the first position (the canary drafts 3, the stable 1) is 0.18 "
        "below the stable's 0.88" in verdict.message
    )


def test_the_same_k_is_compared_on_the_rates() -> None:
    # Same k: the mean over the positions is the rate, and the message names no positions.
    canary = with_positions(PAIR, 0.9, 0.5, 0.3)
    stable = with_positions(PAIR, 0.95, 0.9, 0.85)
    verdict = judge_interval(canary, stable, stable_has_draft=True, criteria=CRITERIA)
    assert verdict.result == Result.FAIL
    assert "acceptance 0.57 is 0.33 below the stable's 0.90 (more than 0.10)" in verdict.message


def test_real_buckets_a_pair_a_bucket_above_the_target_alone_yet_faster_per_token_passes() -> None:
    stable, canary = served(0.008), served(0.012, k=3, accepted_per_step=2)
    # What a bucketed median would say: every stable step sits in the first bucket (to 10 ms)
    # and every canary step in the second (10 to 25 ms), so the interpolated medians are 5 and
    # 17.5 ms: 3.5x "slower", rolled back by any per-step bound.
    assert stable.itl.interpolated_quantile(0.5) == pytest.approx(0.005)
    assert canary.itl.interpolated_quantile(0.5) == pytest.approx(0.0175)
    # Per token it is twice as fast: 4 ms against 8.
    verdict = judge_interval(canary.measurement(), stable.measurement(), False, CRITERIA)
    assert verdict.result == Result.PASS, verdict.message
    assert verdict.time_per_output_token == pytest.approx(0.004)
    assert verdict.stable_time_per_output_token == pytest.approx(0.008)
    assert run([verdict] * CRITERIA.promote_after)[-1] == Outcome.PROMOTE


def test_real_buckets_a_pair_15_percent_slower_per_token_in_the_same_bucket_fails() -> None:
    stable = served(0.012, k=3, accepted_per_step=2)
    canary = served(0.0138, k=3, accepted_per_step=2)  # 15 % longer steps, same tokens a step
    # Both in the 10 to 25 ms bucket: the interpolated medians are alike (1.0x), so a bound on
    # them passes anything inside the bucket.
    assert canary.itl.interpolated_quantile(0.5) == pytest.approx(
        stable.itl.interpolated_quantile(0.5)
    )
    verdict = judge_interval(canary.measurement(), stable.measurement(), True, CRITERIA)
    assert verdict.result == Result.FAIL
    assert "time per output token 4.6 ms is 1.15x the stable's 4.0 ms" in verdict.message
    assert run([verdict] * CRITERIA.failure_limit)[-1] == Outcome.ROLLBACK


def test_an_accepted_but_slow_draft_fails_on_time_per_output_token() -> None:
    # Every draft token accepted (4 tokens a step at k=3), but a step takes 40 ms: 10 ms a
    # token against the target alone's 8.
    slow = served(0.040, k=3, accepted_per_step=3).measurement()
    verdict = judge_interval(slow, TARGET_ALONE, False, CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.message == (
        "time per output token 10.0 ms is 1.25x the stable's 8.0 ms (more than 1.10x)"
    )
    # Within the bound: 35 ms a step is 8.75 ms a token, 1.09x.
    close = served(0.035, k=3, accepted_per_step=3).measurement()
    assert judge_interval(close, TARGET_ALONE, False, CRITERIA).result == Result.PASS
    # The bound's former name still sets it (it is per token now).
    looser = AnalysisSettings(max_time_per_output_token_increase=1.3)
    assert judge_interval(slow, TARGET_ALONE, False, looser).result == Result.PASS


def test_a_slower_first_token_beyond_the_bound_fails() -> None:
    canary = served(0.012, k=3, accepted_per_step=2, first_token=0.080).measurement()
    verdict = judge_interval(canary, TARGET_ALONE, False, CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.message == (
        "time to first token 80.0 ms is 4.00x the stable's 20.0 ms (more than 1.50x and 50ms "
        "longer)"
    )


@pytest.mark.parametrize(
    ("canary_first", "stable_first", "why"),
    [
        (0.031, 0.020, "1.55x, but 11 ms longer: a draft's first step nobody notices"),
        (0.280, 0.200, "80 ms longer, but 1.40x"),
    ],
)
def test_a_first_token_fails_only_beyond_both_the_ratio_and_the_tolerance(
    canary_first: float, stable_first: float, why: str
) -> None:
    canary = served(0.012, k=3, accepted_per_step=2, first_token=canary_first).measurement()
    stable = served(0.008, first_token=stable_first).measurement()
    assert judge_interval(canary, stable, False, CRITERIA).result == Result.PASS, why


def test_requests_that_fail_fail_the_canary() -> None:
    failing = served(0.012, k=3, accepted_per_step=2, failed=20).measurement()
    verdict = judge_interval(failing, TARGET_ALONE, False, CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.message == (
        "errors 50.0% of 40 requests vs the stable's 0.0% (more than 5% above)"
    )
    # As many errors as the stable's: not the canary's doing.
    stable = served(0.008, failed=20).measurement()
    assert judge_interval(failing, stable, False, CRITERIA).result == Result.PASS
    # Two of forty (5 %) is within the bound.
    few = served(0.012, k=3, accepted_per_step=2, failed=2).measurement()
    assert judge_interval(few, TARGET_ALONE, False, CRITERIA).result == Result.PASS


def test_latency_is_not_compared_across_loads_too_far_apart() -> None:
    # The stable runs two sequences a step (twice the engine steps' sequences): its latency
    # says nothing of the canary's at batch 1.
    busy = replace(TARGET_ALONE, engine_steps=(TARGET_ALONE.engine_steps or 0) / 2)
    slow = served(0.040, k=3, accepted_per_step=3).measurement()
    verdict = judge_interval(slow, busy, False, CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert "latency not compared: running batch 1.00 vs the stable's 2.00" in verdict.message
    # A failure of another criterion still fails.
    bad = served(0.012, k=3, accepted_per_step=0).measurement()
    assert judge_interval(bad, busy, False, CRITERIA).result == Result.FAIL


def test_no_finished_request_or_no_first_token_is_inconclusive() -> None:
    unfinished = replace(PAIR, finished=0.0, failed=0.0)
    verdict = judge_interval(unfinished, TARGET_ALONE, False, CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert "no request of the canary finished" in verdict.message
    no_first = replace(PAIR, first_tokens=0.0, first_token_seconds_sum=0.0)
    verdict = judge_interval(no_first, TARGET_ALONE, False, CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert "time to first token not measured" in verdict.message


def test_a_canary_without_a_draft_is_judged_on_its_tokens() -> None:
    canary = served(0.008, requests=50).measurement()
    verdict = judge_interval(canary, PAIR, True, CRITERIA, canary_has_draft=False)
    assert verdict.result == Result.FAIL  # 8 ms a token against the pair's 4
    assert "time per output token 8.0 ms is 2.00x" in verdict.message
    few = served(0.008, requests=10).measurement()
    verdict = judge_interval(few, PAIR, True, CRITERIA, canary_has_draft=False)
    assert verdict.result == Result.INCONCLUSIVE
    assert "480 tokens in the window, fewer than the 2,000" in verdict.message


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
    # An Inconclusive breaks the run of passes: they are counted in a row again after it.
    assert run([PASS, PASS, NO_DATA, PASS])[-1] == Outcome.CONTINUE
    assert run([PASS, PASS, NO_DATA, PASS, PASS, PASS])[-1] == Outcome.PROMOTE


UNANSWERED = IntervalVerdict(Result.ERROR, "metrics unavailable")


def test_an_error_counts_neither_way_and_holds_whatever_the_policy() -> None:
    # Prometheus down for 25 intervals: never a rollback at the inconclusive limit (20), and
    # neither onInconclusive policy acts on it.
    for policy in ("Hold", "Rollback", "Promote"):
        criteria = AnalysisSettings(on_inconclusive=policy)
        assert set(run([UNANSWERED] * 25, criteria)) == {Outcome.HOLD}, policy
    # The clock pauses: passes on either side of an outage still count in a row, and a failure
    # before it still counts towards the limit.
    assert run([PASS, PASS, UNANSWERED, UNANSWERED, PASS])[-1] == Outcome.PROMOTE
    assert run([FAIL, UNANSWERED, FAIL])[-1] == Outcome.ROLLBACK
    state = AnalysisState()
    for number, verdict in enumerate([NO_DATA, UNANSWERED, UNANSWERED]):
        state, _ = advance(state, number, verdict, CRITERIA)
    assert (state.inconclusive_in_a_row, state.errors_in_a_row, state.last_interval) == (1, 2, 2)
    state, _ = advance(state, 3, PASS, CRITERIA)
    assert state.errors_in_a_row == 0


def test_inconclusive_follows_the_policy() -> None:
    assert run([NO_DATA], AnalysisSettings(on_inconclusive="Rollback")) == [Outcome.ROLLBACK]
    assert run([NO_DATA], AnalysisSettings(on_inconclusive="Promote")) == [Outcome.PROMOTE]


def test_a_hold_lasts_at_most_the_inconclusive_limit_in_a_row() -> None:
    limit = AnalysisSettings(inconclusive_limit=3)
    assert run([NO_DATA] * 3, limit) == [Outcome.HOLD, Outcome.HOLD, Outcome.ROLLBACK]
    # A conclusive verdict starts the count again.
    assert run([NO_DATA, NO_DATA, PASS, NO_DATA, NO_DATA], limit)[-1] == Outcome.HOLD
    assert AnalysisSettings().inconclusive_limit == 20


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
# Stable k=3: 3.4 tokens per step, 20 ms a step -> 170 tokens/s per sequence.
def _tuned(
    step_seconds: float, tokens_per_step: float, acceptance: float, k: int = 3
) -> Measurement:
    steps = 2000.0
    return Measurement(
        acceptance_rate=acceptance,
        mean_acceptance_length=tokens_per_step,
        draft_tokens=steps * k,
        step_seconds_sum=steps * step_seconds,
        steps=steps,
        output_tokens=steps * tokens_per_step + 40,
        first_token_seconds_sum=0.8,
        first_tokens=40.0,
        engine_steps=steps + 40,
        finished=40.0,
        failed=0.0,
    )


STABLE_K3 = _tuned(0.020, 3.4, 0.80)


def _k6(step_seconds: float, acceptance: float = 0.65) -> Measurement:
    # k=6: a = 0.9 .. 0.4 -> acceptance 3.9/6 = 0.65, 4.9 tokens per step.
    return _tuned(step_seconds, 4.9, acceptance, k=6)


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


def test_a_tuned_k_keeps_the_acceptance_floor() -> None:
    canary = _k6(0.020, acceptance=0.55)  # 245 tokens/s, but below minAcceptanceRate 0.60
    verdict = judge_interval(canary, STABLE_K3, True, CRITERIA, tuned=True)
    assert verdict.result == Result.FAIL
    assert verdict.message.startswith("tuned revision: first-position acceptance 0.55 < 0.60")


def test_a_tuned_k_without_the_stable_s_step_time_is_an_error() -> None:
    stable = replace(STABLE_K3, error="timed out")
    verdict = judge_interval(_k6(0.026), stable, True, CRITERIA, tuned=True)
    assert verdict.result == Result.ERROR
    assert "the stable's figures could not be read" in verdict.message


def test_the_live_window_is_cut_at_the_analysis_start() -> None:
    assert live_window("5m", None, 1000) == "5m"
    assert live_window("5m", 1000, 1060.7) == "60s"
    assert live_window("5m", 1000, 1300) == "5m"
    assert live_window("20s", 1000, 1010) == "10s"


def stretched(measured: Measurement, *steps: float) -> Measurement:
    """`measured` with the window cut into stretches whose mean step times are `steps`, and the
    whole window's sum and count made of them (each stretch the same number of steps)."""
    each = (measured.steps or 0) / len(steps)
    per_step = measured.tokens_per_step or 1.0
    return replace(
        measured,
        stretch_step_seconds=steps,
        stretch_time_per_output_token=tuple(s / per_step for s in steps),
        step_seconds_sum=sum(s * each for s in steps),
    )


def test_a_stretch_of_load_on_the_canary_s_machine_does_not_decide_alone() -> None:
    # The same pair on both; for two of the window's six stretches something else ran on the
    # canary's CPU and its steps took 25 % longer: 1.08x over the whole window's mean, 1.00x
    # by the median of the stretches.
    stable = stretched(PAIR, *[0.012] * 6)
    canary = stretched(PAIR, 0.015, 0.015, 0.012, 0.012, 0.012, 0.012)
    assert canary.mean_step_seconds == pytest.approx(0.013)
    assert canary.step_seconds == pytest.approx(0.012)
    verdict = judge_interval(canary, stable, True, CRITERIA)
    assert verdict.result == Result.PASS, verdict.message
    assert "4.0 ms per token vs the stable's 4.0 ms (1.00x, the median of 6 stretches)" in (
        verdict.message
    )
    # Three stretches of six at 35 % longer: 1.17x over the window's mean, and the median
    # (1.175x) is slow too. A slowdown that lasts half the window decides.
    canary = stretched(PAIR, 0.0162, 0.0162, 0.0162, 0.012, 0.012, 0.012)
    verdict = judge_interval(canary, stable, True, CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.time_per_output_token == pytest.approx(0.0047)
    assert "time per output token 4.7 ms is 1.17x the stable's 4.0 ms" in verdict.message


def test_a_draft_slow_in_every_stretch_fails_by_the_median_as_by_the_mean() -> None:
    stable = stretched(TARGET_ALONE, *[0.008] * 5)
    slow = served(0.040, k=3, accepted_per_step=3).measurement()
    verdict = judge_interval(stretched(slow, *[0.040] * 5), stable, False, CRITERIA)
    assert verdict.result == Result.FAIL
    assert verdict.message == (
        "time per output token 10.0 ms is 1.25x the stable's 8.0 ms, the median of 5 "
        "stretches (more than 1.10x)"
    )
    assert verdict.time_per_output_token == pytest.approx(0.010)


def test_each_stretch_s_step_is_divided_by_its_own_tokens_per_step() -> None:
    # The review's D13: a canary with a schedule of k ran three stretches at peak (k=0, 22 ms a
    # step, one token) and two off it (k=3, 28 ms a step, 2.53 tokens), the target alone 20 ms
    # a step throughout. The median step (22 ms) over the whole window's tokens per step
    # (1.61) read 13.6 ms a token, 0.68x: the peak's step over the off-peak's tokens. Stretch by
    # stretch, the canary is 22 ms a token at peak and 11.1 ms off it: the median is the
    # peak's, 1.10x, and a canary slower still at peak fails.
    steps, tokens = (0.022, 0.022, 0.022, 0.028, 0.028), (1.0, 1.0, 1.0, 2.53, 2.53)
    canary = replace(
        PAIR,
        stretch_step_seconds=steps,
        stretch_time_per_output_token=tuple(s / t for s, t in zip(steps, tokens, strict=True)),
        step_seconds_sum=sum(steps) * (PAIR.steps or 0) / 5,
        output_tokens=(PAIR.steps or 0) * sum(tokens) / 5 + (PAIR.first_tokens or 0),
        engine_steps=TARGET_ALONE.engine_steps,
    )
    assert canary.step_seconds == pytest.approx(0.022)
    assert canary.tokens_per_step == pytest.approx(1.612)
    stable = stretched(replace(TARGET_ALONE, steps=PAIR.steps), *[0.020] * 5)
    assert canary.time_per_output_token == pytest.approx(0.022)
    verdict = judge_interval(canary, stable, False, CRITERIA)
    assert verdict.time_per_output_token == pytest.approx(0.022)
    assert "22.0 ms per token vs the stable's 20.0 ms (1.10x, the median of 5 stretches)" in (
        verdict.message
    )
    # With the probe's tokens per step, the median step is divided by them, and said so.
    verdict = judge_interval(canary, stable, False, CRITERIA, probe=ProbeTokens(2.0, 1.0))
    assert "on the probe's tokens per step, the median step of 5 stretches" in verdict.message
    slower = replace(canary, stretch_time_per_output_token=(0.024, 0.024, 0.024, 0.011, 0.011))
    verdict = judge_interval(slower, stable, False, CRITERIA)
    assert verdict.result == Result.FAIL, verdict.message
    assert "time per output token 24.0 ms is 1.20x the stable's 20.0 ms" in verdict.message


@pytest.mark.parametrize("count", [0, 1, 2])
def test_fewer_than_three_stretches_are_judged_on_the_window_s_mean(count: int) -> None:
    stable = stretched(PAIR, *[0.012] * 3)
    # A window whose mean step is 15 % slower, with fewer stretches than a median needs.
    canary = replace(PAIR, step_seconds_sum=(PAIR.step_seconds_sum or 0) * 1.15)
    canary = replace(canary, stretch_step_seconds=(0.012,) * count)
    assert canary.step_seconds == pytest.approx(0.0138)
    verdict = judge_interval(canary, stable, True, CRITERIA)
    assert verdict.result == Result.FAIL, verdict.message
    assert "1.15x" in verdict.message
    assert "stretches" not in verdict.message


def test_latency_is_not_compared_when_a_running_batch_was_not_measured() -> None:
    # vLLM's iteration histogram dropped (a relabeling to save series): no batch to compare,
    # so the latency is not judged, and the verdict says which side lacks it.
    unmeasured = replace(PAIR, engine_steps=None)
    verdict = judge_interval(unmeasured, TARGET_ALONE, False, CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert "latency not compared: the canary's running batch was not measured" in verdict.message
    verdict = judge_interval(PAIR, replace(TARGET_ALONE, engine_steps=None), False, CRITERIA)
    assert verdict.result == Result.INCONCLUSIVE
    assert "the stable's running batch was not measured" in verdict.message


def test_5xx_before_the_engine_fail_the_canary_even_with_nothing_drafted() -> None:
    # A chat template that raises on a third of the requests: they never reach the engine, so
    # vLLM's finished requests show no error; the API server's responses do.
    broken = replace(PAIR, responses=60.0, server_errors=20.0)
    answered = replace(TARGET_ALONE, responses=60.0, server_errors=0.0)
    verdict = judge_interval(broken, answered, False, CRITERIA)
    assert verdict.result == Result.FAIL
    assert "HTTP 5xx 33.3% of 60 responses vs the stable's 0.0% (more than 5% above)" in (
        verdict.message
    )
    # Every request refused before the engine: nothing drafted, still a Fail, not Inconclusive.
    refused = Measurement(acceptance_rate=None, draft_tokens=0, responses=40.0, server_errors=40.0)
    assert judge_interval(refused, answered, False, CRITERIA).result == Result.FAIL
    # As many 5xx as the stable's, or too few responses to judge, do not fail.
    alike = replace(PAIR, responses=60.0, server_errors=3.0)
    also = replace(TARGET_ALONE, responses=60.0, server_errors=3.0)
    passed = judge_interval(alike, also, False, CRITERIA)
    assert passed.result == Result.PASS, passed.message
    assert "HTTP 5xx 5.0% of 60 responses vs the stable's 5.0%" in passed.message
    few = replace(PAIR, responses=19.0, server_errors=19.0)
    assert judge_interval(few, answered, False, CRITERIA).result == Result.PASS
