"""The judge-accuracy benchmark's pure parts: counters into windows, the judge over a run,
and the accuracy interval."""

from __future__ import annotations

import pytest

from bench.judge_accuracy import (
    ACCURACY_TARGET,
    CANARIES,
    RUNS,
    Counters,
    Windows,
    accuracy_figure,
    judge_run,
    measurement_between,
    probe_from_metrics,
    read_counters,
    wilson,
)
from specdeploy.api.config import AnalysisSettings
from specdeploy.engine.probe import ProbeFigures as EngineFigures
from specdeploy.engine.probe import render_probe_metrics
from specdeploy.plan.rollout.analysis import Measurement
from specdeploy.plan.rollout.probe import probe_record
from vllm_windows import figures

METRICS = """\
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="t"} 300.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="t"} 1.7e9
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="t"} 9.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="t"} 1.0
# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_count{engine="0",model_name="t"} 120.0
vllm:iteration_tokens_total_sum{engine="0",model_name="t"} 400.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="0"} 90.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="t",position="1"} 60.0
"""


def test_counters_are_summed_by_exact_name_and_failures_by_reason() -> None:
    counters = read_counters(METRICS)
    assert counters.get("vllm:spec_decode_num_draft_tokens_total") == 300.0
    assert counters.get("vllm:request_success_total") == 10.0
    assert counters.failed == 1.0
    assert counters.get("vllm:iteration_tokens_total_count") == 120.0
    assert counters.accepted_per_position == {0: 90.0, 1: 60.0}


def test_a_window_is_the_growth_of_each_counter() -> None:
    before = Counters({"vllm:inter_token_latency_seconds_sum": 1.0}, failed=1.0)
    after = Counters(
        {
            "vllm:inter_token_latency_seconds_sum": 1.5,
            "vllm:inter_token_latency_seconds_count": 50.0,
            "vllm:generation_tokens_total": 160.0,
            "vllm:time_to_first_token_seconds_count": 10.0,
            "vllm:spec_decode_num_draft_tokens_total": 150.0,
            "vllm:spec_decode_num_drafts_total": 50.0,
            "vllm:spec_decode_num_accepted_tokens_total": 100.0,
            "vllm:request_success_total": 10.0,
        },
        failed=2.0,
        accepted_per_position={0: 45.0, 1: 35.0, 2: 20.0},
    )
    measured = measurement_between(before, after)
    assert measured.acceptance_per_position == pytest.approx((0.9, 0.7, 0.4))
    assert measured.time_per_output_token == pytest.approx(0.5 / 150)
    assert measured.tokens_per_step == pytest.approx(3.0)
    assert measured.acceptance_rate == pytest.approx(2 / 3)
    assert measured.error_rate == pytest.approx(0.1)


def test_the_judge_decides_a_run_and_counts_its_intervals() -> None:
    settings = AnalysisSettings(interval="20s", window="60s")
    stable = figures(0.8, 3.4, 0.010, draft_tokens=2400)
    fast = figures(0.8, 3.4, 0.009, draft_tokens=2400)
    slow = figures(0.99, 4.0, 0.020, draft_tokens=2400)

    def steady(canary: Measurement) -> object:
        return lambda _n: (canary, stable)

    promoted = judge_run(
        steady(fast),  # type: ignore[arg-type]
        canary_probe=None,
        stable_probe=None,
        canary_has_draft=True,
        stable_has_draft=True,
        settings=settings,
    )
    assert (promoted.outcome, promoted.intervals) == ("Promote", 3)
    rolled = judge_run(
        steady(slow),  # type: ignore[arg-type]
        canary_probe=None,
        stable_probe=None,
        canary_has_draft=True,
        stable_has_draft=True,
        settings=settings,
    )
    assert (rolled.outcome, rolled.intervals) == ("Rollback", 2)
    assert rolled.per_token_ratios == [pytest.approx(0.005 / (0.010 / 3.4))] * 2


def test_a_bad_probe_decides_before_any_interval() -> None:
    good = EngineFigures("p", 6, True, 6, 0, 294.0, 80.0, 240.0, 200.0, {0: 70.0}, 1.0, 80.0)
    bad = EngineFigures("p", 6, True, 6, 0, 294.0, 288.0, 864.0, 4.0, {0: 4.0}, 3.0, 288.0)
    as_status = {
        name: probe_record(result, "2026-11-26T00:00:00Z")
        for name, result in (
            ("good", probe_from_metrics(render_probe_metrics(good))),
            ("bad", probe_from_metrics(render_probe_metrics(bad))),
        )
        if result is not None
    }
    decision = judge_run(
        lambda _n: pytest.fail("no live window is needed"),
        canary_probe=as_status["bad"],
        stable_probe=as_status["good"],
        canary_has_draft=True,
        stable_has_draft=True,
        settings=AnalysisSettings(),
    )
    assert (decision.outcome, decision.intervals) == ("Rollback", 0)
    assert decision.verdicts[0].startswith(
        "probe Fail: probe: first-position acceptance 0.01 < 0.60"
    )


def test_accuracy_has_a_wilson_interval_and_a_verdict() -> None:
    low, high = wilson(18, 18)
    assert low == pytest.approx(0.824, abs=1e-3)
    assert high == 1.0
    figure = accuracy_figure("a", [True] * 18, load=0.5, context="")
    assert str(figure.verdict) == "inconclusive"  # 0.82 .. 1.0 straddles 0.9
    assert str(accuracy_figure("b", [True] * 40, load=0.5, context="").verdict) == "met"
    assert str(accuracy_figure("c", [False] * 10, load=0.5, context="").verdict) == "missed"
    # The default runs can give a verdict when every one is right, 34 verdicts cannot.
    assert (
        str(accuracy_figure("d", [True] * RUNS * len(CANARIES), load=0.5, context="").verdict)
        == "met"
    )
    assert wilson(34, 34)[0] < ACCURACY_TARGET
    # A count, rated whatever the load, which it records.
    loaded = accuracy_figure("e", [True] * 40, load=9.0, context="")
    assert (str(loaded.verdict), loaded.load, loaded.load_bound) == ("met", 9.0, None)


class _Reads:
    """Stands in for the running engines: each read gives counters one step further."""

    def __init__(self) -> None:
        self.reads = 0

    def counters(self, _server: object) -> Counters:
        self.reads += 1
        return Counters({"vllm:generation_tokens_total": 100.0 * self.reads})


def test_live_only_judging_reads_on_where_the_probe_decided_first() -> None:
    reads, slept = _Reads(), list[float]()
    windows = Windows(reads, "canary", "stable", sleep=slept.append)  # type: ignore[arg-type]
    assert reads.reads == 2  # the run's start, both engines
    # The judge with the probe decided at its probe: no live window was read. Live traffic
    # alone is still judged, on windows read from then on, an interval apart.
    canary, stable = windows.replay(1)
    assert len(windows.snapshots) == 3
    assert slept == [20.0, 20.0]
    assert canary.decode_tokens == stable.decode_tokens == 400.0  # both windows from the start
    # A window already read is replayed as it was, without waiting.
    windows.replay(0)
    assert (len(windows.snapshots), len(slept)) == (3, 2)
