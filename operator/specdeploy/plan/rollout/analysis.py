"""Canary analysis as pure functions: one verdict per interval, and what a run of them decides.

Conventions (docs/operator.md compares them with Argo Rollouts', Flagger's and OME's):

- A verdict is Pass, Fail or Inconclusive. Inconclusive means the window cannot say: fewer draft
  tokens than `minDraftTokens`, no data, the stable decoded nothing, or the two revisions ran at
  running batch sizes too far apart to compare their latency. When Prometheus could not be asked
  about either revision the interval is an Error, not a verdict: it counts neither for nor
  against the canary, `onInconclusive` does not act on it, and the canary is held (the analysis
  clock pauses) until Prometheus answers or the progress deadline passes. It is never a failure
  and never a pass, so a canary is never promoted on missing data, and never on the absolute
  floor alone when the comparison with the stable could not be made.
- Every figure is exact: counters, and histograms' sums over their counts, never quantiles
  interpolated inside vLLM's buckets (the inter-token latency's first bucket ends at 10 ms, the
  next at 25 ms, which no 10 % bound can resolve).
- Latency is judged per output token, what a user feels: vLLM observes its inter-token latency
  once per engine step of each sequence however many tokens the step emitted, so a speculative
  step is longer than a target-only one and emits more. Time per output token = step time over
  tokens per step, the tokens decoded after each request's first (generation tokens minus
  first tokens) over the steps: the canary's and the stable's over the same window. The step
  time is the median of the window's stretches (one analysis interval each, at most ten): each
  stretch's inter-token latency sum over its count, exact, so a stretch of load that slows one
  revision's machine for less than half the window does not decide, and a slowdown that lasts
  does; with fewer than three stretches, the window's mean. When both revisions ran the same
  probe, each revision's tokens per step come from the probe's identical prompts instead of
  the window's traffic, so a different prompt mix cannot decide (plan/probe.py).
- Fail when any criterion fails, all of them named: first-position acceptance (the share of
  drafts whose first token was accepted, which does not fall with k) below `minAcceptanceRate`;
  acceptance more than `maxDropVsStable` below a stable with a draft (on the probe's prompts
  when both ran it, else on live traffic); time per output token more than
  `maxTimePerOutputTokenIncrease` times the stable's; mean time to first token more than
  `maxTimeToFirstTokenIncrease` times the stable's and more than `timeToFirstTokenTolerance`
  (50 ms) longer; a share of requests that ended in error or
  abort more than `maxErrorRateIncrease` above the stable's, or a share of the API server's
  responses that were 5xx (failures before the engine included; judged from MIN_RESPONSES
  responses, before any volume gate) more than that above. Latency compares only when the two
  running batch sizes (sequences per engine step) are within `maxBatchSizeRatio`; else the
  verdict is Inconclusive.
- A tuned canary (its only change from the stable is the length the autotuner chose) is judged
  by tokens per second per sequence instead (a longer k lowers the acceptance rate even when it
  emits more tokens per second): it fails when they are more than `maxThroughputDrop` below the
  stable's; minAcceptanceRate and the error criterion still apply.
- The canary is rolled back when its failed verdicts reach `failureLimit` (">=", counted over
  the whole canary run, as Flagger counts; Argo Rollouts' `failureLimit` is "more than", so our
  2 is their 1). It is promoted after `promoteAfter` passing verdicts in a row (an Inconclusive
  breaks the row, as a Fail does). On Inconclusive,
  `onInconclusive` decides: Hold keeps judging (and says why) for at most `inconclusiveLimit`
  verdicts in a row, then rolls back so a canary nobody can judge frees its GPUs; Rollback
  rolls back and Promote promotes at once.
- Each interval is judged once: intervals are numbered from the canary's start, and the state
  (kept in the SD's status) remembers the last one judged, so an operator restarted mid-canary
  resumes without counting an interval twice or promoting twice.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from specdeploy.api.config import AnalysisSettings

#: The most stretches a window is cut into for the step time, and the fewest whose median is
#: judged (fewer: the window's mean; the median of two is their mean anyway).
MAX_STRETCHES = 10
MIN_STRETCHES = 3
#: The fewest API responses a window needs before their 5xx share is judged (so one error in a
#: handful of requests does not decide alone).
MIN_RESPONSES = 20


class Result(StrEnum):
    PASS = "Pass"
    FAIL = "Fail"
    INCONCLUSIVE = "Inconclusive"
    #: Could not measure: Prometheus did not answer for one of the two revisions. Not a
    #: verdict on the canary: the analysis clock pauses (see `advance`).
    ERROR = "Error"


class Outcome(StrEnum):
    """What a run of verdicts decides for the canary now."""

    CONTINUE = "Continue"
    HOLD = "Hold"
    PROMOTE = "Promote"
    ROLLBACK = "Rollback"


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    value = numerator / denominator
    return None if math.isnan(value) or math.isinf(value) else value


def running_batch(
    decode_steps: float | None, first_tokens: float | None, engine_steps: float | None
) -> float | None:
    """Running sequences per engine step, exact from counters: each sequence in a step either
    decodes (one inter-token latency observation) or finishes its prefill (one time-to-first-token
    observation), and vLLM observes its iteration-tokens histogram once a step. The canary's
    load comparison and the autotuner's step costs both read this figure."""
    if decode_steps is None:
        return None
    return _ratio(decode_steps + (first_tokens or 0.0), engine_steps)


