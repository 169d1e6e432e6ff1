"""The speculation-length autotuner as pure functions (docs/autotune.md has the reasoning).

The model, for one sequence of the serving revision:

- vLLM counts, per draft position i (0-based), the drafts whose first i+1 tokens were all
  accepted (`vllm:spec_decode_num_accepted_tokens_per_pos_total`), and the drafts themselves
  (`vllm:spec_decode_num_drafts_total`). Their ratio a_i is the probability that a step gets
  at least i+1 draft tokens accepted, so a step with k speculative tokens emits
  E(k) = 1 + a_0 + ... + a_{k-1} tokens on average (the 1 is the target's own token).
- A step with k speculative tokens costs t0 * (1 + r*k): t0 is a decode step without
  speculation, r the cost of proposing and verifying one more token relative to it. The step
  time at the served k is measured (mean inter-token latency: vLLM observes it once per step),
  so t0 follows from r; r comes from the spec, else from the step times measured at two or
  more lengths (a straight-line fit), else from the operator's configured default.
- Tokens per second at k are E(k) / (t0 * (1 + r*k)). The length between minTokens and
  maxTokens that maximises it is recommended when it beats the served length by minGain.

The batch dimension (a schedule, spec.pair.draft.autotune.schedule Auto): a step at running
batch b with k speculative tokens costs T(b, k) = F * (1 + r*k) + B * b * (k + 1). F is the part
no larger batch adds to (reading the weights, launching the step: the target once, the draft k
times at relative cost r); B the cost of one token the target verifies, b*(k+1) of them a step.
With B = 0 this is the single-k model above. F and B are fitted (least squares, r fixed) from
the step times recorded at two or more batch sizes; per batch-size range (powers of two up to
engine.maxNumSeqs) the k with the most tokens per second at the range's largest batch is
chosen, since a larger batch only makes each extra token dearer. Under a schedule the pods'
per-position counters are sized to its largest k while smaller batches draft fewer: the later
positions then count drafts that could not reach them, which underestimates them (the safe side).

Positions beyond the served k have no data from the serving pods. When a longer k of the same
pair has served (a tuned revision under trial, promoted or rolled back), its counters measured
those positions: the served acceptance continues with that measurement's conditional
acceptance per position (continue_acceptance). The acceptance of a position does not depend on
k (a draft proposes the same tokens whatever follows them), so only its level is taken from
the serving pods and the fall-off from the longer measurement. Past every measured position,
conservatively, the conditional acceptance of each
further position (the chance it is accepted once all before it were) is the last measured
one's, never more, times EXTRAPOLATION_DECAY per extra position: the draft's guesses grow
worse the further they look ahead, and an over-long k costs every step.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from specdeploy.api.conditions import Reason
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import (
    AnalysisStatus,
    AutotuneAcceptance,
    AutotuneInputs,
    AutotuneRecommendation,
    AutotuneSpec,
    AutotuneStatus,
    AutotuneStepCost,
    ScheduleStep,
    SpeculativeDeployment,
    SpeculativeDeploymentSpec,
)
from specdeploy.api.times import RFC3339, parse_time
from specdeploy.plan.rollout.analysis import Outcome, duration_seconds
from specdeploy.plan.rollout.revisions import RolloutEvent

#: Each position beyond the measured ones keeps at most this share of the previous
#: position's conditional acceptance.
EXTRAPOLATION_DECAY = 0.9
#: Predicted figures closer than this (relative) are a tie, broken towards the shorter k.
TIE = 1e-9
#: Step costs kept per SD (one per k, the latest).
MAX_STEP_COSTS = 33

#: r when neither the spec nor two measured lengths give it: an EAGLE-style head costs a few
#: per cent of the target per token on a GPU, and verifying one more token at small batch
#: about as much again.
DEFAULT_DRAFT_COST_RATIO = 0.1


# --- the model ---------------------------------------------------------------------------------


def acceptance_by_position(drafts: float, accepted: Sequence[float]) -> list[float]:
    """a_i: the share of drafts with at least i+1 tokens accepted, for each measured position.

    Counters read over a window can be slightly out of step; the result is clamped into [0, 1]
    and made non-increasing, as the probabilities are.
    """
    if drafts <= 0:
        raise ValueError("no drafts: the acceptance per position is unknown")
    rates: list[float] = []
    ceiling = 1.0
    for count in accepted:
        rate = min(max(count / drafts, 0.0), ceiling)
        rates.append(rate)
        ceiling = rate
    return rates


def extend_acceptance(
    rates: Sequence[float], k: int, decay: float = EXTRAPOLATION_DECAY
) -> list[float]:
    """a_0 .. a_{k-1}: the measured rates, then (beyond them) the conservative extrapolation.

    The conditional acceptance of position i is a_i / a_{i-1} (a_{-1} = 1). Each position past
    the last measured one gets the last measured conditional acceptance times `decay` per step
    beyond it, capped at 1.
    """
    if not rates:
        raise ValueError("at least one measured position is needed")
    if k <= len(rates):
        return list(rates[:k])
    before = rates[-2] if len(rates) > 1 else 1.0
    last_conditional = rates[-1] / before if before > 0 else 0.0
    out = list(rates)
    conditional = min(last_conditional, 1.0)
    while len(out) < k:
        conditional *= decay
        out.append(out[-1] * conditional)
    return out


def continue_acceptance(rates: Sequence[float], longer: Sequence[float]) -> list[float]:
    """The measured rates, then each position only `longer` (the same pair at a longer k)
    measured: the previous rate times `longer`'s conditional acceptance there, capped at 1.

    `rates` stays authoritative for its own positions (it is the serving revision's, over
    the latest window); `longer` gives only how acceptance falls off beyond them.
    """
    out = list(rates)
    if not out:
        raise ValueError("at least one measured position is needed")
    for position in range(len(out), len(longer)):
        before = longer[position - 1]
        conditional = min(longer[position] / before, 1.0) if before > 0 else 0.0
        out.append(out[-1] * conditional)
    return out


def expected_tokens_per_step(rates: Sequence[float], k: int) -> float:
    """E(k) = 1 + a_0 + ... + a_{k-1}: tokens one step emits with k speculative tokens."""
    return 1.0 + sum(extend_acceptance(rates, k)) if k > 0 else 1.0


def relative_step_cost(k: int, cost_ratio: float) -> float:
    """A step with k speculative tokens, in decode steps without speculation: 1 + r*k."""
    return 1.0 + cost_ratio * k


def tokens_per_second(
    rates: Sequence[float], k: int, cost_ratio: float, base_step_seconds: float
) -> float:
    """Predicted tokens per second of one sequence at length k."""
    return expected_tokens_per_step(rates, k) / (
        base_step_seconds * relative_step_cost(k, cost_ratio)
    )


def fit_cost_ratio(costs: Sequence[AutotuneStepCost]) -> float | None:
    """r from step times measured at two or more lengths; a negative r (noise) gives 0.

    Step times a trial measured beside the stable over the same window (beside_tokens and
    step_ratio) come first: their ratio rho = T(k_t) / T(k_s) = (1 + r*k_t) /
    (1 + r*k_s) does not depend on t0, so not on the load of that window either. Each pair
    gives r * (k_t - rho*k_s) = rho - 1; r is the least-squares solution over the pairs.
    Without pairs: the least-squares line t = t0 + t0*r*k over the step times of every k, so
    r = slope / intercept; None with fewer than two lengths, or when the line is not a cost
    (a non-positive intercept)."""
    paired = fit_paired_cost_ratio(costs)
    if paired is not None:
        return paired
    points = [(c.num_speculative_tokens, c.step_seconds) for c in costs if c.step_seconds > 0]
    if len({k for k, _ in points}) < 2:
        return None
    n = len(points)
    mean_k = sum(k for k, _ in points) / n
    mean_t = sum(t for _, t in points) / n
    spread = sum((k - mean_k) ** 2 for k, _ in points)
    slope = sum((k - mean_k) * (t - mean_t) for k, t in points) / spread
    intercept = mean_t - slope * mean_k
    if intercept <= 0:
        return None
    return max(slope / intercept, 0.0)


def fit_paired_cost_ratio(costs: Sequence[AutotuneStepCost]) -> float | None:
    """r from the step-time ratios of trials measured beside the stable (see fit_cost_ratio),
    or None when there are none that the model can explain."""
    terms = []
    for c in costs:
        k_t, k_s, rho = c.num_speculative_tokens, c.beside_tokens, c.step_ratio
        if k_s is None or rho is None or rho <= 0 or k_s == k_t:
            continue
        slope = k_t - rho * k_s
        if slope * (k_t - k_s) <= 0:
            # (1 + r*k_t) / (1 + r*k_s) lies between 1 and k_t / k_s for every r >= 0; a
            # ratio beyond k_t / k_s (the longer k's step more than k_t / k_s times the
            # shorter's) no cost ratio explains: the window's noise, not a measurement.
            continue
        terms.append((slope, rho - 1))
    spread = sum(a * a for a, _ in terms)
    if spread <= 1e-12:
        return None
    return max(sum(a * b for a, b in terms) / spread, 0.0)


@dataclass(frozen=True)
class Prediction:
    """The model's answer for one set of inputs."""

    current_tokens: int
    best_tokens: int
    #: Predicted tokens per second of one sequence, by k (min..max, and the current k).
    by_tokens: dict[int, float]
    gain: float
    changed: bool
    message: str


