"""`make soak`: the operator SIGKILLed at many random moments of real canaries and a collapse.

Runs the engine canary tests (a bad draft rolled back, a good one promoted, on real CPU vLLM
engines) and the collapse test (a drifting head switched off, on the simulator's 70B pair) on
the local test bed, each with
`--kills` operator kills at seeded random moments (e2e/fault_injection.py). Each test checks
the same outcome as an undisturbed run, the history (status.revisions and its verdicts) intact,
verdict intervals strictly increasing (none counted twice) and a Ready pod of some revision at
every sample. Writes bench/results/soak.json and bench/results/soak.md; exits non-zero when a
test failed or fewer than `--min-kills` kills happened.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import REPO, RESULTS

TESTS = "rolled_back or promoted or switched_off"


def run_tests(
    seed: int,
    kills: int,
    spread: float,
    results: Path,
    *,
    window: int,
    interval: int,
    tests: str = TESTS,
) -> tuple[int, float]:
    env = {
        **os.environ,
        "SPECDEPLOY_E2E_REQUIRED": "1",
        "SPECDEPLOY_FAULT_SEED": str(seed),
        "SPECDEPLOY_FAULT_KILLS": str(kills),
        "SPECDEPLOY_FAULT_SPREAD": str(spread),
        "SPECDEPLOY_FAULT_RESULTS": str(results),
        "SPECDEPLOY_CANARY_WINDOW_SECONDS": str(window),
        "SPECDEPLOY_CANARY_INTERVAL_SECONDS": str(interval),
        "PYTHONPATH": os.pathsep.join([str(REPO / "operator"), str(REPO / "e2e"), str(REPO)]),
    }
    command = [sys.executable, "-m", "pytest", "-m", "e2e", "-p", "no:cacheprovider", "-q"]
    command += ["-rA", str(REPO / "e2e" / "test_canary_engine.py")]
    command += [str(REPO / "e2e" / "test_collapse_sim.py"), "-k", tests]
    began = time.monotonic()
    done = subprocess.run(command, env=env, cwd=REPO, check=False)
    return done.returncode, time.monotonic() - began


def merge_runs(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per rollout: the finished run's line, or, when its test failed before the
    end, only the kills its killer wrote (outcome "failed")."""
    finished = {line["seed"]: line for line in lines if "outcome" in line}
    runs = list(finished.values())
    for line in lines:
        if "outcome" not in line and line["seed"] not in finished:
            runs.append({**line, "outcome": "failed"})
    return runs


def summary(report: dict[str, Any]) -> str:
    lines = [
        "# Soak: the operator SIGKILLed during canaries and a collapse fallback",
        "",
        f"`make soak` on {report['date']}: seed {report['seed']}, {report['kills']} kills in "
        f"{len(report['runs'])} rollouts, {report['minutes']} min, pytest exit "
        f"{report['pytest_exit']} ({'passed' if report['passed'] else 'FAILED'}); analysis window "
        f"{report['analysis_window_seconds']} s, interval "
        f"{report.get('analysis_interval_seconds')} s; kill moments drawn inside the analysis' "
        "expected length.",
        "",
        "| rollout | outcome | kills | landed: before / during the analysis / after its outcome "
        "| phases at the kills | verdict intervals | samples | samples with no Ready pod "
        "| samples unknown (API not answering) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        kills = run.get("kills", [])
        phases = ", ".join(str(k["phase"]) for k in kills)
        intervals = run.get("intervals")
        landed = " / ".join(
            str(sum(k.get("landed") == where for k in kills))
            for where in ("before the analysis", "during the analysis", "after the outcome")
        )
        lines.append(
            f"| {run['test']} | {run['outcome']} | {len(kills)} | {landed} | {phases} "
            f"| {intervals if intervals is not None else 'n/a'} | {run.get('samples')} "
            f"| {run.get('samples_without_a_serving_revision')} | {run.get('samples_unknown')} |"
        )
    total = {
        where: sum(k.get("landed") == where for run in report["runs"] for k in run.get("kills", []))
        for where in ("before the analysis", "during the analysis", "after the outcome")
    }
    lines += [
        "",
        "Where the kills landed, all rollouts: "
        + ", ".join(f"{count} {where}" for where, count in total.items())
        + ".",
    ]
    failed = [run["test"] for run in report["runs"] if run["outcome"] == "failed"]
    lines += [
        "",
        "A rollout with an outcome passed every check of its test: the outcome of an undisturbed "
        "run (RolledBack, promoted, speculation Disabled after the collapse) standing after the "
        "last kill, its history and verdicts intact, its verdict intervals strictly increasing, "
        "a Ready pod at every sample. The phases are the SD's as each restarted operator found "
        "it; every kill's moment, analysis interval and restart time are in the JSON file.",
        "",
    ]
    if failed:
        lines += [f"Failed (see the pytest output): {', '.join(failed)}.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="base seed (default: drawn)")
    parser.add_argument("--kills", type=int, default=7, help="operator kills per rollout")
    parser.add_argument("--spread", type=float, default=10.0, help="most seconds between kills")
    parser.add_argument("--min-kills", type=int, default=20)
    parser.add_argument("--tests", default=TESTS, help="pytest -k expression (default: all three)")
    parser.add_argument("--name", default="soak", help="results: bench/results/<name>.json/.md")
    parser.add_argument(
        "--interval",
        type=int,
        default=30,
        help="analysis interval in seconds (CI's 10 s leaves no room for seven kills)",
    )
    parser.add_argument(
        "--window",
        type=int,
        default=60,
        help="analysis window in seconds (wider than CI's 20 s, for a crowded machine)",
    )
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 32)
    print(f"soak: seed {seed}, {args.kills} kills per rollout", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        results = Path(folder) / "runs.jsonl"
        code, seconds = run_tests(
            seed,
            args.kills,
            args.spread,
            results,
            window=args.window,
            interval=args.interval,
            tests=args.tests,
        )
        lines = results.read_text().splitlines() if results.exists() else []
    runs = merge_runs([json.loads(line) for line in lines])
    kills = sum(len(run.get("kills", [])) for run in runs)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seed": seed,
        "kills_per_rollout": args.kills,
        "spread_seconds": args.spread,
        "analysis_window_seconds": args.window,
        "analysis_interval_seconds": args.interval,
        "kills": kills,
        "minutes": round(seconds / 60, 1),
        "pytest_exit": code,
        "passed": code == 0 and kills >= args.min_kills,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / f"{args.name}.md").write_text(summary(report))
    print(summary(report))
    if kills < args.min_kills:
        print(f"soak: only {kills} kills, fewer than {args.min_kills}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
