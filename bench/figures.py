"""The figures of each benchmark's result file, judged from their paired rounds.

Pure: a result (the JSON a benchmark wrote) in, `confidence.Figure`s out. Each figure's rounds
are the per-round ratios the result recorded (run i of the SD against run i of the raw
Deployment, round i of the operator's engine against round i of the hand-started one, ...);
its load is the highest load the part saw (or, for results written before parts recorded
their load, the highest load average when the file was written), against the bound of the
machine it ran on.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import Any

from bench.confidence import Direction, Figure, Verdict, judge, judge_paired
from bench.record import LOAD_BOUND_ENV, LOAD_BOUND_PER_CPU, machine_of, recorded_peak_load

Result = Mapping[str, Any]


def bound_for(result: Result) -> float:
    """The load bound of the machine a result was measured on."""
    override = os.environ.get(LOAD_BOUND_ENV)
    if override:
        return float(override)
    cpus = int(machine_of(result).get("cpus") or 1)
    return LOAD_BOUND_PER_CPU * cpus


def _load(result: Result, part: str | None) -> dict[str, Any]:
    return {"load": recorded_peak_load(result, part), "load_bound": bound_for(result)}


def rollout_figures(kwok: Result | None, engines: Result | None) -> list[Figure]:
    """P1: the SD's time to Ready over the raw Deployment's, run by run (the runs alternate)."""
    figures = []
    for name, result in (
        ("P1 rollout overhead, KWOK pods", kwok),
        ("P1 rollout overhead, CPU engines", engines),
    ):
        if result is None:
            continue
        figures.append(
            judge_paired(
                name,
                result["sd_seconds"],
                result["raw_seconds"],
                float(result["target_ratio"]),
                Direction.AT_MOST,
                context=f"SD {result['sd_seconds']} s against raw {result['raw_seconds']} s",
                **_load(result, "p1"),
            )
        )
    return figures


def passthrough_figures(p4: Result | None) -> list[Figure]:
    """P4 pass-through: the operator's engine against the same command line started by hand,
    round by round: tokens/s operator / hand, inter-token latency hand / operator."""
    if not p4 or "tokens_per_s_rounds" not in p4.get("operator", {}):
        return []
    operator, hand = p4["operator"], p4["hand"]
    target = float(p4.get("target_ratio", 0.97))
    load = _load(p4, "p4")
    return [
        judge_paired(
            "P4 engine pass-through, tokens/s",
            operator["tokens_per_s_rounds"],
            hand["tokens_per_s_rounds"],
            target,
            Direction.AT_LEAST,
            context=f"operator {operator['tokens_per_s_rounds']} against by hand "
            f"{hand['tokens_per_s_rounds']} tokens/s",
            **load,
        ),
        judge_paired(
            "P4 engine pass-through, inter-token latency (hand / operator)",
            hand["itl_ms_rounds"],
            operator["itl_ms_rounds"],
            target,
            Direction.AT_LEAST,
            context=f"operator {operator['itl_ms_rounds']} against by hand "
            f"{hand['itl_ms_rounds']} ms",
            **load,
        ),
    ]


def reaction_figures(p3: Result | None) -> list[Figure]:
    """P3: each reaction over its floor, run by run. A reaction measured below its floor means
    the clock is wrong (the operator cannot act sooner than the floor): no verdict then."""
    figures: list[Figure] = []
    if not p3:
        return figures
    parts = (
        ("rollback", "P3 bad canary → stable only, over floor", "seconds"),
        ("collapse", "P3 collapse → fallback decided, over floor", "decided_s"),
    )
    for key, name, seconds_key in parts:
        part = p3.get(key)
        if not part:
            continue
        runs: Sequence[float] = part.get("runs_s") or [part[seconds_key]]
        floor = float(part["floor_s"])
        figure = judge(
            name,
            [seconds / floor for seconds in runs],
            float(p3.get("target_ratio", 1.2)),
            Direction.AT_MOST,
            context=f"{list(runs)} s against a floor of {floor:g} s",
            **_load(p3, "p3"),
        )
        if min(runs) < floor:
            figure = dataclasses.replace(
                figure,
                verdict=Verdict.INCONCLUSIVE,
                reason=f"{min(runs):g} s is below the floor of {floor:g} s: the clock of this "
                "measurement is wrong, no verdict",
            )
        figures.append(figure)
    return figures


def autotune_figures(tune: Result | None) -> list[Figure]:
    """P4 autotune, per workload: the operator's k against the sweep's best (head to head when
    they differ; an identity when they are the same k) and against k=5 (its rounds beside
    k=5 in the sweep)."""
    figures: list[Figure] = []
    if not tune:
        return figures
    load = _load(tune, None)
    for name, workload in tune["workloads"].items():
        chosen = workload["operator"]["chosen"]
        oracle = workload["oracle_best_k"]
        vs_oracle = f"P4 autotune {name}, k={chosen} vs the oracle's k={oracle}"
        confirmed = workload.get("head_to_head")
        if chosen == oracle:
            figures.append(judge(vs_oracle, [1.0], 0.95, Direction.AT_LEAST, exact=True, **load))
        elif confirmed:
            figures.append(
                judge(
                    vs_oracle,
                    confirmed["ratios"],
                    0.95,
                    Direction.AT_LEAST,
                    context="head to head, alternating rounds",
                    **load,
                )
            )
        else:
            figures.append(
                judge(vs_oracle, [workload["operator_vs_oracle"]], 0.95, Direction.AT_LEAST, **load)
            )
        vs_default = f"P4 autotune {name}, k={chosen} vs k=5"
        if chosen == 5:
            figures.append(judge(vs_default, [1.0], 1.0, Direction.AT_LEAST, exact=True, **load))
        else:
            [row] = [r for r in workload["sweep"] if r["k"] == chosen]
            rounds = row.get("vs_default_k_rounds") or [workload["operator_vs_default_k"]]
            figures.append(
                judge(
                    vs_default,
                    rounds,
                    1.0,
                    Direction.AT_LEAST,
                    context="beside the k=5 engine, alternating rounds",
                    **load,
                )
            )
    return figures


def recorded_figures(results: Mapping[str, Result]) -> list[Figure]:
    """Figures a benchmark judged itself and wrote in its result's `figures`."""
    return [
        Figure.from_json(figure)
        for _, result in sorted(results.items())
        for figure in result.get("figures") or []
    ]