@dataclass(frozen=True)
class AcceptanceCompared:
    """Two revisions' acceptance, put on the same footing for the drop criterion."""

    mine: float
    theirs: float
    #: Each revision's number of draft positions, when they differ (else both 0: the rates).
    canary_k: int = 0
    stable_k: int = 0

    @property
    def positions(self) -> int | None:
        """The positions both propose, when the two draft a different number of tokens."""
        return min(self.canary_k, self.stable_k) if self.canary_k != self.stable_k else None

    @property
    def over(self) -> str:
        """What the figures were taken over, for a verdict's message ("" for the rates)."""
        if self.positions is None:
            return ""
        first = (
            "the first position" if self.positions == 1 else f"the first {self.positions} positions"
        )
        return f" over {first} (the canary drafts {self.canary_k}, the stable {self.stable_k})"


def acceptance_compared(
    rate: float,
    their_rate: float,
    per_position: Sequence[float],
    their_per_position: Sequence[float],
) -> AcceptanceCompared:
    """The canary's and the stable's acceptance as the drop criterion compares them.

    With the same number of speculative tokens, each revision's acceptance rate. With another
    number, the rates are not alike: a later position is accepted only when every one before it
    was, so a longer k has a lower rate for the very same draft, even while it emits more
    tokens per step. Position i's acceptance (accepted at i over drafts) does not depend on how
    many positions follow it, so the two are compared on the mean over the positions both
    propose. Without per-position figures for both, the rates."""
    shared = min(len(per_position), len(their_per_position))
    if shared == 0 or len(per_position) == len(their_per_position):
        return AcceptanceCompared(rate, their_rate)
    return AcceptanceCompared(
        sum(per_position[:shared]) / shared,
        sum(their_per_position[:shared]) / shared,
        len(per_position),
        len(their_per_position),
    )


def first_position_acceptance(per_position: Sequence[float], rate: float | None) -> float | None:
    """The share of drafts whose first token was accepted: the acceptance floors' figure.

    The acceptance rate (accepted over draft tokens) is the mean over the positions of each
    one's cumulative acceptance, so it falls as k grows for the very same draft, while the
    tokens a step emits rise (k=3 at 0.7 a token reads 0.51 and is 1.7x faster than no draft).
    The first position's acceptance does not depend on k, nor on a schedule's shorter drafts
    (every draft has a first token), and it is never below the rate: a floor that passed the
    rate passes it. Without per-position figures (k=1, where the two are one), the rate."""
    return per_position[0] if per_position else rate


def acceptance_by_position(accepted: Sequence[float], drafts: float | None) -> tuple[float, ...]:
    """Accepted tokens at each draft position over the drafts: the share of drafts whose first
    i+1 tokens were all accepted (none without drafts)."""
    return tuple(a / drafts for a in accepted) if drafts else ()