def choose_tokens(
    rates: Sequence[float],
    *,
    current_tokens: int,
    step_seconds: float,
    cost_ratio: float,
    min_tokens: int,
    max_tokens: int,
    min_gain: float,
) -> Prediction:
    """The k in [min_tokens, max_tokens] with the most predicted tokens per second, and
    whether it replaces `current_tokens` (the k that measured `step_seconds`).

    Hysteresis: the current k is kept unless the best one is predicted at least `min_gain`
    faster (relative); a current k outside the bounds is always replaced.
    """
    if min_tokens > max_tokens:
        raise ValueError(f"minTokens {min_tokens} exceeds maxTokens {max_tokens}")
    if step_seconds <= 0:
        raise ValueError("the step time must be positive")
    base = step_seconds / relative_step_cost(current_tokens, cost_ratio)
    candidates = sorted({*range(min_tokens, max_tokens + 1), current_tokens})
    by_tokens = {k: tokens_per_second(rates, k, cost_ratio, base) for k in candidates}
    best = min_tokens
    for k in range(min_tokens, max_tokens + 1):
        if by_tokens[k] > by_tokens[best] * (1 + TIE):
            best = k
    gain = by_tokens[best] / by_tokens[current_tokens] - 1
    in_bounds = min_tokens <= current_tokens <= max_tokens
    figures = f"k={best} {by_tokens[best]:.1f} tok/s vs k={current_tokens} " + (
        f"{by_tokens[current_tokens]:.1f} tok/s ({gain:+.1%})"
    )
    if best == current_tokens:
        return Prediction(current_tokens, best, by_tokens, 0.0, False, f"k={best} is best")
    if in_bounds and gain < min_gain:
        return Prediction(
            current_tokens,
            current_tokens,
            by_tokens,
            gain,
            False,
            f"kept: {figures}, below minGain {min_gain:.0%}",
        )
    return Prediction(current_tokens, best, by_tokens, gain, True, figures)


