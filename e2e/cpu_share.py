"""How busy the machine's CPUs were while each e2e module ran, from ``/proc/stat``.

``make e2e`` prints it after the run and writes it beside the junit file (``e2e-cpu.json``):
a module whose CPUs sat mostly idle waits for what it tests (verdict intervals, Prometheus
windows, timer rounds); one whose CPUs were busy does work that running tests side by side
cannot hide. The busy share counts every process on the machine, not only the tests'.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

PROC_STAT = Path("/proc/stat")


@dataclass(frozen=True)
class CpuTimes:
    """The machine's CPU time since boot, in clock ticks: spent working, and in all."""

    busy: int
    total: int


def parse_cpu_times(stat: str) -> CpuTimes:
    """The first line of ``/proc/stat`` (all CPUs): user, nice, system, idle, iowait, irq,
    softirq, steal; guest time is already inside user and nice. Busy is this machine's work, as
    vmstat's us and sy count it: idle, iowait and steal (time the hypervisor gave to another
    machine) are not."""
    fields = stat.splitlines()[0].split()
    if fields[0] != "cpu":
        raise ValueError(f"not the all-CPU line of /proc/stat: {fields[0]!r}")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[1:9])
    busy = user + nice + system + irq + softirq
    return CpuTimes(busy=busy, total=busy + idle + iowait + steal)


def read_cpu_times(path: Path = PROC_STAT) -> CpuTimes | None:
    """The machine's CPU times now, None where ``/proc/stat`` cannot be read."""
    try:
        return parse_cpu_times(path.read_text())
    except (OSError, ValueError, IndexError):
        return None


@dataclass
class ModuleShare:
    seconds: float = 0.0
    busy_ticks: int = 0
    total_ticks: int = 0

    @property
    def busy(self) -> float | None:
        """The CPUs' busy share while the module's tests ran, None when nothing was counted."""
        return self.busy_ticks / self.total_ticks if self.total_ticks else None


class CpuShares:
    """The wall time and CPU ticks of each module's tests, added up test by test."""

    def __init__(self, ticks_per_second: int | None = None) -> None:
        self.ticks_per_second = ticks_per_second or os.sysconf("SC_CLK_TCK")
        self.modules: dict[str, ModuleShare] = {}

    def record(
        self, module: str, before: CpuTimes | None, after: CpuTimes | None, seconds: float
    ) -> None:
        share = self.modules.setdefault(module, ModuleShare())
        share.seconds += seconds
        if before is not None and after is not None and after.total >= before.total:
            share.busy_ticks += after.busy - before.busy
            share.total_ticks += after.total - before.total

    def cpu_seconds(self, share: ModuleShare) -> float:
        """The CPU time the whole machine spent working while the module ran."""
        return share.busy_ticks / self.ticks_per_second

    def figures(self, share: ModuleShare) -> dict[str, object]:
        """What a row (or the whole run) says: wall seconds, busy share, CPU-seconds."""
        return {
            "seconds": round(share.seconds, 1),
            "busy": None if share.busy is None else round(share.busy, 3),
            "cpu_seconds": round(self.cpu_seconds(share), 1),
        }

    def rows(self) -> list[dict[str, object]]:
        """One row per module, the longest first."""
        ordered = sorted(self.modules.items(), key=lambda kv: kv[1].seconds, reverse=True)
        return [{"module": module, **self.figures(share)} for module, share in ordered]

    def total(self) -> ModuleShare:
        whole = ModuleShare()
        for share in self.modules.values():
            whole.seconds += share.seconds
            whole.busy_ticks += share.busy_ticks
            whole.total_ticks += share.total_ticks
        return whole

    def lines(self) -> list[str]:
        """The terminal summary: the whole run, then each module."""
        whole = self.total()
        if whole.busy is None:
            return ["CPUs busy: /proc/stat could not be read"]
        out = [
            f"CPUs busy {whole.busy:.0%} over {whole.seconds:.0f} s of tests "
            f"({self.cpu_seconds(whole):.0f} CPU-seconds of work on the machine)"
        ]
        for row in self.rows():
            busy = row["busy"]
            shown = "?" if not isinstance(busy, float) else f"{busy:.0%}"
            out.append(
                f"  {row['module']:<32} {row['seconds']:>7.0f} s  busy {shown:>4}  "
                f"{row['cpu_seconds']:>6.0f} CPU-s"
            )
        return out

    def write(self, path: Path) -> None:
        figures = {**self.figures(self.total()), "cpus": os.cpu_count(), "modules": self.rows()}
        path.write_text(json.dumps(figures, indent=2) + "\n")