@dataclass(frozen=True)
class Measurement:
    """What Prometheus counted of one revision's pods over one window: counters, and
    histograms' sums and counts (no quantile), each summed over the revision's pods."""

    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    draft_tokens: float = 0.0
    #: Accepted per draft by position (0-based), as many positions as the pods' k: the share of
    #: drafts whose first i+1 tokens were all accepted.
    acceptance_per_position: tuple[float, ...] = ()
    #: Sum and count of vLLM's inter-token latency: one observation per engine step of each
    #: running sequence (after its first token), whatever the tokens the step emitted.
    step_seconds_sum: float | None = None
    steps: float | None = None
    #: Tokens generated (vllm:generation_tokens_total), each request's first token included.
    output_tokens: float | None = None
    #: Sum and count of the time to first token: one observation per request.
    first_token_seconds_sum: float | None = None
    first_tokens: float | None = None
    #: Engine steps (vllm:iteration_tokens_total's count).
    engine_steps: float | None = None
    #: Requests that finished in the window (vllm:request_success_total), and those of them
    #: whose finished_reason was error or abort.
    finished: float | None = None
    failed: float | None = None
    #: Responses of vLLM's API server in the window (http_requests_total), and those of them
    #: with a 5xx status: what users saw, failures before the engine included.
    responses: float | None = None
    server_errors: float | None = None
    #: The mean decode step time of each stretch of the window (the window cut into stretches of
    #: one analysis interval each, at most MAX_STRETCHES, newest first), where the stretch held
    #: steps: each stretch's inter-token latency sum over its count.
    stretch_step_seconds: tuple[float, ...] = ()
    #: The time per output token of each stretch, where it decoded tokens: each stretch's
    #: inter-token latency sum over the tokens it decoded (its own tokens per step).
    stretch_time_per_output_token: tuple[float, ...] = ()
    #: Set when a query failed (Prometheus unreachable, a bad answer).
    error: str | None = None

    @property
    def first_position_acceptance(self) -> float | None:
        """The share of drafts whose first token was accepted (see first_position_acceptance)."""
        return first_position_acceptance(self.acceptance_per_position, self.acceptance_rate)

    @property
    def mean_step_seconds(self) -> float | None:
        """Mean decode step time of a sequence over the whole window."""
        return _ratio(self.step_seconds_sum, self.steps)

    @property
    def step_seconds(self) -> float | None:
        """The decode step time as judged: the median of the stretches' mean step times when
        the window held at least MIN_STRETCHES of them, so that a stretch of load on one
        revision's machine shorter than half the window does not decide alone; else the whole
        window's mean."""
        if len(self.stretch_step_seconds) >= MIN_STRETCHES:
            return statistics.median(self.stretch_step_seconds)
        return self.mean_step_seconds

    @property
    def decode_tokens(self) -> float | None:
        """Tokens decoded after each request's first (the first comes out of the prefill)."""
        if self.output_tokens is None:
            return None
        return max(0.0, self.output_tokens - (self.first_tokens or 0.0))

    @property
    def tokens_per_step(self) -> float | None:
        """Tokens a sequence gets from one decode step: 1 without speculation, the mean
        acceptance length with it (exactly, whatever the schedule of k)."""
        found = _ratio(self.decode_tokens, self.steps)
        return found if found is not None else self.mean_acceptance_length

    @property
    def time_per_output_token(self) -> float | None:
        """Decode time per decoded token, the latency a user feels per token: the median of
        the stretches' own (each its decode time over its tokens decoded) when the window held
        at least MIN_STRETCHES of them, as the step time is judged; else the whole window's
        decode time over its tokens decoded. Never one stretch's step time over the whole
        window's tokens per step: where the tokens per step move over the window (a schedule
        of k, a changing mix) that mixes two regimes."""
        if len(self.stretch_time_per_output_token) >= MIN_STRETCHES:
            return statistics.median(self.stretch_time_per_output_token)
        return _ratio(self.mean_step_seconds, self.tokens_per_step)

    @property
    def time_to_first_token(self) -> float | None:
        return _ratio(self.first_token_seconds_sum, self.first_tokens)

    @property
    def batch_size(self) -> float | None:
        """Running sequences per engine step over the window (decode and prefill alike)."""
        return running_batch(self.steps, self.first_tokens, self.engine_steps)

    @property
    def error_rate(self) -> float | None:
        return _ratio(self.failed or 0.0, self.finished)

    @property
    def server_error_rate(self) -> float | None:
        """The share of the API server's responses that were 5xx."""
        return _ratio(self.server_errors or 0.0, self.responses)


