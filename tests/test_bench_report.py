"""The report's figures from saved results, and P3's timing from pod events."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from bench.confidence import Verdict
from bench.engine_speed import paired_level
from bench.figures import autotune_figures, passthrough_figures, reaction_figures, rollout_figures
from bench.report import figure_rows, reaction_rows, reaction_section, scale_rows, verdicts_section
from bench.serving_watch import PodEvent, pod_event, reaction_seconds, serving_timeline

#: Results of past `make bench` runs, kept as they were written: each test below names what its
#: run showed, so a new run in bench/results/ changes none of them.
SAVED = Path(__file__).resolve().parent / "fixtures" / "bench"


def saved(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads((SAVED / f"{name}.json").read_text())
    return found


def at_load(result: dict[str, Any], load: float) -> dict[str, Any]:
    """The same result as if measured at this load average throughout."""
    measured = copy.deepcopy(result)
    measured["machine"]["load_average"] = [load, load, load]
    for part in (measured.get("load") or {}).values():
        part.update({"min": load, "max": load, "mean": load})
    return measured


def quiet(result: dict[str, Any]) -> dict[str, Any]:
    """The same result as if measured on a quiet machine."""
    return at_load(result, 0.5)


def test_pass_through_of_the_run_that_read_met_is_inconclusive() -> None:
    """2026-11-23's pass-through read "1.42, met" from medians of each side; its rounds spread
    0.41 to 2.04, and it ran at a load average of 10."""
    tokens, _ = passthrough_figures(saved("passthrough"))
    assert tokens.verdict is Verdict.INCONCLUSIVE
    assert "above the bound" in tokens.reason
    quiet_tokens, _ = passthrough_figures(quiet(saved("passthrough")))
    assert quiet_tokens.verdict is Verdict.INCONCLUSIVE, "and on a quiet machine: it straddles"
    assert "straddles" in quiet_tokens.reason


def test_rollout_rounds_are_paired_run_by_run() -> None:
    kwok = quiet(saved("p1-kwok"))
    [figure] = rollout_figures(kwok, None)
    ratios = [sd / raw for sd, raw in zip(kwok["sd_seconds"], kwok["raw_seconds"], strict=True)]
    assert list(figure.rounds) == ratios
    # The verdict is the interval's against 1.5: the recorded run's straddles it.
    assert figure.low < 1.5 < figure.high, (figure.low, figure.high)
    assert figure.verdict is Verdict.INCONCLUSIVE


def test_a_reaction_under_its_floor_gives_no_verdict() -> None:
    p3 = quiet(saved("p3-reaction"))
    rollback, _ = reaction_figures(p3)
    assert rollback.verdict is Verdict.INCONCLUSIVE
    assert "below the floor" in rollback.reason
    fine = {**p3, "rollback": {"runs_s": [21.0, 22.5, 21.4, 23.0, 22.3], "floor_s": 20}}
    [rollback, _] = reaction_figures(fine)
    assert rollback.verdict is Verdict.MET
    assert rollback.median == pytest.approx(22.3 / 20)


def test_the_reaction_table_shows_the_floor_the_figure_is_judged_against() -> None:
    """The table's floor is the result's own, and Argo Rollouts' and Flagger's columns count
    what it counts; the run of 2026-11-29 read "20.909999999999997 s" against a floor of
    "22 s" (a scrape interval its verdicts do not wait for), where its figure's floor was 20 s."""
    p3 = {
        **saved("p3-reaction"),
        "rollback": {"runs_s": [20.6, 21.2], "seconds": 20.909999999999997, "floor_s": 20},
        "collapse": {"decided_s": 10.2, "floor_s": 10},
    }
    rollback, collapse = reaction_rows(p3)
    assert rollback[1:] == (20.909999999999997, 20, 10, 20)
    assert collapse[1:3] == (10.2, 10)
    assert "| bad canary → stable only | 20.9 s | 20 s | 10 s | 20 s |" in reaction_section(p3)
    # A result of before the floor was written in it: the scrape interval counted, as then.
    old_rollback, old_collapse = reaction_rows(saved("p3-reaction"))
    assert old_rollback[2:] == (22, 12, 22)
    assert old_collapse[2] == 12


