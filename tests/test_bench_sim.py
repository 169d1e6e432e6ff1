"""make bench-sim's verdict: the speed-up's ratio to the published figure within ±10 %."""

from __future__ import annotations

from bench.sim_speed import within_band


def test_an_interval_inside_the_band_is_met_and_one_outside_missed() -> None:
    _, inside, _ = within_band(1, [0.98, 1.0, 1.01, 0.99, 1.02])
    _, outside, _ = within_band(1, [1.2, 1.22, 1.25, 1.21, 1.23])
    _, below, _ = within_band(4, [0.7, 0.72, 0.75, 0.71, 0.73])
    assert (inside, outside, below) == ("met", "missed", "missed")


def test_straddling_the_band_or_too_few_rounds_is_inconclusive() -> None:
    _, straddles, reason = within_band(16, [0.85, 0.9, 0.95, 0.88, 0.93, 0.86])
    _, few, _ = within_band(16, [1.0, 1.0])
    assert (straddles, few) == ("inconclusive", "inconclusive")
    assert "straddles" in reason