def _stretches(measured: Measurement) -> str:
    found = measured.stretch_step_seconds
    if len(found) < MIN_STRETCHES:
        return ""
    return f" (median {(measured.step_seconds or 0) * 1000:.1f} ms of {len(found)} stretches)"


def describe_measurement(measured: Measurement) -> str:
    """One line of every figure of a measurement, "n/a" where Prometheus gave none."""
    if measured.error is not None:
        return f"no answer: {measured.error}"

    def shown(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value * scale:.{digits}f}{unit}"

    return (
        f"acceptance {shown(measured.acceptance_rate)}, {measured.draft_tokens:,.0f} draft "
        f"tokens, {shown(measured.tokens_per_step)} tokens a step, mean step "
        f"{shown(measured.mean_step_seconds, ' ms', 1000, 1)}{_stretches(measured)}, "
        f"{shown(measured.time_per_output_token, ' ms', 1000, 2)} per token, first token "
        f"{shown(measured.time_to_first_token, ' ms', 1000, 1)}, batch "
        f"{shown(measured.batch_size)}, errors {shown(measured.error_rate, '%', 100, 1)}"
    )


def tokens_per_second(measured: Measurement, tokens_per_step: float | None = None) -> float | None:
    """Tokens one sequence gets per second while decoding: tokens per step (the window's, or
    the probe's when given) over the mean step time. None without either figure."""
    per_step = tokens_per_step if tokens_per_step is not None else measured.tokens_per_step
    return _ratio(per_step, measured.step_seconds)


@dataclass(frozen=True)
class ProbeTokens:
    """Tokens per decode step of each revision on the probe's identical prompts: given when
    both revisions ran the same complete probe (plan/probe.py)."""

    canary: float
    stable: float


@dataclass(frozen=True)
class IntervalVerdict:
    result: Result
    message: str
    #: The figures the verdict compared, for its record (None where not measured).
    time_per_output_token: float | None = None
    stable_time_per_output_token: float | None = None


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def _volume(canary: Measurement, has_draft: bool) -> tuple[float, str]:
    if has_draft:
        return canary.draft_tokens, f"{canary.draft_tokens:,.0f} draft tokens"
    tokens = canary.decode_tokens or 0.0
    return tokens, f"{tokens:,.0f} tokens"


def _stable_problem(stable: Measurement) -> str | None:
    """Why the stable's figures cannot be compared with, or None."""
    if stable.error is not None:
        return f"the stable's figures could not be read: {stable.error}"
    if not stable.steps or not stable.decode_tokens:
        return "the stable decoded nothing in the window: nothing to compare with"
    return None