@dataclass(frozen=True)
class BatchCost:
    """T(b, k) = fixed * (1 + ratio*k) + per_token * b * (k + 1), in seconds."""

    fixed: float
    per_token: float
    ratio: float

    def step_seconds(self, batch: float, k: int) -> float:
        return self.fixed * relative_step_cost(k, self.ratio) + self.per_token * batch * (k + 1)


def _batch_bucket(batch: float | None) -> int:
    """The power-of-two range a batch size falls in (1, 2, 3-4, 5-8, ...): its upper end."""
    if batch is None or batch <= 1:
        return 1
    bound = 1
    while bound < batch - 1e-9:
        bound *= 2
    return bound


def fit_batch_cost(costs: Sequence[AutotuneStepCost], ratio: float) -> BatchCost | None:
    """F and B of T(b, k) by least squares over the recorded step times, r given.

    None when the step times come from fewer than two batch-size ranges (the batch's share
    cannot be told from the draft's then) or when the fit is no cost (F not positive). A
    negative B (noise) is taken as 0: batch size then changes nothing.
    """
    points = [
        (
            relative_step_cost(c.num_speculative_tokens, ratio),
            c.batch_size * (c.num_speculative_tokens + 1),
            c.step_seconds,
        )
        for c in costs
        if c.batch_size is not None and c.batch_size > 0 and c.step_seconds > 0
    ]
    if len({_batch_bucket(c.batch_size) for c in costs if c.batch_size}) < 2:
        return None
    # Normal equations of t = F*x + B*y (no intercept).
    sxx = sum(x * x for x, _, _ in points)
    syy = sum(y * y for _, y, _ in points)
    sxy = sum(x * y for x, y, _ in points)
    sxt = sum(x * t for x, _, t in points)
    syt = sum(y * t for _, y, t in points)
    det = sxx * syy - sxy * sxy
    if det <= 1e-12 * sxx * syy:
        return None
    fixed = (sxt * syy - syt * sxy) / det
    per_token = (sxx * syt - sxy * sxt) / det
    if per_token < 0:
        fixed, per_token = sxt / sxx, 0.0
    if fixed <= 0:
        return None
    return BatchCost(fixed=fixed, per_token=per_token, ratio=ratio)


def batch_ranges(max_num_seqs: int) -> list[tuple[int, int]]:
    """(lo, hi) inclusive: 1, 2, 3-4, 5-8, ... up to max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError("maxNumSeqs must be at least 1")
    ranges, low, high = [], 1, 1
    while low <= max_num_seqs:
        ranges.append((low, min(high, max_num_seqs)))
        low, high = high + 1, high * 2
    return ranges


def choose_schedule(
    rates: Sequence[float],
    cost: BatchCost,
    *,
    min_tokens: int,
    max_tokens: int,
    max_num_seqs: int,
) -> list[tuple[int, int, int, float]]:
    """(lo, hi, k, predicted tokens/s of one sequence at batch hi) per batch-size range, with
    adjacent ranges of the same k merged; vLLM's num_speculative_tokens_per_batch_size is the
    first three of each. Ties go to the shorter k."""
    if min_tokens > max_tokens:
        raise ValueError(f"minTokens {min_tokens} exceeds maxTokens {max_tokens}")
    steps: list[tuple[int, int, int, float]] = []
    for low, high in batch_ranges(max_num_seqs):
        figures = {
            k: expected_tokens_per_step(rates, k) / cost.step_seconds(high, k)
            for k in range(min_tokens, max_tokens + 1)
        }
        best = min_tokens
        for k, value in figures.items():
            if value > figures[best] * (1 + TIE):
                best = k
        if steps and steps[-1][2] == best:
            steps[-1] = (steps[-1][0], high, best, figures[best])
        else:
            steps.append((low, high, best, figures[best]))
    return steps


# --- the measurements --------------------------------------------------------------------------


@dataclass(frozen=True)
class AutotuneMeasurement:
    """What Prometheus says of the serving revision's speculation over one window."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    #: Accepted tokens per position (0-based), as many positions as the pods' k.
    accepted_per_position: tuple[float, ...] = ()
    #: Mean time between a sequence's decode steps (vLLM's inter-token latency).
    step_seconds: float | None = None
    mean_batch_size: float | None = None
    max_batch_size: float | None = None
    error: str | None = None


