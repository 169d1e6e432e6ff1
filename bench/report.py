"""The report of `make bench`: bench/results/report.md, PNG plots beside it, and the latest table
in docs/benchmarks.md (between its `bench:latest` markers), from the JSON files in bench/results/.

    make bench-report       # or: PYTHONPATH=operator:e2e:. python -m bench.report

Reads only what the benchmarks wrote; a missing file is named in the report as not measured.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.record import REPO, RESULTS

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
    """(what, measured or None, specdeploy floor, Argo Rollouts, Flagger) in seconds."""
    interval, limit, scrape = p3["interval_s"], p3["failure_limit"], p3["scrape_s"]
    rollback = p3.get("rollback") or {}
    collapse = p3.get("collapse") or {}
    return [
        (
            "bad canary → stable only",
            rollback.get("seconds"),
            scrape + interval * limit,
            # Argo: a measurement at once, then each interval; Failed when failed >
            # failureLimit, so failureLimit 1 rolls back at the 2nd failure (same count).
            scrape + interval * (limit - 1),
            # Flagger: one check per interval tick; rollback when failedChecks >= threshold.
            scrape + interval * limit,
        ),
        (
            "collapse → fallback decided",
            collapse.get("decided_s"),
            scrape + p3["collapse_for_s"],
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


def autotune_rows(tune: dict[str, Any] | None) -> list[tuple[str, str, str, str, str]]:
    """P4 autotune: per workload, the operator's k against the sweep's best and k=5; then
    whether the workloads got different choices."""
    if not tune:
        return [("P4 autotune", "—", "—", "—", "not measured")]
    rows: list[tuple[str, str, str, str, str]] = []
    for name, w in tune["workloads"].items():
        chosen = w["operator"]["chosen"]
        context = (
            f"k={chosen} {w['operator_tokens_per_s']} tokens/s; oracle k={w['oracle_best_k']} "
            f"{w['oracle_best_tokens_per_s']}; k=5 {w['default_k_tokens_per_s']}"
        )
        confirmed = w.get("head_to_head")
        oracle_context = context
        if confirmed:
            oracle_context = (
                f"head to head, k={confirmed['operator_k']} against k={confirmed['oracle_k']}: "
                f"median of {len(confirmed['ratios'])} paired rounds "
                f"(spread {min(confirmed['ratios'])} to {max(confirmed['ratios'])}); in the sweep "
                f"{w['operator_vs_oracle_sweep']} ({context})"
            )
        rows.append(
            (
                f"P4 autotune {name}, vs oracle",
                f"ratio {w['operator_vs_oracle']}",
                oracle_context,
                "≥ 0.95",
                verdict(w["operator_vs_oracle"], 0.95, higher_is_better=True),
            )
        )
        rows.append(
            (
                f"P4 autotune {name}, vs k=5",
                f"ratio {w['operator_vs_default_k']}",
                context,
                "≥ 1.0",
                verdict(w["operator_vs_default_k"], 1.0, higher_is_better=True),
            )
        )
    chosen = {name: w["operator"]["chosen"] for name, w in tune["workloads"].items()}
    if len(chosen) > 1:
        differ = len(set(chosen.values())) == len(chosen)
        rows.append(
            (
                "P4 autotune, the workloads' choices differ",
                ", ".join(f"{n} k={k}" for n, k in chosen.items()),
                "one choice per workload",
                "different",
                "met" if differ else "**missed**",
            )
        )
    return rows


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


def summary_rows(
    kwok: dict[str, Any] | None,
    engine: dict[str, Any] | None,
    scale: dict[str, Any] | None,
    p3: dict[str, Any] | None,
    p4: dict[str, Any] | None,
) -> list[tuple[str, str, str, str, str]]:
    """(figure, measured, baseline/context, target, verdict)."""
    rows: list[tuple[str, str, str, str, str]] = []
    for name, result in (
        ("P1 rollout overhead, KWOK pods", kwok),
        ("P1 rollout overhead, CPU engines", engine),
    ):
        if result is None:
            rows.append((name, "—", "—", "—", "not measured"))
            continue
        rows.append(
            (
                name,
                f"ratio {result['ratio']}",
                f"SD {result['sd_median_s']} s vs raw {result['raw_median_s']} s "
                f"(medians of {result['runs']})",
                f"≤ {result['target_ratio']}",
                verdict(result["ratio"], result["target_ratio"]),
            )
        )  # fmt: skip
    points = (scale or {}).get("points") or []
    if points:
        largest = points[-1]
        first = points[0]
        rows.append(
            (
                f"P2 operator RSS at {largest['sds']} SDs",
                f"{largest.get('rss_idle_mib')} MiB",
                f"{first.get('rss_idle_mib')} MiB at {first['sds']}",
                "≤ 250 MiB",
                verdict(largest.get("rss_idle_mib"), 250),
            )
        )
        rows.append(
            (
                f"P2 idle API writes/min at {largest['sds']} SDs",
                fmt(largest.get("idle_writes_per_min")),
                "audit log",
                "0",
                verdict(largest.get("idle_writes_per_min"), 0),
            )
        )
        growth = (
            largest["idle_reads_per_min"] / first["idle_reads_per_min"]
            if first.get("idle_reads_per_min")
            else None
        )
        # The operator's 5-minute resync lists each cached kind once whatever the number of
        # SDs: an idle window that holds it sees up to that many reads at any size.
        flat = (largest.get("idle_reads_per_min") or 0) <= max(
            1.5 * (first.get("idle_reads_per_min") or 0), RESYNC_LISTS
        )
        rows.append(
            (
                f"P2 idle API reads/min at {largest['sds']} SDs",
                fmt(largest.get("idle_reads_per_min")),
                f"{fmt(first.get('idle_reads_per_min'))} at {first['sds']} "
                f"(x {fmt(growth)} for x {largest['sds'] // first['sds']} SDs)",
                "not growing with #SDs",
                "one point only" if largest is first else ("met" if flat else "**missed**"),
            )
        )
        rows.append(
            (
                f"P2 resync after a restart at {largest['sds']} SDs",
                f"{fmt(largest.get('resync_s'))} s",
                f"{largest.get('resynced')} of {largest['sds']} reconciled",
                "≤ 30 s",
                verdict(largest.get("resync_s"), 30),
            )
        )
        rows.append(
            (
                f"P2 all Ready at {largest['sds']} SDs",
                f"{fmt(largest.get('all_ready_s'))} s",
                f"{largest.get('ready')} of {largest['sds']} Ready; "
                f"{fmt(first.get('all_ready_s'))} s at {first['sds']}",
                "—",
                "reached" if largest.get("all_ready_s") is not None else "**not all Ready**",
            )
        )  # fmt: skip
    else:
        rows.append(("P2 scale", "—", "—", "—", "not measured"))
    if p3 and "rollback" in p3:
        r = p3["rollback"]
        rows.append(
            (
                "P3 bad canary → stable only, over floor",
                f"ratio {r['ratio']}",
                f"{r['seconds']} s vs floor {r['floor_s']} s",
                "≤ 1.2",
                verdict(r["ratio"], 1.2),
            )
        )
    if p3 and "collapse" in p3:
        c = p3["collapse"]
        rows.append(
            (
                "P3 collapse → fallback decided, over floor",
                f"ratio {c['ratio']}",
                f"{c['decided_s']} s vs floor {c['floor_s']} s; fallback serving after "
                f"{c['fallback_served_s']} s (x {c['ratio_to_fallback_served']}, engine start)",
                "≤ 1.2",
                verdict(c["ratio"], 1.2),
            )
        )
    if not p3:
        rows.append(("P3 reaction", "—", "—", "—", "not measured"))
    elif "error" in p3:
        rows.append(("P3 reaction (the rest)", "—", p3["error"][:300], "≤ 1.2", "**not measured**"))
    if p4:
        rows.append(
            (
                "P4 engine pass-through, tokens/s",
                f"ratio {p4['tokens_per_s_ratio']}",
                f"{p4['operator']['tokens_per_s']} vs {p4['hand']['tokens_per_s']} "
                "tokens/s by hand",
                "≥ 0.97",
                verdict(p4["tokens_per_s_ratio"], 0.97, higher_is_better=True),
            )
        )  # fmt: skip
        rows.append(
            (
                "P4 engine pass-through, inter-token latency",
                f"ratio {p4['itl_ratio']}",
                f"{p4['operator']['itl_median_ms']} vs {p4['hand']['itl_median_ms']} ms by hand",
                "≥ 0.97 (hand / operator)",
                verdict(p4["itl_ratio"], 0.97, higher_is_better=True),
            )
        )  # fmt: skip
    else:
        rows.append(("P4 engine pass-through", "—", "—", "—", "not measured"))
    return rows


#: LISTs of one resync of the operator's watch-fed stores (one per cached kind,
#: adapters.watch_cache.KINDS): reads an idle minute may hold at any number of SDs.
RESYNC_LISTS = 11

#: What limits each figure when its target is missed (the measured figure is beside it).
LIMITS = {
    "P1 rollout overhead, KWOK pods": (
        "between the create and the Ready write stand two reconciles (the first writes the "
        "ControllerRevision, Deployment, Service and status), each started by a watch event "
        "kopf hands to a worker thread, while the Deployment controller works in-process"
    ),
    "P1 rollout overhead, CPU engines": (
        "the raw Deployment runs the SD's own pod template (the launcher's pair check "
        "included), so the engine's start dominates both sides and the operator's part is the "
        "control-plane time P1 on KWOK pods measures; on a shared CPU one engine start varies "
        "by more than that, and few runs do not average it out"
    ),
    "P2 idle API reads/min": (
        "observe() reads watch-fed stores; the idle reads are the 5-minute resync (one LIST "
        "per cached kind) and watch renewals, at any number of SDs"
    ),
    "P2 resync after a restart": (
        "the process start plus one resume reconcile per SD, 8 at a time (kopf's worker "
        "threads), beside kopf's initial listing of every watched kind, in one Python process "
        "on a shared CPU"
    ),
    "P2 operator RSS": (
        "kopf's per-object state and watch processing for every SD and child, plus the "
        "stores' stripped copies (SDs, Deployments, records, Services, pods, nodes)"
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


def missed_section(rows: list[tuple[str, str, str, str, str]]) -> str:
    lines = []
    for figure, measured, context, target, result in rows:
        if "missed" not in result and "not all" not in result and "not measured**" not in result:
            continue
        why = next((v for k, v in LIMITS.items() if figure.startswith(k)), "see above")
        lines.append(f"- **{figure}**: {measured} ({context}), target {target}. Limited by: {why}.")
    return "\n".join(lines) or "None: every measured target was met."


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
            fmt(p.get("idle_reads_per_min")),
            fmt(p.get("idle_writes_per_min")),
            fmt(p.get("reconciles_idle_per_min")),
            fmt(p.get("resync_s")),
            fmt(p.get("reconcile_p50_s")),
            fmt(p.get("reconcile_p99_s")),
        )
        for p in points
    ]
    header = [
        "SDs", "bench nodes", "all Ready (s)", "RSS idle (MiB)", "idle reads/min",
        "idle writes/min", "reconciles/idle min", "resync (s)", "reconcile p50 (s)",
        "reconcile p99 (s)",
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
        return f"{value} s" if isinstance(value, int | float) else str(value or "not measured")

    rows = [tuple(seconds(v) for v in row[1:]) for row in reaction_rows(p3)]
    rows = [(row[0], *r) for row, r in zip(reaction_rows(p3), rows, strict=True)]
    text = table(["", "measured", "floor", "Argo Rollouts", "Flagger"], rows) if rows else ""
    return (
        text + f"\n\nSame settings for all three: interval {p3['interval_s']} s, two failed "
        f"verdicts roll back, Prometheus scrape {p3['scrape_s']} s. Argo Rollouts "
        "(analysis/analysis.go) takes a measurement when the AnalysisRun starts and then one "
        "per `interval`, and fails the run when `failed > failureLimit`: two failures need "
        "`failureLimit: 1` and arrive one interval after the start. Flagger runs one check per "
        "`analysis.interval` tick and rolls back when `failedChecks >= threshold`: `threshold: "
        "2` rolls back at the second tick. Neither counts the scrape delay in its own interval; "
        "it is added above so the columns compare. Both then shift traffic back through a mesh "
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
    rows = summary_rows(kwok, engine, scale, p3, p4) + autotune_rows(tune)
    summary = table(["figure", "measured", "baseline / context", "target", "verdict"], list(rows))
    missed = missed_section(rows)
    context = context_line(kwok, engine, scale, p3, p4, tune)
    report = [
        "# specdeploy benchmarks (`make bench`)",
        "",
        f"Measured {context}. Every figure is a ratio against a baseline measured in the same "
        "run; absolute times are context only (a shared 2-core machine, other builds running).",
        "",
        "## Summary",
        "",
        summary,
        "",
        "## Targets missed, and what limits them",
        "",
        missed,
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
    update_doc(summary + "\n\n" + missed, context)
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
        for run in result["runs"]:
            rows.append(
                (
                    mode,
                    run["concurrency"],
                    run["output_tokens_per_s"],
                    run["latency_mean_s"],
                    run.get("acceptance_rate"),
                )
            )
    return table(
        ["engine", "concurrency", "output tokens/s", "mean latency (s)", "acceptance"], rows
    )


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