def judge_interval(
    canary: Measurement,
    stable: Measurement | None,
    stable_has_draft: bool,
    criteria: AnalysisSettings,
    *,
    tuned: bool = False,
    canary_has_draft: bool = True,
    probe: ProbeTokens | None = None,
) -> IntervalVerdict:
    """The verdict on one window of the canary, beside the stable revision's measurement over
    the same window (None: there is no stable revision, so nothing to compare with).

    `tuned`: the canary differs from the stable only by the autotuned length, so it is judged by
    tokens per second against the stable's. `probe`: both ran the same probe, whose tokens per
    step compare the two on identical prompts (and the acceptance drop was judged there).
    """
    if canary.error is not None:
        return IntervalVerdict(Result.ERROR, f"metrics unavailable: {canary.error}")
    # Judged before any volume gate: a canary whose API answers 5xx before its engine runs
    # (a chat template that raises) drafts nothing, and must not sit Inconclusive for that.
    server = _judge_server_errors(
        canary, stable if stable is not None and stable.error is None else None, criteria
    )
    volume, tokens = _volume(canary, canary_has_draft)
    if volume < criteria.min_draft_tokens or (canary_has_draft and canary.acceptance_rate is None):
        if server.failure:
            return IntervalVerdict(Result.FAIL, server.failure)
        return IntervalVerdict(
            Result.INCONCLUSIVE,
            f"{tokens} in the window, fewer than the {criteria.min_draft_tokens:,} a verdict needs",
        )
    failures: list[str] = []
    rate = canary.acceptance_rate
    first = canary.first_position_acceptance
    if canary_has_draft and first is not None and first < criteria.min_acceptance_rate:
        failures.append(
            f"first-position acceptance {first:.2f} < {criteria.min_acceptance_rate:.2f} "
            f"over {tokens}"
        )
    if server.failure:
        failures.append(server.failure)
    problem = _stable_problem(stable) if stable is not None else None
    if problem is not None:
        # Never a pass on the floor alone: without the stable's figures nothing was compared.
        verdict = "; ".join([*failures, problem]) if failures else problem
        unread = stable is not None and stable.error is not None
        return IntervalVerdict(
            Result.FAIL if failures else Result.ERROR if unread else Result.INCONCLUSIVE, verdict
        )

    errors = _judge_errors(canary, stable, criteria)
    if errors.failure:
        failures.append(errors.failure)
    if tuned:
        return _judge_throughput(
            canary, stable, tokens, criteria=criteria, failures=failures, errors=errors, probe=probe
        )
    if (
        stable is not None
        and probe is None
        and stable_has_draft
        and stable.acceptance_rate is not None
        and rate is not None
    ):
        compared = acceptance_compared(
            rate,
            stable.acceptance_rate,
            canary.acceptance_per_position,
            stable.acceptance_per_position,
        )
        drop = compared.theirs - compared.mine
        if drop > criteria.max_drop_vs_stable:
            failures.append(
                f"acceptance {compared.mine:.2f}{compared.over} is {drop:.2f} below the stable's "
                f"{compared.theirs:.2f} (more than {criteria.max_drop_vs_stable:.2f})"
            )
    latency = _judge_latency(canary, stable, criteria, probe)
    failures += latency.failures
    mine, theirs = latency.per_token
    if failures:
        return IntervalVerdict(Result.FAIL, "; ".join(failures), mine, theirs)
    missing = [m for m in (errors.missing, latency.missing) if m]
    if missing:
        return IntervalVerdict(Result.INCONCLUSIVE, "; ".join(missing), mine, theirs)
    head = (
        f"acceptance {rate:.2f} (mean length {canary.tokens_per_step or 0:.2f}) over {tokens}"
        if canary_has_draft and rate is not None
        else f"{tokens} decoded"
    )
    return IntervalVerdict(
        Result.PASS,
        "; ".join([head, *latency.figures, *errors.figures, *server.figures]),
        mine,
        theirs,
    )


@dataclass(frozen=True)
class _Judged:
    """One criterion's findings: a failure, why it could not be judged, its figures."""

    failure: str | None = None
    missing: str | None = None
    figures: tuple[str, ...] = ()


def _judge_errors(
    canary: Measurement, stable: Measurement | None, criteria: AnalysisSettings
) -> _Judged:
    mine = canary.error_rate
    if mine is None:
        return _Judged(missing="no request of the canary finished in the window")
    theirs = (stable.error_rate if stable is not None else None) or 0.0
    finished = f"{canary.finished:,.0f} requests" if canary.finished else "no request"
    figure = f"errors {mine:.1%} of {finished} vs the stable's {theirs:.1%}"
    return _share_above(figure, mine - theirs, criteria)


def _share_above(figure: str, increase: float, criteria: AnalysisSettings) -> _Judged:
    """An error share's finding: a failure when it is more than `maxErrorRateIncrease` above
    the stable's, else its figure."""
    if increase > criteria.max_error_rate_increase:
        return _Judged(failure=f"{figure} (more than {criteria.max_error_rate_increase:.0%} above)")
    return _Judged(figures=(figure,))


def _judge_server_errors(
    canary: Measurement, stable: Measurement | None, criteria: AnalysisSettings
) -> _Judged:
    """The share of the API server's responses that were 5xx, against the stable's (0 when its
    figures are missing): what users saw, the failures that never reached the engine (a chat
    template that raises, an overload) included. Not judged below MIN_RESPONSES responses."""
    mine = canary.server_error_rate
    if mine is None or (canary.responses or 0.0) < MIN_RESPONSES:
        return _Judged()
    theirs = (stable.server_error_rate if stable is not None else None) or 0.0
    figure = (
        f"HTTP 5xx {mine:.1%} of {canary.responses or 0:,.0f} responses vs the stable's "
        f"{theirs:.1%}"
    )
    return _share_above(figure, mine - theirs, criteria)