def test_autotune_same_k_as_the_oracle_is_met_without_rounds() -> None:
    well_vs_oracle, well_vs_k5, bad_vs_oracle, bad_vs_k5 = autotune_figures(saved("autotune"))
    assert bad_vs_oracle.verdict is Verdict.MET
    assert bad_vs_oracle.rounds == (1.0,)
    assert well_vs_oracle.verdict is Verdict.INCONCLUSIVE  # 0.92 to 1.06 around 0.95
    assert len(well_vs_oracle.rounds) == 10
    assert bad_vs_k5.verdict is Verdict.MET
    assert well_vs_k5.verdict is Verdict.INCONCLUSIVE


def test_the_report_names_every_verdict_other_than_met() -> None:
    figures = passthrough_figures(saved("passthrough")) + autotune_figures(saved("autotune"))
    scale = quiet(saved("scale"))
    text = verdicts_section(figures, list(scale_rows(scale)))
    assert "P4 engine pass-through, tokens/s** (inconclusive)" in text
    assert "P2 operator RSS at 1000 SDs**" not in text, "a met figure is not explained"
    assert "P2 resync after a restart at 1000 SDs**" not in text, "met on a quiet machine"
    busy = verdicts_section(figures, list(scale_rows(at_load(scale, 16.0))))
    assert "P2 resync after a restart at 1000 SDs** (inconclusive (load))" in busy
    heavy = {
        **scale,
        "points": [*scale["points"][:-1], {**scale["points"][-1], "rss_idle_mib": 361.2}],
    }
    text = verdicts_section(figures, list(scale_rows(heavy)))
    assert "P2 operator RSS at 1000 SDs** (missed)" in text
    assert "Limited by:" in text
    assert "predicted-badly, k=1 vs k=5" not in text, "a met figure is not explained"
    shown = {row[0]: row for row in figure_rows(figures)}
    assert shown["P4 engine pass-through, tokens/s"][5] == "**inconclusive**"


def events(*steps: tuple[float, str, str, bool]) -> list[PodEvent]:
    return [PodEvent(at, pod, revision, serving) for at, pod, revision, serving in steps]


def test_the_reaction_runs_from_the_canary_serving_to_the_stable_alone() -> None:
    seen = events(
        (0.0, "s-1", "stable", True),
        (1.0, "c-1", "canary", False),  # created, not ready yet
        (31.0, "c-1", "canary", True),  # ready: the analysis starts about now
        (40.0, "s-1", "stable", True),  # the stable's pod again (a status change): both serve
        (52.5, "c-1", "canary", False),  # being deleted: out of the Service
    )
    assert serving_timeline(seen)[-1] == (52.5, frozenset({"stable"}))
    assert reaction_seconds(seen, "canary", "stable") == pytest.approx(21.5)
    assert reaction_seconds(seen[:4], "canary", "stable") is None, "not rolled back yet"
    assert reaction_seconds(seen[:1], "canary", "stable") is None, "the canary never served"


def test_a_pod_event_reads_readiness_and_deletion() -> None:
    pod: dict[str, Any] = {
        "metadata": {"name": "c-1", "labels": {"rev": "canary"}},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    assert pod_event(1.0, "MODIFIED", pod, "rev").serving
    deleting = {**pod, "metadata": {**pod["metadata"], "deletionTimestamp": "2026-11-26T00:00:00Z"}}
    assert not pod_event(1.0, "MODIFIED", deleting, "rev").serving
    assert pod_event(1.0, "DELETED", pod, "rev").gone


class CountingEngine:
    """A stand-in engine that logs which engine was asked, in order."""

    def __init__(self, name: str, log: list[str], tokens: int) -> None:
        self.name, self.log, self.tokens = name, log, tokens

    def counters(self) -> dict[str, float]:
        return {}

    def complete(self, prompt: str, max_tokens: int = 48) -> dict[str, Any]:
        self.log.append(self.name)
        return {"usage": {"completion_tokens": self.tokens}}


def test_bench_engine_alternates_the_two_engines_round_by_round() -> None:
    order: list[str] = []
    base = CountingEngine("base", order, 10)
    spec = CountingEngine("spec", order, 10)
    level = paired_level(base, spec, concurrency=1, requests=2, max_tokens=10, rounds=4)  # type: ignore[arg-type]
    runs = order[::2]  # two completions a run
    assert runs == ["base", "spec", "spec", "base", "base", "spec", "spec", "base"]
    assert len(level["ratios"]) == 4
    assert len(level["base"]) == len(level["speculation"]) == 4
