"""bench.record: the load bound, the load seen during a part, result files."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import pytest

from bench import record


def test_the_load_bound_scales_with_the_cpus_and_can_be_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(record.LOAD_BOUND_ENV, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert record.load_bound() == 3.0
    monkeypatch.setenv(record.LOAD_BOUND_ENV, "4.5")
    assert record.load_bound() == 4.5


def test_a_part_records_the_load_it_ran_under(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([1.0, 6.0, 2.0, 2.0, 2.0, 2.0])
    monkeypatch.setattr(os, "getloadavg", lambda: (next(readings), 0.0, 0.0))
    with record.LoadWatch("p4", period=3600) as load:
        pass
    assert load.samples == [1.0, 6.0]  # at the start and at the end: no period elapsed
    summary = load.summary()
    assert (summary["min"], summary["max"], summary["mean"]) == (1.0, 6.0, 3.5)
    assert load.peak == 6.0


def test_the_peak_load_of_a_part_falls_back_to_the_load_when_written() -> None:
    with_parts = {"load": {"p4": {"max": 2.5}, "p1": {"max": 9.0}}}
    assert record.recorded_peak_load(with_parts, "p4") == 2.5
    assert record.recorded_peak_load({"load": {"only": {"max": 1.5}}}) == 1.5
    older = {"machine": {"load_average": [5.58, 10.15, 10.22]}}
    assert record.recorded_peak_load(older, "p4") == 10.22
    assert record.recorded_peak_load({}, "p4") is None


def test_a_result_is_written_with_its_machine_and_read_back(tmp_path: Path) -> None:
    record.write_result("p9", {"what": "a test", "figures": []}, results=tmp_path)
    result = record.read_result("p9", results=tmp_path)
    assert result is not None
    assert result["what"] == "a test"
    assert set(result["machine"]) >= {"date", "commit", "cpus", "load_average"}
    assert record.read_result("missing", results=tmp_path) is None


@pytest.mark.parametrize(
    "module",
    [
        "bench.plan_cost",
        "bench.operator_cost",
        "bench.engine_speed",
        "bench.passthrough",
        "bench.autotune",
        "bench.report",
        "bench.soak",
    ],
)
def test_every_benchmark_imports_and_has_a_main(module: str) -> None:
    assert callable(importlib.import_module(module).main)


def test_a_result_names_the_commit_its_code_came_from_not_a_later_head(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # HEAD moves while a part runs (a commit lands): the result still names the code that ran.
    monkeypatch.setattr(record, "commit", lambda: "later00")
    written = record.write_result("x", {}, results=tmp_path)
    assert record.RUNNING_COMMIT not in ("later00", "")
    assert json.loads(written.read_text())["machine"]["commit"] == record.RUNNING_COMMIT
