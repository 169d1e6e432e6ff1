"""bench.confidence: paired ratios, the bootstrap interval of their median, and the verdict."""

from __future__ import annotations

import math

import pytest

from bench.confidence import (
    Direction,
    Figure,
    Verdict,
    bootstrap_interval,
    judge,
    judge_paired,
    paired_ratios,
    verdict_of_interval,
)


def test_each_round_is_divided_by_its_own_baseline() -> None:
    assert paired_ratios([2.0, 3.0, 1.0], [1.0, 2.0, 4.0]) == [2.0, 1.5, 0.25]


@pytest.mark.parametrize(
    ("measured", "baseline", "words"),
    [
        ([1.0, 2.0], [1.0], "2 measured rounds against 1 baseline"),
        ([1.0], [0.0], "not positive"),
    ],
)
def test_unpaired_rounds_are_refused(
    measured: list[float], baseline: list[float], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        paired_ratios(measured, baseline)


def test_identical_rounds_give_a_point() -> None:
    assert bootstrap_interval([1.3] * 6) == (1.3, 1.3)


def test_five_rounds_give_an_interval_from_the_least_to_the_greatest() -> None:
    """Worked by hand: a resample's median is at or below the least of 5 rounds when 3 or more
    of its 5 draws are that round, with probability 10(0.2^3)(0.8^2) + 5(0.2^4)(0.8) + 0.2^5 =
    5.8 %, more than the 2.5 % tail; likewise for the greatest. So the interval is the range."""
    assert bootstrap_interval([1.0, 2.0, 3.0, 4.0, 5.0]) == (1.0, 5.0)


def test_more_rounds_narrow_the_interval_around_the_median() -> None:
    rounds = [float(value) for value in range(41)]  # median 20
    low, high = bootstrap_interval(rounds)
    assert 10 < low < 20 < high < 30


def test_the_interval_is_the_same_every_time() -> None:
    rounds = [0.9, 1.1, 1.05, 0.97, 1.2, 0.88, 1.01]
    assert bootstrap_interval(rounds) == bootstrap_interval(rounds)


@pytest.mark.parametrize(
    ("low", "high", "target", "direction", "verdict"),
    [
        (0.98, 1.10, 0.97, Direction.AT_LEAST, Verdict.MET),
        (0.97, 1.10, 0.97, Direction.AT_LEAST, Verdict.MET),  # touching the target is on it
        (0.80, 0.96, 0.97, Direction.AT_LEAST, Verdict.MISSED),
        (0.90, 1.10, 0.97, Direction.AT_LEAST, Verdict.INCONCLUSIVE),
        (1.00, 1.40, 1.5, Direction.AT_MOST, Verdict.MET),
        (1.00, 1.50, 1.5, Direction.AT_MOST, Verdict.MET),
        (1.60, 2.90, 1.5, Direction.AT_MOST, Verdict.MISSED),
        (1.20, 2.90, 1.5, Direction.AT_MOST, Verdict.INCONCLUSIVE),
    ],
)
def test_the_verdict_follows_the_whole_interval(
    low: float, high: float, target: float, direction: Direction, verdict: Verdict
) -> None:
    assert verdict_of_interval(low, high, target, direction) is verdict


def test_pass_through_rounds_that_spread_widely_are_inconclusive() -> None:
    """The P4 pass-through of 2026-11-23 (tests/fixtures/bench/passthrough.json): medians of
    each side gave 103.77 / 72.89 = 1.42, "met"; round by round the ratios run from 0.41 to
    2.04."""
    operator = [98.9, 103.77, 144.09, 134.2, 45.54]
    hand = [48.9, 171.36, 70.76, 72.89, 112.45]
    figure = judge_paired("pass-through", operator, hand, 0.97, Direction.AT_LEAST)
    assert figure.verdict is Verdict.INCONCLUSIVE
    assert "straddles" in figure.reason
    assert figure.low < 0.97 < figure.high
    assert math.isclose(figure.median, 134.2 / 72.89)


def test_rounds_all_on_the_good_side_are_met() -> None:
    figure = judge("k6 vs k5", [1.03, 1.05, 1.04, 1.08, 1.02, 1.06], 1.0, Direction.AT_LEAST)
    assert figure.verdict is Verdict.MET
    assert figure.reason.startswith("median 1.04")


def test_a_busy_machine_gives_no_verdict() -> None:
    rounds = [1.03, 1.05, 1.04, 1.08, 1.02, 1.06]
    busy = judge("x", rounds, 1.0, Direction.AT_LEAST, load=7.5, load_bound=3.0)
    assert busy.verdict is Verdict.INCONCLUSIVE
    assert "load average 7.50 above the bound 3.00" in busy.reason
    unknown = judge("x", rounds, 1.0, Direction.AT_LEAST, load=None, load_bound=3.0)
    assert unknown.verdict is Verdict.INCONCLUSIVE
    assert "not recorded" in unknown.reason
    quiet = judge("x", rounds, 1.0, Direction.AT_LEAST, load=2.4, load_bound=3.0)
    assert quiet.verdict is Verdict.MET


def test_too_few_rounds_give_no_verdict_unless_the_ratio_is_an_identity() -> None:
    few = judge("x", [1.2, 1.3, 1.25], 1.0, Direction.AT_LEAST)
    assert few.verdict is Verdict.INCONCLUSIVE
    assert "3 rounds, fewer than 5" in few.reason
    same_k = judge("operator's k is the oracle's", [1.0], 0.95, Direction.AT_LEAST, exact=True)
    assert same_k.verdict is Verdict.MET
    assert (same_k.low, same_k.high) == (1.0, 1.0)


def test_a_figure_survives_its_json() -> None:
    figure = judge("x", [0.9, 1.1, 1.0, 1.2, 0.95], 0.97, Direction.AT_LEAST, load=1.0,
                   load_bound=3.0, context="5 rounds")  # fmt: skip
    assert Figure.from_json(figure.to_json()) == figure