def spec_fingerprint(spec: SpeculativeDeploymentSpec) -> str:
    """Names the pair and bounds a tuned or rejected length belongs to: when the spec changes
    them, what was learnt of the old pair no longer holds."""
    pair = spec.pair.model_dump(by_alias=True, exclude_none=True, mode="json")
    tune = pair["draft"].pop("autotune", {})
    pair["draft"].pop("shape", None)
    pair["bounds"] = [tune.get("minTokens"), tune.get("maxTokens")]
    canonical = json.dumps(pair, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:10]


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    return parse_time(stamp)


def measurement_due(
    spec: SpeculativeDeploymentSpec,
    previous: AutotuneStatus | None,
    interval: str,
    now: datetime,
) -> bool:
    """Whether this reconcile should measure for a recommendation: autotune is on and the
    last one is at least an analysis interval old."""
    tune = spec.pair.draft.autotune
    if tune is None or tune.mode == "Off":
        return False
    computed = _parse(previous.computed_at if previous else None)
    return computed is None or (now - computed).total_seconds() >= duration_seconds(interval)


def _step_costs(
    previous: Sequence[AutotuneStepCost],
    tokens: int,
    measured: AutotuneMeasurement,
    beside: tuple[int, float] | None = None,
) -> list[AutotuneStepCost]:
    # One step time per k and batch-size range (the latest): the schedule's fit needs several.
    # `beside`: the stable's k and step time over the same window (a trial's measurement); a
    # ratio measured so stays with its k and range when the k is measured again alone.
    bucket = _batch_bucket(measured.mean_batch_size)
    same = [
        c
        for c in previous
        if c.num_speculative_tokens == tokens and _batch_bucket(c.batch_size) == bucket
    ]
    kept = [c for c in previous if c not in same]
    pair = (same[0].beside_tokens, same[0].step_ratio) if same else (None, None)
    if measured.step_seconds is not None and measured.step_seconds > 0:
        if beside is not None and beside[1] > 0 and beside[0] != tokens:
            pair = (beside[0], round(measured.step_seconds / beside[1], 4))
        kept.append(
            AutotuneStepCost(
                num_speculative_tokens=tokens,
                step_seconds=round(measured.step_seconds, 6),
                batch_size=_rounded(measured.mean_batch_size),
                beside_tokens=pair[0],
                step_ratio=pair[1],
            )
        )
    else:
        kept += same
    return sorted(kept, key=lambda c: (c.num_speculative_tokens, c.batch_size or 0))[
        :MAX_STEP_COSTS
    ]


def _cost_ratio(
    tune: AutotuneSpec, costs: Sequence[AutotuneStepCost], default: float
) -> tuple[float, str]:
    if tune.draft_cost_ratio is not None:
        return tune.draft_cost_ratio, "Spec"
    fitted = fit_cost_ratio(costs)
    if fitted is not None:
        return fitted, "Measured"
    return default, "OperatorDefault"


