"""Canary analysis as pure functions: one verdict per interval, and what a run of them decides.

Conventions (docs/operator.md compares them with Argo Rollouts' and Flagger's):

- A verdict is Pass, Fail or Inconclusive. Inconclusive means the window cannot say: fewer draft
  tokens than `minDraftTokens`, no data, or Prometheus could not be asked. It is never a
  failure and never a pass, so a canary is never promoted on missing data.
- Fail when the canary's acceptance rate is below `minAcceptanceRate`; or, beside a stable
  revision that has a draft, more than `maxDropVsStable` below the stable's; or when both serve
  traffic and the canary's inter-token latency (p50) is more than `maxLatencyIncrease` times the
  stable's: a draft that is accepted but slow to run loses.
- A tuned canary (its only change from the stable is the length the autotuner chose) is judged
  by throughput, not acceptance: a longer k lowers the acceptance rate even when it emits more
  tokens per second. minAcceptanceRate stays its floor; then it fails when its tokens per step
  over its mean step time (mean acceptance length / mean inter-token latency) is more than
  `maxThroughputDrop` (0.02) below the stable's, and is Inconclusive without both figures. The
  mean (the histogram's sum over its count), not the p50: it is exact where a quantile is
  interpolated inside vLLM's buckets (the first ends at 10 ms, the next at 25 ms), and tokens
  over time is what a sequence gets, stalls included.
- The canary is rolled back when its failed verdicts reach `failureLimit` (">=", counted over
  the whole canary run, as Flagger counts; Argo Rollouts' `failureLimit` is "more than", so our
  2 is their 1). It is promoted after `promoteAfter` passing verdicts in a row. On Inconclusive,
  `onInconclusive` decides: Hold keeps judging (and says why), Rollback rolls back, Promote
  promotes only when a person chose it in the spec.
- Each interval is judged once: intervals are numbered from the canary's start, and the state
  (kept in the SD's status) remembers the last one judged, so an operator restarted mid-canary
  resumes without counting an interval twice or promoting twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum

from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import AnalysisStatus

RFC3339 = "%Y-%m-%dT%H:%M:%SZ"


class Result(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INCONCLUSIVE = "Inconclusive"


class Outcome(StrEnum):
    """What a run of verdicts decides for the canary now."""

    CONTINUE = "Continue"
    HOLD = "Hold"
    PROMOTE = "Promote"
    ROLLBACK = "Rollback"


@dataclass(frozen=True)
class Measurement:
    """What Prometheus says of one revision's pods over one window."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    draft_tokens: float = 0.0
    #: Median inter-token latency (seconds); None without traffic.
    inter_token_latency_p50: float | None = None
    #: Mean inter-token latency (seconds): vLLM observes it once per decode step of each
    #: sequence, so it is the mean step time. None without traffic.
    step_seconds: float | None = None
    time_to_first_token_p50: float | None = None
    #: Set when the query failed (Prometheus unreachable, a bad answer).
    error: str | None = None


@dataclass(frozen=True)
class IntervalVerdict:
    result: Result
    message: str


