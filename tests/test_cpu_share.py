"""The e2e run's CPU busy share by module (e2e/cpu_share.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cpu_share import CpuShares, CpuTimes, parse_cpu_times, read_cpu_times

# user nice system idle iowait irq softirq steal guest guest_nice
STAT = "cpu  100 5 40 800 30 2 3 20 7 0\ncpu0 50 2 20 400 15 1 2 10 3 0\nintr 1 2 3\n"


def test_idle_iowait_and_steal_are_not_busy_and_guest_counts_once() -> None:
    times = parse_cpu_times(STAT)
    assert times == CpuTimes(busy=100 + 5 + 40 + 2 + 3, total=1000)


def test_a_per_cpu_line_first_is_refused() -> None:
    with pytest.raises(ValueError, match="cpu0"):
        parse_cpu_times(STAT.split("\n", 1)[1])


def test_the_machine_s_own_counters_read_and_grow(tmp_path: Path) -> None:
    first = read_cpu_times()
    assert first is not None
    assert 0 < first.busy < first.total
    sum(i * i for i in range(300_000))  # some work between the two reads
    second = read_cpu_times()
    assert second is not None
    assert second.total >= first.total
    assert second.busy >= first.busy
    assert read_cpu_times(tmp_path / "absent") is None


def test_shares_add_up_test_by_test_per_module_and_in_all(tmp_path: Path) -> None:
    shares = CpuShares(ticks_per_second=100)
    # Two CPUs, 10 s: 2,000 ticks in all. One test of "waits" busy 10 % of them, two tests of
    # "engines" busy 90 % and 70 %.
    shares.record("waits", CpuTimes(0, 0), CpuTimes(200, 2000), 10.0)
    shares.record("engines", CpuTimes(0, 0), CpuTimes(1800, 2000), 10.0)
    shares.record("engines", CpuTimes(1800, 2000), CpuTimes(3200, 4000), 10.0)
    rows = shares.rows()
    assert [r["module"] for r in rows] == ["engines", "waits"]
    assert rows[0] == {"module": "engines", "seconds": 20.0, "busy": 0.8, "cpu_seconds": 32.0}
    assert rows[1] == {"module": "waits", "seconds": 10.0, "busy": 0.1, "cpu_seconds": 2.0}
    whole = shares.total()
    assert whole.busy == pytest.approx(3400 / 6000)
    assert shares.lines()[0].startswith("CPUs busy 57% over 30 s of tests (34 CPU-seconds")

    path = tmp_path / "e2e-cpu.json"
    shares.write(path)
    written = json.loads(path.read_text())
    assert written["cpu_seconds"] == 34.0
    assert written["modules"] == rows


def test_a_test_without_readable_counters_counts_its_time_but_no_share() -> None:
    shares = CpuShares(ticks_per_second=100)
    shares.record("blind", None, CpuTimes(5, 10), 3.0)
    assert shares.rows() == [{"module": "blind", "seconds": 3.0, "busy": None, "cpu_seconds": 0.0}]
    assert shares.lines() == ["CPUs busy: /proc/stat could not be read"]