def recommend(
    tune: AutotuneSpec,
    previous: AutotuneStatus | None,
    *,
    revision: str,
    served_tokens: int,
    measured: AutotuneMeasurement,
    window: str,
    min_draft_tokens: int,
    default_cost_ratio: float,
    now: datetime,
    max_num_seqs: int | None = None,
) -> AutotuneStatus:
    """The status with a new recommendation from `measured` (the serving revision, at k =
    `served_tokens`), or with the reason there is none; the rest of `previous` is kept."""
    state = previous or AutotuneStatus()
    stamp = now.strftime(RFC3339)
    if measured.error is not None:
        return state.model_copy(
            update={"computed_at": stamp, "message": f"metrics unavailable: {measured.error}"}
        )
    costs = _step_costs(state.inputs.step_costs if state.inputs else [], served_tokens, measured)
    longest = state.inputs.longest_acceptance if state.inputs else None
    ratio, source = _cost_ratio(tune, costs, default_cost_ratio)
    inputs = AutotuneInputs(
        revision=revision,
        num_speculative_tokens=served_tokens,
        window=window,
        drafts=round(measured.drafts, 1),
        draft_tokens=round(measured.draft_tokens, 1),
        acceptance_per_position=[],
        mean_batch_size=_rounded(measured.mean_batch_size),
        max_batch_size=_rounded(measured.max_batch_size),
        step_costs=costs,
        longest_acceptance=longest,
        draft_cost_ratio=round(ratio, 4),
        draft_cost_source=source,
    )
    short = None
    if measured.draft_tokens < min_draft_tokens or measured.drafts <= 0:
        short = (
            f"{measured.draft_tokens:,.0f} draft tokens in {window}, fewer than the "
            f"{min_draft_tokens:,} a recommendation needs"
        )
    elif not measured.accepted_per_position:
        short = "no per-position acceptance measured"
    elif measured.step_seconds is None or measured.step_seconds <= 0:
        short = "no inter-token latency measured"
    if short is not None:
        return state.model_copy(update={"computed_at": stamp, "message": short, "inputs": inputs})
    rates = acceptance_by_position(measured.drafts, measured.accepted_per_position)
    assert measured.step_seconds is not None
    served = _acceptance(revision, served_tokens, measured.drafts, rates)
    longest = _longer(longest, served)
    model_rates = rates
    if longest is not served:
        model_rates = continue_acceptance(rates, longest.acceptance_per_position)
    prediction = choose_tokens(
        model_rates,
        current_tokens=served_tokens,
        step_seconds=measured.step_seconds,
        cost_ratio=ratio,
        min_tokens=tune.min_tokens,
        max_tokens=tune.max_tokens,
        min_gain=tune.min_gain,
    )
    if len(model_rates) > len(rates):
        prediction = replace(
            prediction,
            message=f"{prediction.message}; {_positions(len(rates), len(model_rates) - 1)} "
            f"from k={longest.num_speculative_tokens}'s acceptance ({longest.revision})",
        )
    schedule, schedule_message = _recommend_schedule(
        tune, model_rates, costs, ratio, max_num_seqs=max_num_seqs, single=prediction.best_tokens
    )
    calibrate = (
        calibration_tokens(
            tune,
            state,
            served_tokens=served_tokens,
            costs=costs,
            source=source,
            prediction=prediction,
        )
        if schedule is None
        else None
    )
    if calibrate is not None:
        served_rate = prediction.by_tokens[served_tokens]
        prediction = replace(
            prediction,
            best_tokens=calibrate,
            gain=prediction.by_tokens[calibrate] / served_rate - 1 if served_rate > 0 else 0.0,
            changed=True,
            message=(
                f"calibration: the draft's cost ratio is not measured (operator default "
                f"{ratio:g}); k={calibrate} is served once through the canary to measure its "
                f"step time ({prediction.message})"
            ),
        )
    return state.model_copy(
        update={
            "computed_at": stamp,
            "message": "",
            "inputs": inputs.model_copy(
                update={
                    "acceptance_per_position": [round(a, 4) for a in rates],
                    "longest_acceptance": longest,
                }
            ),
            "recommendation": AutotuneRecommendation(
                num_speculative_tokens=prediction.best_tokens,
                predicted_gain=round(prediction.gain, 4),
                predicted_tokens_per_second=round(prediction.by_tokens[prediction.best_tokens], 2),
                changed=prediction.changed,
                message=prediction.message,
                calibration=calibrate is not None,
                schedule=schedule,
                schedule_message=schedule_message,
            ),
        }
    )


def _positions(first: int, last: int) -> str:
    return f"position {first}" if first == last else f"positions {first}-{last}"


def _acceptance(
    revision: str, tokens: int, drafts: float, rates: Sequence[float]
) -> AutotuneAcceptance:
    return AutotuneAcceptance(
        revision=revision,
        num_speculative_tokens=tokens,
        drafts=round(drafts, 1),
        acceptance_per_position=[round(a, 4) for a in rates],
    )


def _longer(kept: AutotuneAcceptance | None, new: AutotuneAcceptance) -> AutotuneAcceptance:
    """The measurement with more positions; the newer one when they have as many."""
    if kept is None or len(new.acceptance_per_position) >= len(kept.acceptance_per_position):
        return new
    return kept


def calibration_tokens(
    tune: AutotuneSpec,
    state: AutotuneStatus,
    *,
    served_tokens: int,
    costs: Sequence[AutotuneStepCost],
    source: str,
    prediction: Prediction,
) -> int | None:
    """The neighbouring k to serve once so the draft's cost ratio gets measured, or None.

    Only in mode Apply, while the ratio is the operator's default (no draftCostRatio in the
    spec, step times of fewer than two lengths), and when the model would keep the served k
    (no other k predicted minGain faster):
    from one length alone it cannot tell a cheap draft from a costly one, so without this it
    could keep a k forever on the default's say-so. Of k-1 and k+1 (within minTokens..maxTokens,
    not measured, not rejected) the one the model predicts faster."""
    moves = prediction.changed and prediction.gain >= tune.min_gain
    if tune.mode != "Apply" or source != "OperatorDefault" or moves:
        return None
    measured = {c.num_speculative_tokens for c in costs}
    candidates = [
        k
        for k in (served_tokens - 1, served_tokens + 1)
        if tune.min_tokens <= k <= tune.max_tokens
        and k not in measured
        and k not in state.rejected_tokens
        and k in prediction.by_tokens
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda k: prediction.by_tokens[k])


