"""`make e2e`: the end-to-end suite in lanes on one shared test bed.

The real-engine tests (marker `engine`) spend most of their time waiting on engines: starting,
serving, analysis intervals. The cluster-only tests spend theirs waiting on the control plane.
So the two run side by side, each in its own pytest process against the same cluster; then
the tests that disturb the whole cluster (marker `serial`: control-plane faults, a hung
Prometheus, a drained node, cluster-wide CRDs installed and removed) run alone.

Every lane runs with SPECDEPLOY_E2E_REQUIRED=1, so a lane that skips a test or collects none
fails; the run fails when any lane does, whatever its exit code (5, "no tests", included).
The cluster is started here when none runs (and stopped at the end), so no lane stops it
under another.

    python -m testbed.lanes [pytest options for every lane]
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.cluster import down, run_dir, up

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Lane:
    name: str
    markers: str


#: What `make e2e` runs: every e2e test but the CPU engine image's (`make images` runs those).
SUITE = "e2e and not engine_image"
#: Side by side first, then alone.
TOGETHER = (
    Lane("engines", f"{SUITE} and engine and not serial"),
    Lane("cluster", f"{SUITE} and not engine and not serial"),
)
ALONE = Lane("serial", f"{SUITE} and serial")


def pytest_command(lane: Lane, extra: Sequence[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "pytest",
        "e2e",
        "-m",
        lane.markers,
        "-p",
        "no:cacheprovider",
        *extra,
    ]


def verdict(codes: dict[str, int]) -> int:
    """The run's exit code: 0 only when every lane passed (exit code 0)."""
    failed = {name: code for name, code in codes.items() if code != 0}
    for name, code in failed.items():
        print(f"e2e lane {name!r} failed with exit code {code}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    extra = list(sys.argv[1:] if argv is None else argv)
    env = {**os.environ, "SPECDEPLOY_E2E_REQUIRED": "1"}
    _, started = up(log=lambda m: print(m, file=sys.stderr, flush=True), die_with_parent=True)
    logs = run_dir().parent / "e2e-lanes"
    logs.mkdir(parents=True, exist_ok=True)
    codes: dict[str, int] = {}
    took: dict[str, float] = {}
    began = time.monotonic()
    try:
        background = TOGETHER[0]
        log_path = logs / f"{background.name}.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(
                pytest_command(background, extra), cwd=REPO, env=env, stdout=log, stderr=log
            )
            foreground = TOGETHER[1]
            codes[foreground.name] = subprocess.run(
                pytest_command(foreground, extra), cwd=REPO, env=env, check=False
            ).returncode
            took[foreground.name] = time.monotonic() - began
            codes[background.name] = process.wait()
            took[background.name] = time.monotonic() - began
        print(f"\n===== e2e lane {background.name!r} (beside the cluster lane) =====")
        print(log_path.read_text(errors="replace"), flush=True)
        alone = time.monotonic()
        codes[ALONE.name] = subprocess.run(
            pytest_command(ALONE, extra), cwd=REPO, env=env, check=False
        ).returncode
        took[ALONE.name] = time.monotonic() - alone
    finally:
        if started and os.environ.get("SPECDEPLOY_KEEP_CLUSTER") != "1":
            down()
    summary = ", ".join(
        f"{name} {seconds:.0f} s (exit {codes[name]})" for name, seconds in took.items()
    )
    print(f"e2e lanes: {summary}; {time.monotonic() - began:.0f} s in all", flush=True)
    return verdict(codes)


if __name__ == "__main__":
    raise SystemExit(main())
