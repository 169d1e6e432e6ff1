"""How sure a benchmark figure is: paired-round ratios, their bootstrap interval, the verdict.

A figure compares two things measured in the same run, round by round (the operator's engine
and one started by hand, k=6 and k=7, an SD and a raw Deployment), so that a drift in the
machine's load falls on both sides of each round's ratio. The figure is the median of the
rounds' ratios; its 95 % interval comes from resampling the rounds with replacement (a
percentile bootstrap of the median); the verdict is **met** when the whole interval is on the
target's good side, **missed** when the whole interval is on its bad side, and **inconclusive**
when it straddles the target, when there are too few rounds to say, or when the machine was
busier than the stated bound while the rounds ran.

Pure functions, no I/O: tests/test_bench_confidence.py works every case by hand.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

#: The interval's coverage.
CONFIDENCE = 0.95
#: Resamples of the bootstrap; with a fixed seed the report is the same every time it is made.
RESAMPLES = 10_000
SEED = 20261126
#: Fewer rounds than this give an interval too coarse to mean anything (with 3 rounds the
#: bootstrap median takes at most 3 distinct values), so the verdict is inconclusive.
MIN_ROUNDS = 5


class Verdict(StrEnum):
    MET = "met"
    MISSED = "missed"
    INCONCLUSIVE = "inconclusive"


class Direction(StrEnum):
    """Which side of the target is good."""

    AT_LEAST = ">="
    AT_MOST = "<="


def paired_ratios(measured: Sequence[float], baseline: Sequence[float]) -> list[float]:
    """Each round's ratio measured / baseline, in round order.

    Raises ValueError when the two sides have different numbers of rounds or a baseline is not
    positive: a ratio without its own round's baseline is not a paired ratio.
    """
    if len(measured) != len(baseline):
        raise ValueError(f"{len(measured)} measured rounds against {len(baseline)} baseline rounds")
    if any(value <= 0 for value in baseline):
        raise ValueError(f"a baseline round is not positive: {list(baseline)}")
    return [value / base for value, base in zip(measured, baseline, strict=True)]


def bootstrap_interval(
    values: Sequence[float],
    confidence: float = CONFIDENCE,
    resamples: int = RESAMPLES,
    seed: int = SEED,
) -> tuple[float, float]:
    """The percentile-bootstrap interval of the median of `values` (rounds resampled whole).

    Deterministic for a given seed. One value gives a zero-width interval: the caller decides
    whether that means certainty (an identity) or too few rounds (`judge` does).
    """
    if not values:
        raise ValueError("no values to resample")
    rng = random.Random(seed)
    count = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=count)) for _ in range(resamples))
    tail = (1 - confidence) / 2
    low_index = int(tail * resamples)
    high_index = min(resamples - 1, int((1 - tail) * resamples))
    return medians[low_index], medians[high_index]


def verdict_of_interval(low: float, high: float, target: float, direction: Direction) -> Verdict:
    """Met when the whole interval is on the good side of the target (touching it counts as on
    it), missed when the whole interval is on the bad side, inconclusive when it straddles."""
    if direction is Direction.AT_LEAST:
        if low >= target:
            return Verdict.MET
        if high < target:
            return Verdict.MISSED
    else:
        if high <= target:
            return Verdict.MET
        if low > target:
            return Verdict.MISSED
    return Verdict.INCONCLUSIVE


@dataclass(frozen=True)
class Figure:
    """One benchmark figure: a ratio from paired rounds against a target, and its verdict.

    `rounds` are the per-round ratios in round order. `load` is the highest 1-minute load
    average seen while the rounds ran, `load_bound` the most a verdict accepts (None: no bound
    applies, e.g. a count of API writes that load does not change).
    """

    name: str
    rounds: tuple[float, ...]
    target: float
    direction: Direction
    median: float
    low: float
    high: float
    verdict: Verdict
    reason: str
    load: float | None = None
    load_bound: float | None = None
    context: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "rounds": list(self.rounds),
            "target": self.target,
            "direction": str(self.direction),
            "median": self.median,
            "interval": [self.low, self.high],
            "verdict": str(self.verdict),
            "reason": self.reason,
            "load": self.load,
            "load_bound": self.load_bound,
            "context": self.context,
            **({"extra": dict(self.extra)} if self.extra else {}),
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Figure:
        low, high = data["interval"]
        return Figure(
            name=data["name"],
            rounds=tuple(float(value) for value in data["rounds"]),
            target=float(data["target"]),
            direction=Direction(data["direction"]),
            median=float(data["median"]),
            low=float(low),
            high=float(high),
            verdict=Verdict(data["verdict"]),
            reason=data["reason"],
            load=data.get("load"),
            load_bound=data.get("load_bound"),
            context=data.get("context", ""),
            extra=data.get("extra", {}),
        )


def judge(
    name: str,
    rounds: Sequence[float],
    target: float,
    direction: Direction,
    *,
    load: float | None = None,
    load_bound: float | None = None,
    min_rounds: int = MIN_ROUNDS,
    exact: bool = False,
    context: str = "",
) -> Figure:
    """A figure from its rounds' ratios: the median, its bootstrap interval and the verdict.

    The verdict is inconclusive, whatever the interval says, when there are fewer than
    `min_rounds` rounds (unless `exact`: a ratio that is an identity, such as the operator's k
    being the oracle's, needs no rounds), or when `load` exceeded `load_bound` (or was not
    recorded while a bound applies). `reason` says which.
    """
    if not rounds:
        raise ValueError(f"{name}: no rounds")
    values = [float(value) for value in rounds]
    median = statistics.median(values)
    low, high = (median, median) if exact else bootstrap_interval(values)
    by_interval = verdict_of_interval(low, high, target, direction)
    side = "≥" if direction is Direction.AT_LEAST else "≤"
    interval = (
        f"median {median:.3g}, 95 % interval {low:.3g} to {high:.3g}, target {side} {target:g}"
    )
    if load_bound is not None and load is None:
        verdict, reason = Verdict.INCONCLUSIVE, f"{interval}; the load was not recorded"
    elif load_bound is not None and load is not None and load > load_bound:
        verdict = Verdict.INCONCLUSIVE
        reason = f"{interval}; load average {load:.2f} above the bound {load_bound:.2f}"
    elif not exact and len(values) < min_rounds:
        verdict = Verdict.INCONCLUSIVE
        reason = f"{interval}; {len(values)} rounds, fewer than {min_rounds}"
    elif by_interval is Verdict.INCONCLUSIVE:
        verdict, reason = by_interval, f"{interval}: the interval straddles the target"
    else:
        verdict, reason = by_interval, interval
    return Figure(
        name=name,
        rounds=tuple(values),
        target=target,
        direction=direction,
        median=median,
        low=low,
        high=high,
        verdict=verdict,
        reason=reason,
        load=load,
        load_bound=load_bound,
        context=context,
    )


def judge_paired(
    name: str,
    measured: Sequence[float],
    baseline: Sequence[float],
    target: float,
    direction: Direction,
    **options: Any,
) -> Figure:
    """`judge` over the paired ratios measured / baseline of each round."""
    return judge(name, paired_ratios(measured, baseline), target, direction, **options)