def _recommend_schedule(
    tune: AutotuneSpec,
    rates: Sequence[float],
    costs: Sequence[AutotuneStepCost],
    ratio: float,
    *,
    max_num_seqs: int | None,
    single: int,
) -> tuple[list[ScheduleStep] | None, str]:
    """The batch-size schedule (schedule Auto), or None and why not. A schedule whose ranges
    all get the same k is none: numSpeculativeTokens says as much."""
    if tune.schedule != "Auto":
        return None, ""
    if max_num_seqs is None:
        return None, "no schedule: it needs spec.engine.maxNumSeqs"
    cost = fit_batch_cost(costs, ratio)
    if cost is None:
        return None, (
            "no schedule yet: it needs step times measured at two or more batch-size ranges "
            "(1, 2, 3-4, 5-8, ...)"
        )
    steps = choose_schedule(
        rates,
        cost,
        min_tokens=tune.min_tokens,
        max_tokens=tune.max_tokens,
        max_num_seqs=max_num_seqs,
    )
    fit = (
        f"step = {cost.fixed * 1000:.2f} ms x (1 + {ratio:.3g}k) "
        f"+ {cost.per_token * 1000:.3f} ms x b(k+1)"
    )
    if len(steps) == 1:
        return None, f"no schedule: k={steps[0][2]} is best at every batch size ({fit})"
    ranges = ", ".join(f"b {lo}-{hi}: k={k} {tps:.1f} tok/s" for lo, hi, k, tps in steps)
    if single not in {k for _, _, k, _ in steps}:
        ranges += f" (single k={single})"
    return [ScheduleStep(max_batch_size=hi, tokens=k) for _, hi, k, _ in steps], f"{ranges}; {fit}"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


# --- the decision ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tuning:
    """What the autotuner decided this reconcile: the status to keep, the k to serve instead
    of the spec's (None: the spec's), and the Events."""

    state: AutotuneStatus | None
    tokens: int | None = None
    schedule: tuple[ScheduleStep, ...] | None = None
    events: tuple[RolloutEvent, ...] = field(default_factory=tuple)


#: The revision a spec with k and a schedule (or None) tuned in would be.
RevisionFor = Callable[[int, Sequence[ScheduleStep] | None], str | None]


def schedule_key(schedule: Sequence[ScheduleStep]) -> str:
    """A schedule as one string (b<=max:k,...), the form rejected schedules are kept in."""
    return ",".join(f"b<={s.max_batch_size}:{s.tokens}" for s in schedule)


def tuned_spec(
    spec: SpeculativeDeploymentSpec,
    tokens: int | None,
    schedule: Sequence[ScheduleStep] | None = None,
) -> SpeculativeDeploymentSpec:
    """The spec the pods are built from as far as autotuning goes: the tuned k in place of
    numSpeculativeTokens, a tuned schedule as spec.pair.draft.schedule (numSpeculativeTokens
    then its largest k), and no autotune block (its settings are not part of the pods, so a
    change of mode or bounds is no new revision)."""
    draft = spec.pair.draft
    if draft.autotune is None and tokens is None and not schedule:
        return spec
    update: dict[str, object] = {"autotune": None}
    if tokens is not None and draft.method != "none":
        update["num_speculative_tokens"] = tokens
    if schedule and draft.method != "none":
        update["schedule"] = list(schedule)
        update["num_speculative_tokens"] = max(s.tokens for s in schedule)
    pair = spec.pair.model_copy(update={"draft": draft.model_copy(update=update)})
    return spec.model_copy(update={"pair": pair})


def record_trial(
    state: AutotuneStatus,
    trial_measured: AutotuneMeasurement | None,
    *,
    min_draft_tokens: int,
    stable: tuple[int, AutotuneMeasurement] | None = None,
) -> AutotuneStatus:
    """The status with what the tuned revision under trial measured: its step time among the
    step costs (with the stable's k and step time over the same window, `stable`, when
    given), and (from at least `min_draft_tokens` draft tokens) its acceptance per position
    as the longest measured, when it has as many positions as the one kept."""
    k = state.applied_tokens
    trial = state.trial_revision
    if (
        trial_measured is None
        or trial is None
        or k is None
        or state.inputs is None
        or trial_measured.error is not None
        or not trial_measured.step_seconds
    ):
        return state
    beside = None
    if stable is not None and stable[1].error is None and stable[1].step_seconds:
        beside = (stable[0], stable[1].step_seconds)
    update: dict[str, object] = {
        "step_costs": _step_costs(state.inputs.step_costs, k, trial_measured, beside)
    }
    if (
        trial_measured.draft_tokens >= min_draft_tokens
        and trial_measured.drafts > 0
        and trial_measured.accepted_per_position
    ):
        rates = acceptance_by_position(trial_measured.drafts, trial_measured.accepted_per_position)
        update["longest_acceptance"] = _longer(
            state.inputs.longest_acceptance, _acceptance(trial, k, trial_measured.drafts, rates)
        )
    return state.model_copy(update={"inputs": state.inputs.model_copy(update=update)})


def _resolve_trial(
    state: AutotuneStatus, analysis: AnalysisStatus | None
) -> tuple[AutotuneStatus, list[RolloutEvent]]:
    """The canary's verdict on the tuned revision under trial, once it is final."""
    trial = state.trial_revision
    if trial is None or analysis is None or analysis.revision != trial:
        return state, []
    k = state.applied_tokens
    schedule = state.applied_schedule
    what = f"numSpeculativeTokens {k}" + (
        f", schedule {schedule_key(schedule)}" if schedule else ""
    )
    if analysis.outcome == Outcome.PROMOTE:
        event = RolloutEvent(
            Reason.TUNED_REVISION_PROMOTED,
            f"tuned revision {trial} ({what}) passed the canary and serves",
        )
        return state.model_copy(
            update={"trial_revision": None, "previous_tokens": None, "previous_schedule": None}
        ), [event]
    if analysis.outcome == Outcome.ROLLBACK:
        update: dict[str, object] = {
            "trial_revision": None,
            "applied_tokens": state.previous_tokens,
            "previous_tokens": None,
            "applied_schedule": state.previous_schedule,
            "previous_schedule": None,
        }
        if schedule:
            update["rejected_schedules"] = sorted(
                {*state.rejected_schedules, schedule_key(schedule)}
            )
            again = f"schedule {schedule_key(schedule)} is"
        else:
            update["rejected_tokens"] = sorted(
                {*state.rejected_tokens, *([k] if k is not None else [])}
            )
            again = f"k={k} is"
        event = RolloutEvent(
            Reason.TUNED_REVISION_REJECTED,
            f"tuned revision {trial} ({what}) was rolled back by the canary: "
            f"{analysis.message}; {again} not tried again until the spec changes",
            warning=True,
        )
        return state.model_copy(update=update), [event]
    return state, []