@dataclass(frozen=True)
class _Latency:
    failures: list[str]
    missing: str | None
    figures: tuple[str, ...]
    #: (the canary's, the stable's) time per output token as compared.
    per_token: tuple[float | None, float | None]


def _per_token(measured: Measurement, tokens_per_step: float | None) -> float | None:
    if tokens_per_step is None:
        return measured.time_per_output_token
    return _ratio(measured.step_seconds, tokens_per_step)


def _loads_apart(canary: Measurement, stable: Measurement, bound: float) -> str | None:
    mine, theirs = canary.batch_size, stable.batch_size
    if mine is None or theirs is None:
        # Fail closed: loads that cannot be compared (vLLM's iteration histogram dropped by a
        # relabeling, say) are not loads alike.
        which = "the canary's" if mine is None else "the stable's"
        return f"latency not compared: {which} running batch was not measured"
    if max(mine, theirs) > bound * min(mine, theirs):
        return (
            f"latency not compared: running batch {mine:.2f} vs the stable's {theirs:.2f} "
            f"(more than {bound:.2f}x apart)"
        )
    return None


def _judge_latency(
    canary: Measurement,
    stable: Measurement | None,
    criteria: AnalysisSettings,
    probe: ProbeTokens | None,
) -> _Latency:
    mine = _per_token(canary, probe.canary if probe else None)
    if stable is None:
        return _Latency([], None, (), (mine, None))
    theirs = _per_token(stable, probe.stable if probe else None)
    apart = _loads_apart(canary, stable, criteria.max_batch_size_ratio)
    if apart is not None:
        return _Latency([], apart, (), (mine, theirs))
    failures: list[str] = []
    figures: list[str] = []
    missing: list[str] = []
    on = " on the probe's tokens per step" if probe else ""
    stretches = (
        min(len(canary.stretch_step_seconds), len(stable.stretch_step_seconds))
        if probe
        else min(
            len(canary.stretch_time_per_output_token), len(stable.stretch_time_per_output_token)
        )
    )
    if stretches >= MIN_STRETCHES:
        on += f", the median{' step' if probe else ''} of {stretches} stretches"
    per_token = _ratio(mine, theirs)
    if mine is None or theirs is None or per_token is None:
        missing.append("time per output token not measured on both revisions")
    else:
        figure = f"{_ms(mine)} per token vs the stable's {_ms(theirs)} ({per_token:.2f}x{on})"
        if per_token > criteria.max_time_per_output_token_increase:
            failures.append(
                f"time per output token {_ms(mine)} is {per_token:.2f}x the stable's "
                f"{_ms(theirs)}{on} (more than {criteria.max_time_per_output_token_increase:.2f}x)"
            )
        else:
            figures.append(figure)
    first, their_first = canary.time_to_first_token, stable.time_to_first_token
    first_ratio = _ratio(first, their_first)
    if first is None or their_first is None or first_ratio is None:
        missing.append("time to first token not measured on both revisions")
    elif (
        first_ratio > criteria.max_time_to_first_token_increase
        and first - their_first > duration_seconds(criteria.time_to_first_token_tolerance)
    ):
        failures.append(
            f"time to first token {_ms(first)} is {first_ratio:.2f}x the stable's "
            f"{_ms(their_first)} (more than {criteria.max_time_to_first_token_increase:.2f}x "
            f"and {criteria.time_to_first_token_tolerance} longer)"
        )
    else:
        figures.append(f"first token {_ms(first)} vs {_ms(their_first)} ({first_ratio:.2f}x)")
    return _Latency(failures, "; ".join(missing) or None, tuple(figures), (mine, theirs))


