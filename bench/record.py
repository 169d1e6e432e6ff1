"""Where and when a result was measured: the machine, the commit, the load during each part.

Every result file in bench/results/ carries `machine` (date, commit, CPUs, platform, the load
averages when it was written) and, for each part that was timed, the load seen while it ran
(`LoadWatch`). A verdict needs the 1-minute load average to have stayed at or under
`load_bound()` for the whole part: above it the machine was doing something else as well, and
the figure says more about that than about specdeploy.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"

#: The 1-minute load average a verdict accepts, per CPU. A benchmark's own engines add about
#: one each (vLLM's CPU worker busy-polls after each step), so on 2 CPUs with two engines a
#: quiet machine reads 2 to 2.5 (the autotune sweep alone on a machine read 0.2 to 2.5); another
#: engineer's e2e run with real engines beside it reads 5 and more.
LOAD_BOUND_PER_CPU = 1.5
#: Overrides the bound (an absolute load average), for a machine with other habits.
LOAD_BOUND_ENV = "SPECDEPLOY_BENCH_MAX_LOAD"


def load_bound() -> float:
    """The highest 1-minute load average a part may see and still give a verdict."""
    override = os.environ.get(LOAD_BOUND_ENV)
    if override:
        return float(override)
    return LOAD_BOUND_PER_CPU * (os.cpu_count() or 1)


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or "unknown"


#: The commit whose code this process runs: read once, as the benchmark starts, since HEAD may
#: move while a long part runs.
RUNNING_COMMIT = commit()


def machine() -> dict[str, Any]:
    """Where and when: the context every result file carries."""
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": RUNNING_COMMIT,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        # 1, 5 and 15 minute load averages when the result was written: the machine is shared.
        "load_average": [round(value, 2) for value in os.getloadavg()],
    }


@dataclass
class LoadWatch:
    """Samples the 1-minute load average every `period` seconds while a part runs.

    Use as a context manager around the part; `summary()` goes into the part's result.
    """

    part: str
    period: float = 5.0
    samples: list[float] = field(default_factory=list)
    started: str = ""
    ended: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> LoadWatch:
        self.started = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.samples.append(os.getloadavg()[0])
        self._thread = threading.Thread(target=self._sample, name=f"load-{self.part}", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.period):
            self.samples.append(os.getloadavg()[0])

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.samples.append(os.getloadavg()[0])
        self.ended = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def peak(self) -> float:
        return max(self.samples)

    def summary(self) -> dict[str, Any]:
        return {
            "part": self.part,
            "started": self.started,
            "ended": self.ended,
            "min": round(min(self.samples), 2),
            "max": round(self.peak, 2),
            "mean": round(sum(self.samples) / len(self.samples), 2),
            "samples": len(self.samples),
            "bound": load_bound(),
        }


def recorded_peak_load(result: Mapping[str, Any], part: str | None = None) -> float | None:
    """The highest load a result saw during `part` (or during its only part).

    Results written before parts recorded their load carry only the load averages at the time
    they were written; the highest of the 1, 5 and 15-minute ones stands in for the part's, a
    lower bound of what the part saw.
    """
    loads = result.get("load")
    if isinstance(loads, Mapping):
        if part is not None and part in loads:
            return float(loads[part]["max"])
        if part is None and len(loads) == 1:
            return float(next(iter(loads.values()))["max"])
    averages = machine_of(result).get("load_average")
    if averages:
        return float(max(averages))
    return None


def machine_of(result: Mapping[str, Any]) -> Mapping[str, Any]:
    """A result's `machine` (older results wrote only the architecture there)."""
    found = result.get("machine")
    return found if isinstance(found, Mapping) else {}


def write_result(name: str, data: Mapping[str, Any], results: Path = RESULTS) -> Path:
    """bench/results/<name>.json with the machine context first."""
    results.mkdir(parents=True, exist_ok=True)
    path = results / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), **data}, indent=2) + "\n")
    print(f"wrote {path}", file=sys.stderr)
    return path


def read_result(name: str, results: Path = RESULTS) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data