def _cooled_down(state: AutotuneStatus, cooldown: str, now: datetime) -> bool:
    applied = _parse(state.applied_at)
    return applied is None or (now - applied).total_seconds() >= duration_seconds(cooldown)


def _for_this_spec(
    previous: AutotuneStatus | None, spec: SpeculativeDeploymentSpec
) -> AutotuneStatus:
    """The kept state, or, for a new pair or new bounds, a fresh one: what was tuned, rejected
    and measured belonged to the old one (the last recommendation and its inputs stay shown
    until the next)."""
    fingerprint = spec_fingerprint(spec)
    state = previous or AutotuneStatus()
    if state.spec_fingerprint == fingerprint:
        return state
    return AutotuneStatus(
        recommendation=state.recommendation,
        inputs=(
            state.inputs.model_copy(update={"step_costs": [], "longest_acceptance": None})
            if state.inputs
            else None
        ),
        computed_at=state.computed_at,
        spec_fingerprint=fingerprint,
    )


def _without_trial(state: AutotuneStatus) -> AutotuneStatus:
    """The state outside mode Apply: nothing applied, nothing under trial."""
    return state.model_copy(
        update={
            "applied_tokens": None,
            "trial_revision": None,
            "previous_tokens": None,
            "applied_schedule": None,
            "previous_schedule": None,
        }
    )


def _start_trial(
    state: AutotuneStatus,
    tune: AutotuneSpec,
    *,
    settled: bool,
    stable_tokens: int,
    stable_schedule: Sequence[ScheduleStep] | None,
    revision_for: RevisionFor,
    now: datetime,
) -> tuple[AutotuneStatus, list[RolloutEvent]]:
    """In mode Apply, the tuned revision a fresh recommendation rolls out as a canary: its
    schedule when it recommends one, else its k when the predicted gain (or a calibration)
    calls for it; never while another trial runs, the stable is not settled, within the
    cooldown, or for a k or schedule the canary rejected before."""
    rec = state.recommendation
    fresh = state.computed_at == now.strftime(RFC3339) and not state.message
    if not (
        tune.mode == "Apply"
        and fresh
        and rec is not None
        and settled
        and state.trial_revision is None
        and _cooled_down(state, tune.cooldown, now)
    ):
        return state, []
    stamp = now.strftime(RFC3339)
    if rec.schedule:
        key = schedule_key(rec.schedule)
        if key == schedule_key(stable_schedule or []) or key in state.rejected_schedules:
            return state, []
        k = max(step.tokens for step in rec.schedule)
        trial = revision_for(k, rec.schedule)
        started = state.model_copy(
            update={
                "applied_tokens": k,
                "applied_schedule": rec.schedule,
                "applied_at": stamp,
                "previous_tokens": state.applied_tokens,
                "previous_schedule": state.applied_schedule,
                "trial_revision": trial,
            }
        )
        return started, [
            RolloutEvent(
                Reason.TUNED_REVISION_ROLLED_OUT,
                f"tuned revision {trial}: schedule {key} (numSpeculativeTokens {k}; "
                f"was {stable_tokens}) ({rec.schedule_message})",
            )
        ]
    if (
        not rec.changed
        or (rec.predicted_gain < tune.min_gain and not rec.calibration)
        or rec.num_speculative_tokens in state.rejected_tokens
    ):
        return state, []
    k = rec.num_speculative_tokens
    trial = revision_for(k, None)
    started = state.model_copy(
        update={
            "applied_tokens": k,
            "applied_schedule": None,
            "previous_schedule": state.applied_schedule,
            "applied_at": stamp,
            "previous_tokens": state.applied_tokens,
            "trial_revision": trial,
        }
    )
    return started, [
        RolloutEvent(
            Reason.TUNED_REVISION_ROLLED_OUT,
            f"tuned revision {trial}: numSpeculativeTokens {stable_tokens} -> {k} ({rec.message})",
        )
    ]