def _figure(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def describe_measurement(measured: Measurement) -> str:
    """One line of every figure of a measurement, "n/a" where Prometheus gave none."""
    if measured.error is not None:
        return f"no answer: {measured.error}"
    step = "n/a" if measured.step_seconds is None else f"{measured.step_seconds:.5f}s"
    return (
        f"acceptance {_figure(measured.acceptance_rate)}, mean acceptance length "
        f"{_figure(measured.mean_acceptance_length)}, {measured.draft_tokens:,.0f} draft tokens, "
        f"mean step {step}"
    )


def tokens_per_second(measured: Measurement) -> float | None:
    """Tokens one sequence gets per second: tokens per step (mean acceptance length, which
    counts the target's own token) over the mean step time (vLLM observes the inter-token
    latency once per step). None without either figure."""
    length, step = measured.mean_acceptance_length, measured.step_seconds
    if length is None or step is None or step <= 0:
        return None
    return length / step


def _judge_throughput(
    canary: Measurement, stable: Measurement | None, tokens: str, max_drop: float
) -> IntervalVerdict:
    mine = tokens_per_second(canary)
    theirs = tokens_per_second(stable) if stable is not None else None
    if mine is None or theirs is None:
        missing = "the canary's" if mine is None else "the stable's"
        return IntervalVerdict(
            Result.INCONCLUSIVE,
            f"tuned revision: {missing} tokens per second (acceptance length / mean step "
            "time) were not measured",
        )
    change = mine / theirs - 1
    figures = f"{mine:.1f} tokens/s per sequence vs the stable's {theirs:.1f} ({change:+.1%})"
    if change < -max_drop:
        return IntervalVerdict(
            Result.FAIL, f"tuned revision: {figures}, more than {max_drop:.0%} slower"
        )
    return IntervalVerdict(Result.PASS, f"tuned revision: {figures} over {tokens}")


def judge_interval(
    canary: Measurement,
    stable: Measurement | None,
    stable_has_draft: bool,
    criteria: AnalysisSettings,
    *,
    tuned: bool = False,
) -> IntervalVerdict:
    """The verdict on one window of the canary, beside the stable revision (None: no stable).

    `tuned`: the canary differs from the stable only by the autotuned length, so it is judged
    by tokens per second against the stable's (minAcceptanceRate stays the floor).
    """
    if canary.error is not None:
        return IntervalVerdict(Result.INCONCLUSIVE, f"metrics unavailable: {canary.error}")
    tokens = f"{canary.draft_tokens:,.0f} draft tokens"
    if canary.acceptance_rate is None or canary.draft_tokens < criteria.min_draft_tokens:
        return IntervalVerdict(
            Result.INCONCLUSIVE,
            f"{tokens} in the window, fewer than the {criteria.min_draft_tokens:,} a verdict needs",
        )
    rate = canary.acceptance_rate
    if rate < criteria.min_acceptance_rate:
        return IntervalVerdict(
            Result.FAIL,
            f"acceptance {rate:.2f} < {criteria.min_acceptance_rate:.2f} over {tokens}",
        )
    usable = stable if stable is not None and stable.error is None else None
    if tuned:
        return _judge_throughput(canary, usable, tokens, criteria.max_throughput_drop)
    if usable is not None and stable_has_draft and usable.acceptance_rate is not None:
        drop = usable.acceptance_rate - rate
        if drop > criteria.max_drop_vs_stable:
            return IntervalVerdict(
                Result.FAIL,
                f"acceptance {rate:.2f} is {drop:.2f} below the stable's "
                f"{usable.acceptance_rate:.2f} (more than {criteria.max_drop_vs_stable:.2f})",
            )
    canary_itl = canary.inter_token_latency_p50
    stable_itl = usable.inter_token_latency_p50 if usable is not None else None
    if canary_itl is not None and stable_itl is not None and stable_itl > 0:
        ratio = canary_itl / stable_itl
        if ratio > criteria.max_latency_increase:
            return IntervalVerdict(
                Result.FAIL,
                f"inter-token latency {canary_itl * 1000:.1f} ms is {ratio:.2f}x the stable's "
                f"{stable_itl * 1000:.1f} ms (more than {criteria.max_latency_increase:.2f}x)",
            )
    return IntervalVerdict(
        Result.PASS,
        f"acceptance {rate:.2f} (mean length {_figure(canary.mean_acceptance_length)}) "
        f"over {tokens}",
    )


@dataclass(frozen=True)
class AnalysisState:
    """A canary's analysis so far; lives in the SD's status so restarts resume it."""

    #: The number of the last interval judged (-1: none yet).
    last_interval: int = -1
    passes_in_a_row: int = 0
    failures: int = 0
    inconclusive_in_a_row: int = 0


def interval_number(started_seconds: float, now_seconds: float, interval_seconds: float) -> int:
    """Which interval of the canary `now` closes: 0 once one whole interval has passed."""
    if interval_seconds <= 0:
        raise ValueError("the analysis interval must be positive")
    return int((now_seconds - started_seconds) // interval_seconds) - 1


def advance(
    state: AnalysisState, interval: int, verdict: IntervalVerdict, criteria: AnalysisSettings
) -> tuple[AnalysisState, Outcome]:
    """Counts `verdict` for interval number `interval` (once) and says what follows.

    An interval already judged changes nothing: the outcome is then Continue (or Hold for a
    held canary, so the condition keeps saying why).
    """
    if interval <= state.last_interval:
        return state, _standing(state, criteria)
    if verdict.result == Result.PASS:
        state = replace(
            state,
            last_interval=interval,
            passes_in_a_row=state.passes_in_a_row + 1,
            inconclusive_in_a_row=0,
        )
    elif verdict.result == Result.FAIL:
        state = replace(
            state,
            last_interval=interval,
            passes_in_a_row=0,
            failures=state.failures + 1,
            inconclusive_in_a_row=0,
        )
    else:
        state = replace(
            state, last_interval=interval, inconclusive_in_a_row=state.inconclusive_in_a_row + 1
        )
    return state, _standing(state, criteria)


def _standing(state: AnalysisState, criteria: AnalysisSettings) -> Outcome:
    if state.failures >= criteria.failure_limit:
        return Outcome.ROLLBACK
    if state.passes_in_a_row >= criteria.promote_after:
        return Outcome.PROMOTE
    if state.inconclusive_in_a_row > 0:
        if criteria.on_inconclusive == "Rollback":
            return Outcome.ROLLBACK
        if criteria.on_inconclusive == "Promote":
            return Outcome.PROMOTE
        return Outcome.HOLD
    return Outcome.CONTINUE


_DURATION_PART = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration_seconds(text: str) -> float:
    """A duration as the CRD spells it ("90s", "1m30s", "500ms") in seconds."""
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


@dataclass(frozen=True)
class CanaryJudgement:
    """What this reconcile concluded about the canary: the analysis state to keep in status,
    the verdict counted now (if an interval closed), and what follows."""

    state: AnalysisStatus | None
    outcome: Outcome | None = None
    verdict: IntervalVerdict | None = None
    measured: Measurement | None = None


def _as_state(status: AnalysisStatus) -> AnalysisState:
    return AnalysisState(
        last_interval=status.last_interval,
        passes_in_a_row=status.passes_in_a_row,
        failures=status.failures,
        inconclusive_in_a_row=status.inconclusive_in_a_row,
    )


def judge_canary(
    previous: AnalysisStatus | None,
    *,
    canary: str | None,
    canary_ready: bool,
    stable: str | None,
    stable_has_draft: bool,
    measurements: Mapping[str, Measurement],
    settings: AnalysisSettings,
    now: datetime,
    tuned: bool = False,
) -> CanaryJudgement:
    """Advances the analysis of `canary` (None: no canary now) by what `now` closes.

    The analysis starts when all the canary's pods are ready; each interval after that gets
    one verdict (`tuned`: see judge_interval). A finished analysis (Promote or Rollback) stays
    as it ended; the analysis of an earlier canary is kept in status until a new one starts.
    """
    if canary is None:
        return CanaryJudgement(state=previous)
    if previous is None or previous.revision != canary:
        if not canary_ready:
            return CanaryJudgement(state=previous)
        previous = AnalysisStatus(revision=canary, started_at=now.strftime(RFC3339))
    if previous.outcome in (Outcome.PROMOTE, Outcome.ROLLBACK):
        return CanaryJudgement(state=previous, outcome=Outcome(previous.outcome))
    started = datetime.strptime(previous.started_at, RFC3339).replace(tzinfo=UTC)
    number = interval_number(
        started.timestamp(), now.timestamp(), duration_seconds(settings.interval)
    )
    if number <= previous.last_interval:
        return CanaryJudgement(state=previous, outcome=_standing(_as_state(previous), settings))
    measured = measurements.get(canary) or Measurement(error="the canary was not measured")
    verdict = judge_interval(
        measured,
        measurements.get(stable) if stable else None,
        stable_has_draft,
        settings,
        tuned=tuned,
    )
    state, outcome = advance(_as_state(previous), number, verdict, settings)
    return CanaryJudgement(
        state=previous.model_copy(
            update={
                "last_interval": state.last_interval,
                "passes_in_a_row": state.passes_in_a_row,
                "failures": state.failures,
                "inconclusive_in_a_row": state.inconclusive_in_a_row,
                "outcome": str(outcome),
                "message": verdict.message,
            }
        ),
        outcome=outcome,
        verdict=verdict,
        measured=measured,
    )
