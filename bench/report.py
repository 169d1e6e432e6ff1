"""The report of `make bench`: bench/results/report.md, PNG plots beside it, and the latest table
in docs/benchmarks.md (between its `bench:latest` markers), from the JSON files in bench/results/.

    make bench-report       # or: PYTHONPATH=operator:e2e:. python -m bench.report

Reads only what the benchmarks wrote; a missing file is named in the report as not measured.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.confidence import Direction, Figure, Verdict
from bench.figures import (
    autotune_figures,
    bound_for,
    passthrough_figures,
    reaction_figures,
    recorded_figures,
    rollout_figures,
)
from bench.record import (
    LOAD_BOUND_PER_CPU,
    REPO,
    RESULTS,
    machine_of,
    read_result,
    recorded_peak_load,
)
from specdeploy.adapters import watch_cache

DOC = REPO / "docs" / "benchmarks.md"
BEGIN, END = "<!-- bench:latest:begin -->", "<!-- bench:latest:end -->"


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    found: dict[str, Any] = json.loads(path.read_text())
    return found


def verdict(value: float | None, target: float, higher_is_better: bool = False) -> str:
    if value is None:
        return "not measured"
    met = value >= target if higher_is_better else value <= target
    return "met" if met else "**missed**"


def fmt(value: Any, unit: str = "") -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.3g}{unit}" if abs(value) < 100 else f"{value:,.0f}{unit}"
    return f"{value}{unit}"


# --- plots -----------------------------------------------------------------------------------


def plot_p1(kwok: dict[str, Any] | None, engine: dict[str, Any] | None) -> str | None:
    settings = [(n, r) for n, r in (("KWOK pods", kwok), ("CPU engines", engine)) if r]
    if not settings:
        return None
    figure, axes = plt.subplots(1, len(settings), figsize=(4.5 * len(settings), 3.6))
    axes_list = [axes] if len(settings) == 1 else list(axes)
    for ax, (title, result) in zip(axes_list, settings, strict=True):
        for x, key in enumerate(("raw", "sd")):
            values = result[f"{key}_seconds"]
            ax.bar(x, result[f"{key}_median_s"], color=("#999", "#36c")[x], alpha=0.6)
            ax.scatter([x] * len(values), values, color="k", s=12, zorder=3)
        ax.set_xticks([0, 1], ["raw Deployment", "SD"])
        ax.set_ylabel("seconds to ready")
        ax.set_title(f"{title}: ratio {result['ratio']} (target ≤ {result['target_ratio']})")
    figure.tight_layout()
    figure.savefig(RESULTS / "p1-rollout.png", dpi=110)
    plt.close(figure)
    return "p1-rollout.png"


def key(name: str) -> Callable[[dict[str, Any]], Any]:
    return lambda point: point.get(name)


def plot_scale(scale: dict[str, Any] | None) -> str | None:
    if not scale or not scale.get("points"):
        return None
    points = scale["points"]
    counts = [p["sds"] for p in points]
    panels: list[tuple[str, list[tuple[str, Callable[[dict[str, Any]], Any]]], float | None]] = [
        ("seconds until all Ready", [("all Ready", key("all_ready_s"))], None),
        (
            "operator RSS (MiB)",
            [("idle", key("rss_idle_mib")), ("after resync", key("rss_after_resync_mib"))],
            250,
        ),
        (
            "API requests per idle minute",
            [("reads", key("idle_reads_per_min")), ("writes", key("idle_writes_per_min"))],
            None,
        ),
        ("seconds to resync after a restart", [("resync", key("resync_s"))], 30),
        (
            "reconcile duration (s)",
            [("p50", key("reconcile_p50_s")), ("p99", key("reconcile_p99_s"))],
            None,
        ),
    ]  # fmt: skip
    figure, grid = plt.subplots(2, 3, figsize=(12, 6.5))
    axes = list(grid.flat)
    axes[-1].axis("off")
    for ax, (title, series, target) in zip(axes, panels, strict=False):
        for label, pick in series:
            xs = [c for c, p in zip(counts, points, strict=True) if pick(p) is not None]
            ys = [pick(p) for p in points if pick(p) is not None]
            ax.plot(xs, ys, marker="o", label=label)
        if target is not None:
            ax.axhline(target, color="r", linestyle="--", linewidth=1, label="target")
        ax.set_xscale("log")
        ax.set_xlabel("SpeculativeDeployments")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(RESULTS / "p2-scale.png", dpi=110)
    plt.close(figure)
    return "p2-scale.png"


def reaction_rows(p3: dict[str, Any]) -> list[tuple[str, Any, float, Any, Any]]:
    """(what, measured or None, specdeploy floor, Argo Rollouts, Flagger) in seconds.

    The floor is the one the result was judged against (`floor_s`, the figure's too); a result
    without one (before the benchmark wrote it) counts a scrape interval into it, as it did
    then. Argo Rollouts' and Flagger's columns count what specdeploy's floor counts, so the
    columns compare: a verdict takes what Prometheus holds at its interval's end, in all three."""
    interval, limit, scrape = p3["interval_s"], p3["failure_limit"], p3["scrape_s"]
    rollback = p3.get("rollback") or {}
    collapse = p3.get("collapse") or {}
    floor = rollback.get("floor_s", scrape + interval * limit)
    added = floor - interval * limit  # what the floor counts beyond the intervals
    return [
        (
            "bad canary → stable only",
            rollback.get("seconds"),
            floor,
            # Argo: a measurement at once, then each interval; Failed when failed >
            # failureLimit, so failureLimit 1 rolls back at the 2nd failure (same count).
            added + interval * (limit - 1),
            # Flagger: one check per interval tick; rollback when failedChecks >= threshold.
            added + interval * limit,
        ),
        (
            "collapse → fallback decided",
            collapse.get("decided_s"),
            collapse.get("floor_s", scrape + p3["collapse_for_s"]),
            "no equivalent",
            "no equivalent",
        ),
    ]


def plot_p3(p3: dict[str, Any] | None) -> str | None:
    if not p3 or "rollback" not in p3:
        return None
    figure, ax = plt.subplots(figsize=(6.5, 3.4))
    labels = ["rollback", "collapse (decided)"]
    measured = [p3["rollback"]["seconds"], (p3.get("collapse") or {}).get("decided_s", 0)]
    floors = [p3["rollback"]["floor_s"], (p3.get("collapse") or {}).get("floor_s", 0)]
    xs = range(len(labels))
    ax.bar([x - 0.2 for x in xs], floors, width=0.4, color="#999", label="floor")
    ax.bar([x + 0.2 for x in xs], measured, width=0.4, color="#36c", label="measured")
    ax.axhline(0, color="k", linewidth=0.5)
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("seconds")
    ax.legend(fontsize=8)
    ax.set_title("P3 reaction vs its floor")
    figure.tight_layout()
    figure.savefig(RESULTS / "p3-reaction.png", dpi=110)
    plt.close(figure)
    return "p3-reaction.png"


def plot_passthrough(p4: dict[str, Any] | None) -> str | None:
    if not p4:
        return None
    figure, axes = plt.subplots(1, 2, figsize=(7, 3.2))
    for ax, key, title in (
        (axes[0], "tokens_per_s", "output tokens/s"),
        (axes[1], "itl_median_ms", "inter-token latency (ms)"),
    ):
        ax.bar([0, 1], [p4["hand"][key], p4["operator"][key]], color=["#999", "#36c"])
        ax.set_xticks([0, 1], ["by hand", "by the operator"])
        ax.set_title(title, fontsize=9)
    figure.tight_layout()
    figure.savefig(RESULTS / "p4-passthrough.png", dpi=110)
    plt.close(figure)
    return "p4-passthrough.png"


# --- the report ------------------------------------------------------------------------------


def autotune_section(tune: dict[str, Any] | None) -> str:
    if not tune:
        return "_bench-autotune not run_"
    parts = [tune.get("what", "")]
    for name, w in tune["workloads"].items():
        rows = [
            (
                r["k"],
                r["output_tokens_per_s"],
                r.get("step_seconds") and round(r["step_seconds"] * 1000, 2),
                ", ".join(f"{a / r['drafts']:.2f}" for a in r["accepted_per_position"])
                if r.get("drafts")
                else "—",
                "operator" if r["k"] == w["operator"]["chosen"] else "",
            )
            for r in w["sweep"]
        ]
        path = " → ".join(str(step["served"]) for step in w["operator"]["path"])
        confirmed = w.get("head_to_head")
        checked = (
            f" Measured again side by side, k={confirmed['operator_k']} against the sweep's "
            f"best k={confirmed['oracle_k']}: ratio {confirmed['ratio']} (median of the rounds "
            f"{', '.join(str(r) for r in confirmed['ratios'])})."
            if confirmed
            else ""
        )
        parts.append(
            f"**{name}** (draft `{w['draft']}`): the operator went k {path} "
            f"→ {w['operator']['chosen']}.{checked}\n\n"
            + table(["k", "output tokens/s", "step (ms)", "acceptance by position", ""], rows)
        )
    if tune.get("recomputed"):
        parts.append(
            f"The operator's choice was recomputed on {tune['recomputed']} from the sweep "
            f"measured on {tune.get('date')} (`python -m bench.autotune --from-json`)"
            + (
                ", and the head-to-head rounds measured again then (`--confirm-again`)."
                if tune.get("confirmed")
                else "."
            )
        )
    return "\n\n".join(parts)


def scale_rows(scale: dict[str, Any] | None) -> list[tuple[str, str, str, str, str, str]]:
    """P2 (one run per number of SDs, absolute figures): (figure, measured, interval, target,
    load, verdict). The timed ones give no verdict when the machine was busier than its bound;
    memory and request counts do not move with the load."""
    points = (scale or {}).get("points") or []
    if not scale or not points:
        return [("P2 scale", "—", "—", "—", "—", "not measured")]
    peak, bound = recorded_peak_load(scale, "scale"), bound_for(scale)
    busy = peak is None or peak > bound
    load_text = f"{fmt(peak)} (bound {bound:g})"
    largest, first = points[-1], points[0]

    def timed(value: Any, target: float) -> str:
        return "inconclusive (load)" if busy else verdict(value, target)

    growth = (
        largest["idle_reads_per_min"] / first["idle_reads_per_min"]
        if first.get("idle_reads_per_min")
        else None
    )
    # The stores' check is one LIST (of the objects' metadata) of each cached kind a minute,
    # whatever the number of SDs: an idle window sees up to that many reads at any size.
    flat = (largest.get("idle_reads_per_min") or 0) <= max(
        1.5 * (first.get("idle_reads_per_min") or 0), RESYNC_LISTS
    )
    sds = largest["sds"]
    one = "one run"
    return [
        (f"P2 operator RSS at {sds} SDs", f"{largest.get('rss_idle_mib')} MiB "
         f"({first.get('rss_idle_mib')} at {first['sds']})", one, "≤ 250 MiB", load_text,
         verdict(largest.get("rss_idle_mib"), 250)),
        (f"P2 operator RSS after a restart at {sds} SDs",
         f"{largest.get('rss_after_resync_mib')} MiB "
         f"({first.get('rss_after_resync_mib')} at {first['sds']})", one, "≤ 250 MiB", load_text,
         verdict(largest.get("rss_after_resync_mib"), 250)),
        (f"P2 idle API writes/min at {sds} SDs", fmt(largest.get("idle_writes_per_min")),
         one, "0", load_text, verdict(largest.get("idle_writes_per_min"), 0)),
        (f"P2 idle API reads/min at {sds} SDs", f"{fmt(largest.get('idle_reads_per_min'))} "
         f"({fmt(first.get('idle_reads_per_min'))} at {first['sds']}, x {fmt(growth)})", one,
         "not growing with #SDs", load_text,
         "one point only" if largest is first else ("met" if flat else "**missed**")),
        (f"P2 resync after a restart at {sds} SDs", f"{fmt(largest.get('resync_s'))} s "
         f"({largest.get('resynced')} of {sds} reconciled)", one, "≤ 30 s", load_text,
         timed(largest.get("resync_s"), 30)),
        (f"P2 API writes of the resync at {sds} SDs", fmt(largest.get("resync_writes")), one,
         "0", load_text, verdict(largest.get("resync_writes"), 0)),
        (f"P2 Events dropped while {sds} SDs came up", fmt(largest.get("events_dropped")), one,
         "0", load_text, verdict(largest.get("events_dropped"), 0)),
        (f"P2 all Ready at {sds} SDs", f"{fmt(largest.get('all_ready_s'))} s "
         f"({largest.get('ready')} of {sds})", one, "—", load_text,
         "reached" if largest.get("all_ready_s") is not None else "**not all Ready**"),
    ]  # fmt: skip


def figure_rows(figures: list[Figure]) -> list[tuple[str, str, str, str, str, str]]:
    """(figure, median ratio and rounds, 95 % interval, target, load, verdict) of each figure."""
    rows = []
    for f in figures:
        side = "≥" if f.direction is Direction.AT_LEAST else "≤"
        shown = f"**{f.verdict}**" if f.verdict is not Verdict.MET else str(f.verdict)
        rows.append(
            (
                f.name,
                f"{f.median:.3g} ({len(f.rounds)} round{'s' if len(f.rounds) != 1 else ''})",
                f"{f.low:.3g} to {f.high:.3g}",
                f"{side} {f.target:g}",
                f"{fmt(f.load)} (bound {fmt(f.load_bound)})",
                shown,
            )
        )
    return rows


def autotune_choice_row(tune: dict[str, Any] | None) -> list[tuple[str, str, str, str, str, str]]:
    """Whether the two workloads got different choices of k (a fact, not a ratio)."""
    if not tune or len(tune["workloads"]) < 2:
        return []
    chosen = {name: w["operator"]["chosen"] for name, w in tune["workloads"].items()}
    differ = len(set(chosen.values())) == len(chosen)
    return [
        (
            "P4 autotune, the workloads' choices differ",
            ", ".join(f"{n} k={k}" for n, k in chosen.items()),
            "—",
            "different",
            "—",
            "met" if differ else "**missed**",
        )
    ]


#: LISTs of one round of the stores' check (at most one per cached kind,
#: adapters.watch_cache.KINDS): reads an idle minute may hold at any number of SDs.
RESYNC_LISTS = len(watch_cache.KINDS)

#: What limits each figure when its target is missed (the measured figure is beside it).
LIMITS = {
    "P1 rollout overhead, KWOK pods": (
        "two hops the raw Deployment does not have (the SD's watch event to the operator, then the "
        "Ready status write and its watch event, 20 to 40 ms together), and the Deployment "
        "itself starting later beside the operator's own writes for the SD (Service, "
        "ControllerRevision, status) and its handling of the watch events, which share the "
        "API server and the CPUs with the controllers that make it ready (the SD is Ready "
        "when its pod is, not when the Deployment controller counts it)"
    ),
    "P1 rollout overhead, CPU engines": (
        "the raw Deployment runs the SD's own pod template (the launcher's pair check "
        "included), so the engine's start dominates both sides and the operator's part is the "
        "control-plane time P1 on KWOK pods measures; on a shared CPU one engine start varies "
        "by more than that, and few runs do not average it out"
    ),
    "P2 idle API reads/min": (
        "observe() reads watch-fed stores; an idle operator's only reads are the stores' check "
        "(one LIST of the objects' metadata per kind that holds anything, every 60 s), the Kueue "
        "webhook check every 5 minutes, and watch renewals"
    ),
    "P2 resync after a restart": (
        "the process start (imports), one LIST of each cached kind in pages of 100, then one "
        "reconcile per SD, 8 at a time, beside kopf's own listing of every watched kind, in "
        "one Python process on a shared CPU"
    ),
    "P2 Events dropped": (
        "one thread posts the operator's Events, one POST at a time, and holds at most 1,000 "
        "waiting, dropping the rest (client-go's event recorder has the same bound, "
        "maxQueuedEvents); 1,000 new SDs ask for about 3,000 within 4 minutes, while the same "
        "Python process reconciles them and the API server on the same 2 CPUs writes them"
    ),
    "P2 operator RSS": (
        "the process and its imports (about 90-105 MiB at 10 SDs), kopf's per-object worker "
        "tasks while events come, and the stores' compact JSON (about 11 KiB per SD); after a "
        "restart, the high-water mark of listing every kind"
    ),
    "P2 all Ready": (
        "each new SD costs two to three reconciles (no API reads, four writes) and kopf's "
        "handling of the watch events of its children, in one Python process on a shared CPU"
    ),
    "P3 reaction (the rest)": (
        "the analysis never reached a verdict: it needs minDraftTokens of draft tokens in its "
        "window, and the engines, starved by the machine's load, drafted fewer (see the error)"
    ),
    "P3 bad canary": (
        "each verdict is taken as its interval closes (plan.rollout.wakeup) and the rollback "
        "takes the "
        "canary's pod out of the Service at once; what remains is the data: a verdict needs "
        "minDraftTokens of draft tokens in its window, and a canary starved of CPU drafts fewer "
        "(Inconclusive: the analysis holds), and the analysis starts only when the canary's pod "
        "is ready, which can trail its first answered request"
    ),
    "P3 collapse": (
        "the guard fires `for` after a reconcile first sees acceptance below its floor in "
        "Prometheus (a scrape after the traffic), at the moment that falls due "
        "(plan.rollout.wakeup)"
    ),
    "P4 autotune": (
        "the operator's model predicts from one window at the served k and the step times of "
        "the lengths it served, and keeps its k unless another is predicted minGain faster; "
        "the sweep's tokens/s are ratios to k=5 over a few paired rounds on a shared 2-core "
        "machine whose rounds of the same k differ by up to twofold, so its best is partly "
        "noise (the head-to-head ratio, when there is one, measures the two k directly)"
    ),
    "P4 engine pass-through": (
        "the operator adds nothing in the data path (the launcher execs vLLM with the same "
        "command line and environment; differences between the two processes are listed in "
        "the P4 section); both engines run at once, measured in alternating rounds, so what "
        "remains is the shared CPU's noise between rounds"
    ),
}


def verdicts_section(figures: list[Figure], rows: list[tuple[str, ...]]) -> str:
    """Why each figure is not met: what limits a missed one, why an inconclusive one says
    nothing either way."""
    lines = []
    for f in figures:
        if f.verdict is Verdict.MET:
            continue
        line = f"- **{f.name}** ({f.verdict}): {f.reason}."
        if f.verdict is Verdict.MISSED:
            why = next((v for k, v in LIMITS.items() if f.name.startswith(k)), "see below")
            line += f" Limited by: {why}."
        lines.append(line)
    for figure, measured, _, target, load, result in rows:
        if "missed" in result or "not all" in result or "inconclusive" in result:
            why = next((v for k, v in LIMITS.items() if figure.startswith(k)), "see below")
            lines.append(
                f"- **{figure}** ({result.strip('*')}): {measured}, target {target}, load {load}."
                + (f" Limited by: {why}." if "missed" in result else "")
            )
    return "\n".join(lines) or "None: every figure met its target."


def table(header: list[str], rows: list[tuple[Any, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def passthrough_rounds(p4: dict[str, Any] | None) -> str:
    """Each round's figures of both sides, and what differed between the two processes."""
    if not p4 or "tokens_per_s_rounds" not in p4.get("operator", {}):
        return ""
    operator, hand = p4["operator"], p4["hand"]
    differences = p4.get("context_differences") or []
    lines = [
        f"Rounds (tokens/s): operator {operator['tokens_per_s_rounds']}, "
        f"by hand {hand['tokens_per_s_rounds']}; inter-token latency (ms): operator "
        f"{operator['itl_ms_rounds']}, by hand {hand['itl_ms_rounds']}.",
        "",
        "Environment, CPUs allowed, niceness and cgroup of the two vLLM processes (/proc): "
        + ("identical." if not differences else "; ".join(differences) + "."),
    ]
    return "\n".join(lines)


HOW_TO_READ = (
    "Each figure is the median of per-round ratios against a baseline measured in the same run "
    "(run i of one side against run i of the other, which alternate), with a 95 % interval "
    "from resampling the rounds (bootstrap of the median). Met: the whole interval on the "
    "target's side; missed: the whole interval on the other side; inconclusive: the interval "
    "straddles the target, fewer than 5 rounds, or the 1-minute load average went above the "
    f"bound ({LOAD_BOUND_PER_CPU:g} per CPU) while the part ran. Absolute times are context only."
)


def load_section(results: dict[str, dict[str, Any] | None]) -> str:
    """The load each part ran under: sampled during the part, or for older results only the
    load averages when the file was written (a lower bound of what the part saw)."""
    rows = []
    for name, result in results.items():
        if not result:
            continue
        bound = bound_for(result)
        parts = result.get("load")
        if isinstance(parts, dict) and parts:
            for part, seen in parts.items():
                rows.append(
                    (name, part, f"{seen['started']} to {seen['ended']}",
                     f"{seen['min']} to {seen['max']} (mean {seen['mean']})", f"{bound:g}")
                )  # fmt: skip
        else:
            written = machine_of(result).get("load_average")
            rows.append(
                (name, "(whole file)", machine_of(result).get("date", "—"),
                 f"1/5/15-min averages {written} when written (not sampled during the part)",
                 f"{bound:g}")
            )  # fmt: skip
    return table(["result", "part", "when", "1-min load average", "bound"], rows)


def context_line(*results: dict[str, Any] | None) -> str:
    machines = [r["machine"] for r in results if r and "date" in r.get("machine", {})]
    if not machines:
        return "no results yet"
    latest = max(machines, key=lambda m: m["date"])
    commits = sorted({m.get("commit", "unknown") for m in machines})
    loads = [m["load_average"][0] for m in machines if m.get("load_average")]
    load = (
        f", 1-min load average {min(loads)} to {max(loads)} as results were written"
        if loads
        else ""
    )
    return (
        f"{latest['date']}, {latest['cpus']} CPUs ({latest['platform']}), "
        f"commit {', '.join(commits)}{load}"
    )


def scale_table(scale: dict[str, Any] | None) -> str:
    points = (scale or {}).get("points") or []
    if not points:
        return "_not measured_"
    rows = [
        (
            p["sds"],
            p["bench_nodes"],
            f"{fmt(p.get('all_ready_s'))} ({p.get('ready')} Ready)",
            p.get("rss_idle_mib"),
            p.get("rss_after_resync_mib"),
            fmt(p.get("idle_reads_per_min")),
            fmt(p.get("idle_writes_per_min")),
            fmt(p.get("reconciles_idle_per_min")),
            fmt(p.get("resync_s")),
            fmt(p.get("resync_writes")),
            fmt(p.get("events_dropped")),
            fmt(p.get("reconcile_p50_s")),
            fmt(p.get("reconcile_p99_s")),
        )
        for p in points
    ]
    header = [
        "SDs", "bench nodes", "all Ready (s)", "RSS idle (MiB)", "RSS after restart (MiB)",
        "idle reads/min", "idle writes/min", "reconciles/idle min", "resync (s)",
        "resync writes", "Events dropped", "reconcile p50 (s)", "reconcile p99 (s)",
    ]  # fmt: skip
    largest = points[-1]
    reads = largest.get("idle_requests") or {}
    top = sorted(reads.items(), key=lambda kv: -kv[1])[:8]
    detail = ", ".join(f"`{k}` {v}" for k, v in top)
    return table(header, rows) + f"\n\nIdle requests at {largest['sds']} SDs by kind: {detail}."


def reaction_section(p3: dict[str, Any] | None) -> str:
    if not p3:
        return "_not measured_"

    def seconds(value: Any) -> str:
        if isinstance(value, int | float):
            return f"{value:.3g} s"
        return str(value or "not measured")

    rows = [(row[0], *(seconds(v) for v in row[1:])) for row in reaction_rows(p3)]
    text = table(["", "measured", "floor", "Argo Rollouts", "Flagger"], rows) if rows else ""
    return (
        text + f"\n\nSame settings for all three: interval {p3['interval_s']} s, two failed "
        f"verdicts roll back, Prometheus scrape {p3['scrape_s']} s. Argo Rollouts "
        "(analysis/analysis.go) takes a measurement when the AnalysisRun starts and then one "
        "per `interval`, and fails the run when `failed > failureLimit`: two failures need "
        "`failureLimit: 1` and arrive one interval after the start. Flagger runs one check per "
        "`analysis.interval` tick and rolls back when `failedChecks >= threshold`: `threshold: "
        "2` rolls back at the second tick. Each column counts what specdeploy's floor counts, "
        "so the columns compare. Both then shift traffic back through a mesh "
        "or ingress; specdeploy scales the canary's Deployment to zero, so its floor includes "
        "no traffic-shift time but its measured time includes the pod leaving the Service."
    )


def main(argv: list[str] | None = None) -> int:
    del argv  # no options
    kwok, engine = load("p1-kwok"), load("p1-engine")
    scale, p3, p4 = load("scale"), load("p3-reaction"), load("passthrough")
    plan, engine_cpu = load("plan"), load("engine-cpu")
    tune = load("autotune")
    plots = [
        p
        for p in (plot_p1(kwok, engine), plot_scale(scale), plot_p3(p3), plot_passthrough(p4))
        if p
    ]
    if tune and (RESULTS / "autotune.png").exists():
        plots.append("autotune.png")  # written by bench-autotune, the chosen k marked
    named = {
        "p1-kwok": kwok,
        "p1-engine": engine,
        "scale": scale,
        "p3-reaction": p3,
        "passthrough": p4,
        "autotune": tune,
        "plan": plan,
        "engine-cpu": engine_cpu,
    }
    others = {
        path.stem: read_result(path.stem) or {}
        for path in sorted(RESULTS.glob("*.json"))
        if path.stem not in named and not path.stem.endswith(".raw")
    }
    figures = (
        rollout_figures(kwok, engine)
        + passthrough_figures(p4)
        + reaction_figures(p3)
        + autotune_figures(tune)
        + recorded_figures({**{k: v for k, v in named.items() if v}, **others})
    )
    rows = scale_rows(scale) + autotune_choice_row(tune)
    header = [
        "figure",
        "median ratio (rounds)",
        "95 % interval",
        "target",
        "load (peak)",
        "verdict",
    ]
    summary = table(header, [*figure_rows(figures), *rows])
    explained = verdicts_section(figures, list(rows))
    context = context_line(kwok, engine, scale, p3, p4, tune)
    report = [
        "# specdeploy benchmarks (`make bench`)",
        "",
        f"Measured {context}. {HOW_TO_READ}",
        "",
        "## Summary",
        "",
        summary,
        "",
        "## Verdicts other than met, and why",
        "",
        explained,
        "",
        "## The load during each part",
        "",
        load_section(named),
        "",
        "## P1: rollout overhead",
        "",
        *(
            f"- {r['what']}: SD {r['sd_seconds']} s, raw {r['raw_seconds']} s."
            for r in (kwok, engine)
            if r
        ),
        "",
        "## P2: scale",
        "",
        (scale or {}).get("what", ""),
        "",
        scale_table(scale),
        "",
        "## P3: reaction",
        "",
        (p3 or {}).get("what", ""),
        "",
        reaction_section(p3),
        "",
        "## P4: engine pass-through",
        "",
        (p4 or {}).get("what", "_not measured_"),
        "",
        passthrough_rounds(p4),
        "",
        f"Command: `{' '.join((p4 or {}).get('command', []))}`" if p4 else "",
        "",
        "## P4: the autotuner's k against a sweep (`bench-autotune`)",
        "",
        autotune_section(tune),
        "",
        "## Planning cost (`bench-plan`) and the engine itself (`bench-engine`)",
        "",
        planning_table(plan),
        "",
        engine_table(engine_cpu),
        "",
        "## Plots",
        "",
        *(f"![{p}]({p})" for p in plots),
        "",
    ]  # fmt: skip
    (RESULTS / "report.md").write_text("\n".join(report))
    update_doc(f"{HOW_TO_READ}\n\n{summary}\n\n{explained}", context)
    print(f"wrote {RESULTS / 'report.md'} and {len(plots)} plots", file=sys.stderr)
    return 0


def planning_table(plan: dict[str, Any] | None) -> str:
    if not plan:
        return "_bench-plan not run_"
    rows = [
        (name, r["microseconds_per_reconcile_best"], r["reconciles_per_second_one_core"])
        for name, r in plan["results"].items()
    ]
    return table(["example", "µs per reconcile (best)", "reconciles/s on one core"], rows)


def engine_table(engine_cpu: dict[str, Any] | None) -> str:
    if not engine_cpu:
        return "_bench-engine not run_"
    rows = []
    for mode, result in engine_cpu["results"].items():
        if "levels" in result:  # paired: the draft's engine beside the one without speculation
            for level in result["levels"]:
                base = statistics.median(r["output_tokens_per_s"] for r in level["base"])
                spec = statistics.median(r["output_tokens_per_s"] for r in level["speculation"])
                rates = [r.get("acceptance_rate") for r in level["speculation"]]
                rows.append((mode, level["concurrency"], f"{spec:.1f} vs {base:.1f}",
                             level["ratios"], rates[-1]))  # fmt: skip
            continue
        for run in result["runs"]:  # older results: one engine at a time, not paired
            rows.append(
                (mode, run["concurrency"], run["output_tokens_per_s"], "—",
                 run.get("acceptance_rate"))
            )  # fmt: skip
    return table(
        ["engine", "concurrency", "output tokens/s (median: with vs without the draft)",
         "ratio per round", "acceptance"],
        rows,
    )  # fmt: skip


def update_doc(summary: str, context: str) -> None:
    text = DOC.read_text()
    block = (
        f"{BEGIN}\nLatest `make bench`: {context}. Full report and plots: "
        f"[bench/results/report.md](../bench/results/report.md).\n\n{summary}\n{END}"
    )
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Latest results\n\n" + block + "\n"
    DOC.write_text(text)


if __name__ == "__main__":
    raise SystemExit(main())