def _judge_throughput(
    canary: Measurement,
    stable: Measurement | None,
    tokens: str,
    *,
    criteria: AnalysisSettings,
    failures: list[str],
    errors: _Judged,
    probe: ProbeTokens | None,
) -> IntervalVerdict:
    mine = tokens_per_second(canary, probe.canary if probe else None)
    theirs = (
        tokens_per_second(stable, probe.stable if probe else None) if stable is not None else None
    )
    per_token = (_ratio(1.0, mine), _ratio(1.0, theirs))
    if failures:
        return IntervalVerdict(Result.FAIL, "tuned revision: " + "; ".join(failures), *per_token)
    if mine is None or theirs is None:
        missing = "the canary's" if mine is None else "the stable's"
        return IntervalVerdict(
            Result.INCONCLUSIVE,
            f"tuned revision: {missing} tokens per second (tokens per step / mean step time) "
            "were not measured",
            *per_token,
        )
    apart = _loads_apart(canary, stable, criteria.max_batch_size_ratio) if stable else None
    if apart is not None:
        return IntervalVerdict(Result.INCONCLUSIVE, f"tuned revision: {apart}", *per_token)
    change = mine / theirs - 1
    figures = f"{mine:.1f} tokens/s per sequence vs the stable's {theirs:.1f} ({change:+.1%})"
    if change < -criteria.max_throughput_drop:
        return IntervalVerdict(
            Result.FAIL,
            f"tuned revision: {figures}, more than {criteria.max_throughput_drop:.0%} slower",
            *per_token,
        )
    if errors.missing:
        return IntervalVerdict(
            Result.INCONCLUSIVE, f"tuned revision: {figures}; {errors.missing}", *per_token
        )
    return IntervalVerdict(
        Result.PASS, f"tuned revision: {figures} over {tokens}; {errors.figures[0]}", *per_token
    )


@dataclass(frozen=True)
class AnalysisState:
    """A canary's analysis so far; lives in the SD's status so restarts resume it."""

    #: The number of the last interval judged (-1: none yet).
    last_interval: int = -1
    passes_in_a_row: int = 0
    failures: int = 0
    inconclusive_in_a_row: int = 0
    #: Intervals in a row Prometheus could not be asked about (Error): the clock paused.
    errors_in_a_row: int = 0


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
        return state, standing(state, criteria)
    if verdict.result == Result.ERROR:
        # Could not measure is not a verdict: nothing counts, neither for the canary nor
        # against it, and no policy acts on it; the progress deadline bounds a long outage.
        state = replace(state, last_interval=interval, errors_in_a_row=state.errors_in_a_row + 1)
    elif verdict.result == Result.PASS:
        state = replace(
            state,
            last_interval=interval,
            passes_in_a_row=state.passes_in_a_row + 1,
            inconclusive_in_a_row=0,
            errors_in_a_row=0,
        )
    elif verdict.result == Result.FAIL:
        state = replace(
            state,
            last_interval=interval,
            passes_in_a_row=0,
            failures=state.failures + 1,
            inconclusive_in_a_row=0,
            errors_in_a_row=0,
        )
    else:
        # "In a row": a window that could not say breaks the run of passes, so passes off-peak
        # on either side of peak-time Inconclusives never add up to a promotion.
        state = replace(
            state,
            last_interval=interval,
            passes_in_a_row=0,
            inconclusive_in_a_row=state.inconclusive_in_a_row + 1,
            errors_in_a_row=0,
        )
    return state, standing(state, criteria)


def standing(state: AnalysisState, criteria: AnalysisSettings) -> Outcome:
    """What the verdicts counted so far decide."""
    if state.failures >= criteria.failure_limit:
        return Outcome.ROLLBACK
    if state.passes_in_a_row >= criteria.promote_after:
        return Outcome.PROMOTE
    if state.errors_in_a_row > 0:
        return Outcome.HOLD
    if state.inconclusive_in_a_row > 0:
        if criteria.on_inconclusive == "Rollback":
            return Outcome.ROLLBACK
        if criteria.on_inconclusive == "Promote":
            return Outcome.PROMOTE
        if state.inconclusive_in_a_row >= criteria.inconclusive_limit:
            return Outcome.ROLLBACK
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


def live_window(window: str, started_seconds: float | None, now_seconds: float) -> str:
    """The range a verdict reads: the analysis `window`, cut at the live analysis' start, so a
    canary's window never reaches back to its probe or its warm-up (both revisions are read
    over the same range, so they stay paired)."""
    full = duration_seconds(window)
    if started_seconds is None:
        return window
    since = math.floor(now_seconds - started_seconds)
    return window if since >= full or since <= 0 else f"{since}s"