def decide_tuning(
    spec: SpeculativeDeploymentSpec,
    previous: AutotuneStatus | None,
    *,
    stable_revision: str | None,
    stable_tokens: int | None,
    settled: bool,
    analysis: AnalysisStatus | None,
    measured: AutotuneMeasurement | None,
    window: str,
    min_draft_tokens: int,
    default_cost_ratio: float,
    revision_for: RevisionFor,
    now: datetime,
    stable_schedule: Sequence[ScheduleStep] | None = None,
    trial_measured: AutotuneMeasurement | None = None,
) -> Tuning:
    """The autotuner's step in the reconcile.

    `stable_tokens` is the k the stable revision serves (None: it does not speculate);
    `settled` says the stable revision serves alone (no canary, no collapse fallback), the
    only time a tuned revision may start; `measured` is the stable revision's measurement when
    one is due (see measurement_due), else None; `revision_for(k, schedule)` is the revision
    the spec with k (and a batch-size schedule, if any) tuned in would be; `stable_schedule`
    the tuned schedule the stable revision serves, if any; `trial_measured` the tuned revision
    under trial's measurement, taken beside the stable's: its step time is kept with the
    stable's whether the canary promotes it or not, so a second length measures the draft's
    cost ratio (see calibration_tokens), and so is its acceptance per position when it is the
    longest measured (see record_trial).

    The stages: the state for this spec → what the trial measured → the canary's verdict on
    the trial → (outside Apply) no trial → a recommendation from the stable's figures → a
    new trial it calls for.
    """
    tune = spec.pair.draft.autotune
    if tune is None or tune.mode == "Off" or spec.pair.draft.method == "none":
        return Tuning(state=None)
    state = _for_this_spec(previous, spec)
    beside = (stable_tokens, measured) if measured and stable_tokens is not None else None
    state = record_trial(state, trial_measured, min_draft_tokens=min_draft_tokens, stable=beside)
    state, events = _resolve_trial(state, analysis)
    if tune.mode != "Apply":
        state = _without_trial(state)
    if measured is not None and stable_revision is not None and stable_tokens is not None:
        state = recommend(
            tune,
            state,
            revision=stable_revision,
            served_tokens=stable_tokens,
            measured=measured,
            window=window,
            min_draft_tokens=min_draft_tokens,
            default_cost_ratio=default_cost_ratio,
            now=now,
            max_num_seqs=spec.engine.max_num_seqs,
        )
        state, started = _start_trial(
            state,
            tune,
            settled=settled,
            stable_tokens=stable_tokens,
            stable_schedule=stable_schedule,
            revision_for=revision_for,
            now=now,
        )
        events += started
    applying = tune.mode == "Apply"
    return Tuning(
        state=state,
        tokens=state.applied_tokens if applying else None,
        schedule=tuple(state.applied_schedule) if applying and state.applied_schedule else None,
        events=tuple(events),
    )


def served_tokens(
    spec: SpeculativeDeploymentSpec,
    previous: AutotuneStatus | None,
    stable: str | None,
    revision_for: RevisionFor,
) -> int | None:
    """The k the stable revision serves, when it serves this spec's pair with the spec's k or
    one the autotuner chose (the revision of that k is the stable one); None otherwise, e.g.
    while an older pair still serves or speculation is off."""
    tune = spec.pair.draft.autotune
    if stable is None or tune is None:
        return None
    known = [previous.applied_tokens, previous.previous_tokens] if previous else []
    candidates = [spec.pair.draft.num_speculative_tokens, *known]
    candidates += range(tune.min_tokens, tune.max_tokens + 1)
    schedule = served_schedule(previous, stable, revision_for)
    if schedule is not None:
        return max(step.tokens for step in schedule)
    return next(
        (k for k in dict.fromkeys(candidates) if k is not None and revision_for(k, None) == stable),
        None,
    )


def served_schedule(
    previous: AutotuneStatus | None, stable: str | None, revision_for: RevisionFor
) -> list[ScheduleStep] | None:
    """The tuned schedule the stable revision serves (the applied one, or the one before the
    trial), or None when it serves none."""
    if previous is None or stable is None:
        return None
    for schedule in (previous.applied_schedule, previous.previous_schedule):
        if schedule and revision_for(max(s.tokens for s in schedule), schedule) == stable:
            return schedule
    return None


def tune_deployment(
    sd: SpeculativeDeployment,
    measured: AutotuneMeasurement | None,
    settings: AnalysisSettings,
    revision_for: RevisionFor,
    now: datetime,
    *,
    trial_measured: AutotuneMeasurement | None = None,
) -> Tuning:
    """decide_tuning with its inputs read from the SD's spec and recorded status."""
    status = sd.status
    stable = status.stable_revision if status else None
    previous = status.autotune if status else None
    stable_tokens = (
        served_tokens(sd.spec, previous, stable, revision_for) if measured is not None else None
    )
    collapsed = bool(status and status.collapse and status.collapse.triggered)
    return decide_tuning(
        sd.spec,
        previous,
        stable_revision=stable,
        stable_tokens=stable_tokens,
        settled=stable is not None
        and status is not None
        and status.canary_revision is None
        and not collapsed,
        analysis=status.analysis if status else None,
        measured=measured,
        window=settings.window,
        min_draft_tokens=settings.min_draft_tokens,
        default_cost_ratio=DEFAULT_DRAFT_COST_RATIO,
        revision_for=revision_for,
        now=now,
        stable_schedule=(
            served_schedule(previous, stable, revision_for) if measured is not None else None
        ),
        trial_measured=trial_measured,
    )
