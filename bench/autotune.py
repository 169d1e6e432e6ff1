"""P4: the autotuner's choice of k against an exhaustive sweep on the real CPU engine.

    make bench-autotune          # or: PYTHONPATH=operator:e2e:. python -m bench.autotune

For each workload (the tiny target with a draft that predicts it well, draft-small, and one
that predicts it badly, draft-bad), one engine per k = 1..8 is started through the launcher,
all kept up at once (each with a small KV cache). Then, in --rounds interleaved rounds (the
order of k rotated and reversed from round to round, so a drift in the machine's load falls on
every k alike), each engine gets the same greedy completions at a fixed concurrency; the median
round's output tokens/s is the oracle's figure for that k. The engine's own /metrics (drafts,
draft tokens, accepted tokens per position, inter-token latency) summed over the rounds are
what Prometheus would give the operator.

The operator's choice is computed by the operator's own model (plan.rollout.autotune.recommend), as
mode Apply would reach it: starting from k=5 (the seeds' default), with no draftCostRatio (so
the operator's default ratio), each recommendation that changes k by minGain is "rolled out",
i.e. the next recommendation reads the sweep's measurement at that k, with the step times of
every k served so far (which lets it fit the cost ratio) and the acceptance per position of
the longest, until it keeps its k. Results go to
bench/results/autotune.json and a plot to bench/results/autotune.png.

A benchmark, not a test: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import matplotlib
from prometheus_client.parser import text_string_to_metric_families

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from bench.record import REPO, machine
from engine_harness import (
    EngineServer,
    build_tiny_models,
    engine_python_path,
    http_text,
    start_engine,
    vllm_args,
)
from specdeploy.api.config import AnalysisSettings
from specdeploy.api.models import AutotuneSpec, AutotuneStatus
from specdeploy.plan.rollout.autotune import (
    DEFAULT_DRAFT_COST_RATIO,
    AutotuneMeasurement,
    recommend,
    record_trial,
)
from testbed.ports import free_port

# The tiny models' own kind of text (the target was trained on such sentences).
PROMPTS = [
    "The cat sat on the",
    "In the morning the queue",
    "A node sees",
    "The scheduler places the pod on",
    "Every small engine serves",
    "One tired node checks the queue again.",
]
WORKLOADS = {"predicted-well": "draft-small", "predicted-badly": "draft-bad"}
DEFAULT_K = 5
#: The canary's verdict on a tuned revision at its default (rollout.analysis.maxThroughputDrop).
MAX_THROUGHPUT_DROP = AnalysisSettings().max_throughput_drop


def scrape(server: EngineServer) -> dict[str, Any]:
    """The engine's speculation counters and step-time histogram, summed over engines."""
    found: dict[str, Any] = {"per_position": {}}
    for family in text_string_to_metric_families(http_text(server.url + "/metrics")):
        for sample in family.samples:
            name = sample.name
            if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                position = int(sample.labels["position"])
                found["per_position"][position] = (
                    found["per_position"].get(position, 0.0) + sample.value
                )
            elif name in (
                "vllm:spec_decode_num_drafts_total",
                "vllm:spec_decode_num_draft_tokens_total",
                "vllm:inter_token_latency_seconds_sum",
                "vllm:inter_token_latency_seconds_count",
            ):
                found[name] = found.get(name, 0.0) + sample.value
    return found


def delta(after: dict[str, Any], before: dict[str, Any], name: str) -> float:
    return float(after.get(name, 0.0)) - float(before.get(name, 0.0))


#: Each engine's KV cache: two engines are up at once, each with a small one (a tiny model at
#: --max-model-len 512 needs a few MiB), the same for every k.
SWEEP_KV_CACHE_BYTES = 128 * 1024 * 1024
#: Memory an engine start needs free, so the sweep stops with a message instead of the OOM killer.
ENGINE_START_MIN_AVAILABLE_MIB = 3 * 1024


def available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


@dataclass(frozen=True)
class Started:
    server: EngineServer
    startup_s: float


def start_k(python: Path, models: dict[str, str], draft: str, k: int, log_dir: Path) -> Started:
    """An engine serving the pair at length k, ready and warmed up."""
    if available_mib() < ENGINE_START_MIN_AVAILABLE_MIB:
        raise SystemExit(
            f"bench-autotune: {available_mib()} MiB available before the k={k} engine, "
            f"under {ENGINE_START_MIN_AVAILABLE_MIB}"
        )
    spec = {"method": "draft_model", "model": models[draft], "num_speculative_tokens": k}
    port = free_port()
    extra = ["--kv-cache-memory-bytes", str(SWEEP_KV_CACHE_BYTES)]
    server = start_engine(
        python,
        f"{draft}-k{k}",
        vllm_args(models["target"], port, speculative=spec, extra=extra),
        log_dir,
        port=port,
    )
    try:
        startup = server.wait_ready()
        server.complete(PROMPTS[0], max_tokens=8)  # warm-up
    except BaseException:
        server.stop()
        raise
    return Started(server, startup)


def run_round(server: EngineServer, opts: Any) -> dict[str, Any]:
    """One round of the same greedy completions at a fixed concurrency, and the engine's deltas."""
    server.complete(PROMPTS[0], max_tokens=8)  # untimed: wakes an engine that sat idle
    before = scrape(server)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(opts.requests)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=opts.concurrency) as pool:
        answers = list(pool.map(lambda p: server.complete(p, max_tokens=opts.max_tokens), prompts))
    wall = time.monotonic() - started
    after = scrape(server)
    positions = sorted(after["per_position"])
    tokens = sum(int(a["usage"]["completion_tokens"]) for a in answers)
    return {
        "output_tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall,
        "drafts": delta(after, before, "vllm:spec_decode_num_drafts_total"),
        "draft_tokens": delta(after, before, "vllm:spec_decode_num_draft_tokens_total"),
        "accepted_per_position": [
            after["per_position"][p] - before["per_position"].get(p, 0.0) for p in positions
        ],
        "step_sum": delta(after, before, "vllm:inter_token_latency_seconds_sum"),
        "step_count": delta(after, before, "vllm:inter_token_latency_seconds_count"),
    }


def mean_step_seconds(rounds: list[dict[str, Any]]) -> float | None:
    steps = sum(r["step_count"] for r in rounds)
    return sum(r["step_sum"] for r in rounds) / steps if steps else None


def summarise_k(
    k: int, startup: float, rounds: list[dict[str, Any]], tokens_per_s: float
) -> dict[str, Any]:
    """A k's figures: its tokens/s (from the paired rounds) and the engine's counters summed over
    its rounds, as Prometheus would give them over a window."""
    width = max(len(r["accepted_per_position"]) for r in rounds)
    return {
        "k": k,
        "startup_s": round(startup, 1),
        "rounds": len(rounds),
        "output_tokens": sum(r["output_tokens"] for r in rounds),
        "wall_s": round(sum(r["wall_s"] for r in rounds), 3),
        "output_tokens_per_s": round(tokens_per_s, 2),
        "rounds_tokens_per_s": [round(r["tokens_per_s"], 2) for r in rounds],
        "drafts": sum(r["drafts"] for r in rounds),
        "draft_tokens": sum(r["draft_tokens"] for r in rounds),
        "accepted_per_position": [
            sum(
                r["accepted_per_position"][p] for r in rounds if len(r["accepted_per_position"]) > p
            )
            for p in range(width)
        ],
        "step_seconds": mean_step_seconds(rounds),
    }


def alternate(
    name: str,
    first: tuple[int, Started],
    second: tuple[int, Started],
    rounds: int,
    opts: Any,
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Rounds of two engines, strictly alternating: (first's round, second's round) each."""
    pairs = []
    for index in range(rounds):
        pair = (run_round(first[1].server, opts), run_round(second[1].server, opts))
        pairs.append(pair)
        print(
            f"{name} round {index + 1}: "
            + ", ".join(
                f"k={k} {r['tokens_per_s']:.1f} tokens/s"
                for k, r in ((first[0], pair[0]), (second[0], pair[1]))
            ),
            file=sys.stderr,
        )
    return pairs


def sweep_workload(
    python: Path, models: dict[str, str], name: str, ks: list[int], *, log_dir: Path, opts: Any
) -> dict[int, dict[str, Any]]:
    """Each k beside the default k's engine, in alternating rounds; tokens/s relative to it.

    The default k's engine stays up the whole sweep; each other k's engine starts beside it and
    the two take turns, strictly alternating (--rounds rounds each), so every round follows a
    round of the other engine: an engine measured twice in a row runs at another speed than
    one just switched to (docs/autotune.md). A k's tokens/s is the median of its rounds'
    ratios to the default's round just before, times the default's median round: a drift in
    the machine's load falls on both sides of a ratio alike.
    """
    draft = WORKLOADS[name]
    anchor = start_k(python, models, draft, DEFAULT_K, log_dir)
    anchor_rounds: list[dict[str, Any]] = []
    found: dict[int, tuple[float, list[dict[str, Any]], list[float], list[dict[str, Any]]]] = {}
    try:
        for k in (k for k in ks if k != DEFAULT_K):
            other = start_k(python, models, draft, k, log_dir)
            try:
                pairs = alternate(name, (DEFAULT_K, anchor), (k, other), opts.rounds, opts)
            finally:
                other.server.stop()
            anchor_rounds += [theirs for theirs, _ in pairs]
            rounds = [mine for _, mine in pairs]
            ratios = [mine["tokens_per_s"] / theirs["tokens_per_s"] for theirs, mine in pairs]
            found[k] = (other.startup_s, rounds, ratios, [theirs for theirs, _ in pairs])
    finally:
        anchor.server.stop()
    default_tps = statistics.median(r["tokens_per_s"] for r in anchor_rounds)
    sweep = {DEFAULT_K: summarise_k(DEFAULT_K, anchor.startup_s, anchor_rounds, default_tps)}
    for k, (startup, rounds, ratios, beside) in found.items():
        sweep[k] = summarise_k(k, startup, rounds, statistics.median(ratios) * default_tps)
        sweep[k]["vs_default_k_rounds"] = [round(r, 3) for r in ratios]
        # The default k's step time over the rounds it took turns with this k: what the
        # stable measures beside a trial (the same windows).
        sweep[k]["default_k_step_seconds_beside"] = mean_step_seconds(beside)
    return {k: sweep[k] for k in sorted(sweep)}


def head_to_head(
    python: Path,
    models: dict[str, str],
    name: str,
    ks: tuple[int, int],
    *,
    log_dir: Path,
    opts: Any,
) -> dict[str, Any]:
    """The operator's k against the sweep's best, side by side in --confirm-rounds rounds.

    The sweep's best is the largest of eight noisy figures, so it is biased upwards; measured
    again directly against the operator's choice (strictly alternating rounds), the median
    ratio says how the two compare without that bias.
    """
    chosen, best = ks
    draft = WORKLOADS[name]
    first = start_k(python, models, draft, chosen, log_dir)
    try:
        second = start_k(python, models, draft, best, log_dir)
        try:
            pairs = alternate(name, (chosen, first), (best, second), opts.confirm_rounds, opts)
        finally:
            second.server.stop()
    finally:
        first.server.stop()
    ratios = [mine["tokens_per_s"] / theirs["tokens_per_s"] for mine, theirs in pairs]
    return {
        "operator_k": chosen,
        "oracle_k": best,
        "ratios": [round(r, 3) for r in ratios],
        "ratio": round(statistics.median(ratios), 3),
    }


def _measured(run: dict[str, Any], concurrency: int) -> AutotuneMeasurement:
    return AutotuneMeasurement(
        drafts=run["drafts"],
        draft_tokens=run["draft_tokens"],
        accepted_per_position=tuple(run["accepted_per_position"]),
        step_seconds=run["step_seconds"],
        mean_batch_size=float(concurrency),
    )


def stable_beside(
    sweep: dict[int, dict[str, Any]], served: int, trial: int
) -> AutotuneMeasurement | None:
    """The stable k's step time over the trial's windows, as the operator reads it beside a
    trial: each k ran beside the default k, so the served k's step time is carried into the
    trial's rounds by the default k's step time in each (the served k's own rounds for the
    default k itself). None when the sweep did not record those (an older sweep)."""

    def beside_default(k: int) -> float | None:
        if k == DEFAULT_K:
            return sweep[k]["step_seconds"]  # type: ignore[no-any-return]
        return sweep[k].get("default_k_step_seconds_beside")

    trial_window, served_window = beside_default(trial), beside_default(served)
    step = sweep[served]["step_seconds"]
    if not trial_window or not served_window or not step:
        return None
    return AutotuneMeasurement(step_seconds=step * trial_window / served_window)


def operator_choice(sweep: dict[int, dict[str, Any]], opts: Any) -> dict[str, Any]:
    """Where mode Apply ends, starting from k=DEFAULT_K, reading the sweep as its measurements.

    Each recommendation the operator would roll out (plan.rollout.autotune.recommend: a k predicted
    minGain faster, or a calibration trial while the draft's cost ratio is unmeasured) is a
    trial: its k's step time (with the stable's over the same rounds, stable_beside) and its
    acceptance join the status (plan.rollout.autotune.record_trial, as decide_tuning keeps a
    trial's), and the
    canary's throughput verdict (tokens/s more than maxThroughputDrop, 2 %, below the
    stable's fails, plan.rollout.analysis) is taken from the sweep's tokens/s. A passed trial
    serves;
    a failed one is rejected and the stable k is measured again, now with both step times.
    """
    tune = AutotuneSpec(
        mode="Apply", min_tokens=min(sweep), max_tokens=max(sweep), min_gain=opts.min_gain
    )
    state: AutotuneStatus | None = None
    served = DEFAULT_K
    path: list[dict[str, Any]] = []
    now = datetime.now(UTC)

    def measure(k: int, previous: AutotuneStatus | None) -> AutotuneStatus:
        return recommend(
            tune,
            previous,
            revision=f"k{k}",
            served_tokens=k,
            measured=_measured(sweep[k], opts.concurrency),
            window="bench",
            min_draft_tokens=opts.min_draft_tokens,
            default_cost_ratio=DEFAULT_DRAFT_COST_RATIO,
            now=now,
        )

    for _ in range(2 * len(sweep)):
        state = measure(served, state)
        rec = state.recommendation
        if rec is None or state.inputs is None:
            raise RuntimeError(f"no recommendation at k={served}: {state.message}")
        step: dict[str, Any] = {
            "served": served,
            "recommended": rec.num_speculative_tokens,
            "calibration": rec.calibration,
            "predicted_gain": rec.predicted_gain,
            "draft_cost_ratio": state.inputs.draft_cost_ratio,
            "draft_cost_source": state.inputs.draft_cost_source,
            "message": rec.message,
        }
        path.append(step)
        trial = rec.num_speculative_tokens
        rolls_out = rec.changed and (rec.predicted_gain >= tune.min_gain or rec.calibration)
        if not rolls_out or trial == served or trial in state.rejected_tokens:
            break
        # The trial under the canary: what it measured (its step time, and its acceptance per
        # position when it is the longest k yet) is kept whatever the verdict, as decide_tuning
        # keeps it.
        beside = stable_beside(sweep, served, trial)
        state = record_trial(
            state.model_copy(update={"trial_revision": f"k{trial}", "applied_tokens": trial}),
            _measured(sweep[trial], opts.concurrency),
            min_draft_tokens=opts.min_draft_tokens,
            stable=(served, beside) if beside else None,
        ).model_copy(update={"trial_revision": None, "applied_tokens": None})
        ratio = sweep[trial]["output_tokens_per_s"] / sweep[served]["output_tokens_per_s"]
        step["canary"] = "Promote" if ratio - 1 >= -MAX_THROUGHPUT_DROP else "Rollback"
        step["canary_throughput_ratio"] = round(ratio, 3)
        if step["canary"] == "Promote":
            served = trial
        else:
            state = state.model_copy(
                update={"rejected_tokens": sorted({*state.rejected_tokens, trial})}
            )
    return {"chosen": served, "first_recommendation": path[0]["recommended"], "path": path}


def plot(report: dict[str, Any], out: Path) -> None:
    figure, axes = plt.subplots(1, len(report["workloads"]), figsize=(11, 4), squeeze=False)
    for axis, (name, result) in zip(axes[0], report["workloads"].items(), strict=True):
        ks = [r["k"] for r in result["sweep"]]
        tps = [r["output_tokens_per_s"] for r in result["sweep"]]
        axis.plot(ks, tps, "o-", label="sweep (oracle)")
        chosen = result["operator"]["chosen"]
        axis.plot(
            [chosen], [tps[ks.index(chosen)]], "r*", markersize=16, label=f"operator k={chosen}"
        )
        best = result["oracle_best_k"]
        axis.plot(
            [best],
            [tps[ks.index(best)]],
            "gs",
            fillstyle="none",
            markersize=14,
            label=f"oracle k={best}",
        )
        axis.axvline(DEFAULT_K, color="grey", linestyle=":", label=f"default k={DEFAULT_K}")
        axis.set_title(f"{name} ({result['draft']})")
        axis.set_xlabel("numSpeculativeTokens k")
        axis.set_ylabel("output tokens/s")
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out, dpi=110)


def best_k(sweep: dict[int, dict[str, Any]]) -> int:
    best: int = max(sweep.values(), key=lambda r: float(r["output_tokens_per_s"]))["k"]
    return best


def summarise(
    raw: dict[str, dict[int, dict[str, Any]]],
    opts: Any,
    meta: dict[str, Any],
    confirmations: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The report from raw sweep figures: pure, so --from-json recomputes it without engines.

    operator_vs_oracle is the head-to-head ratio when the operator's k and the sweep's best
    were measured side by side (and are still the two compared), else the sweep's ratio.
    """
    workloads: dict[str, Any] = {}
    for name, sweep in raw.items():
        if DEFAULT_K not in sweep:
            raise SystemExit(f"{name}: the sweep has no k={DEFAULT_K} (the default) to start from")
        best = sweep[best_k(sweep)]
        choice = operator_choice(sweep, opts)
        chosen_tps = sweep[choice["chosen"]]["output_tokens_per_s"]
        from_sweep = round(chosen_tps / best["output_tokens_per_s"], 3)
        confirmed = confirmations.get(name)
        if confirmed and (confirmed["operator_k"], confirmed["oracle_k"]) != (
            choice["chosen"],
            best["k"],
        ):
            confirmed = None  # a recompute that compares other k
        workloads[name] = {
            "draft": WORKLOADS[name],
            "sweep": [sweep[k] for k in sorted(sweep)],
            "oracle_best_k": best["k"],
            "oracle_best_tokens_per_s": best["output_tokens_per_s"],
            "default_k_tokens_per_s": sweep[DEFAULT_K]["output_tokens_per_s"],
            "operator": choice,
            "operator_tokens_per_s": chosen_tps,
            "operator_vs_oracle": confirmed["ratio"] if confirmed else from_sweep,
            "operator_vs_oracle_sweep": from_sweep,
            "head_to_head": confirmed,
            "operator_vs_default_k": round(chosen_tps / sweep[DEFAULT_K]["output_tokens_per_s"], 3),
        }
    return {
        "what": "tiny Llama target on the vLLM CPU engine, greedy; one engine per k, each beside "
        "the k=5 engine in alternating rounds (tokens/s: the median ratio to k=5's round, times "
        "k=5's median round); the "
        "operator's choice is plan.rollout.autotune's, starting from k=5 and following its own "
        "recommendations through the sweep's measurements",
        "concurrency": meta["concurrency"],
        "requests_per_round": meta.get("requests_per_round"),
        "rounds": meta.get("rounds"),
        "confirm_rounds": meta.get("confirm_rounds"),
        "max_tokens": meta["max_tokens"],
        "min_gain": opts.min_gain,
        "machine": meta["machine"],
        "date": meta["date"],
        "recomputed": meta.get("recomputed"),
        "confirmed": meta.get("confirmed"),
        "workloads": workloads,
    }


def load_raw(
    path: Path,
) -> tuple[dict[str, dict[int, dict[str, Any]]], dict[str, dict[str, Any]], dict[str, Any]]:
    """The raw sweep of an earlier run: an autotune.json or its .raw.json written as it ran."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"--from-json {path}: {err}") from err
    if "workloads" not in data:
        raise SystemExit(f"--from-json {path}: no 'workloads' (not a bench-autotune result)")
    raw: dict[str, dict[int, dict[str, Any]]] = {}
    confirmations: dict[str, dict[str, Any]] = dict(data.get("confirmations") or {})
    for name, w in data["workloads"].items():
        runs = w["sweep"] if isinstance(w, dict) and "sweep" in w else w
        raw[name] = {int(r["k"]): r for r in runs}
        if isinstance(w, dict) and w.get("head_to_head"):
            confirmations[name] = w["head_to_head"]
    return raw, confirmations, data


def save_raw(
    path: Path,
    meta: dict[str, Any],
    raw: dict[str, dict[int, dict[str, Any]]],
    confirmations: dict[str, dict[str, Any]],
) -> None:
    saved = {name: list(sweep.values()) for name, sweep in raw.items()}
    body = meta | {"workloads": saved, "confirmations": confirmations}
    path.write_text(json.dumps(body, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "autotune.json"))
    parser.add_argument("--ks", default="1,2,3,4,5,6,7,8")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16, help="completions per round")
    parser.add_argument(
        "--rounds", type=int, default=6, help="alternating rounds of each k beside the default k"
    )
    parser.add_argument(
        "--confirm-rounds",
        type=int,
        default=10,
        help="rounds of the operator's k against the sweep's best when they differ (0: none)",
    )
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--min-gain", type=float, default=0.05)
    parser.add_argument("--min-draft-tokens", type=int, default=200)
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="a subset, to try it")
    parser.add_argument(
        "--from-json",
        "--recompute",
        dest="from_json",
        metavar="PATH",
        help="recompute the operator's choice from the raw sweep saved by an earlier run "
        "(autotune.json or autotune.raw.json); starts no engine",
    )
    parser.add_argument(
        "--confirm-again",
        action="store_true",
        help="with --from-json: measure the operator's k against the sweep's best side by side "
        "again (starts two engines per workload where they differ)",
    )
    opts = parser.parse_args(argv)
    if opts.confirm_again and not opts.from_json:
        parser.error("--confirm-again needs --from-json (the sweep whose k it compares)")
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    if opts.from_json:
        raw, confirmations, old = load_raw(Path(opts.from_json))
        meta: dict[str, Any] = {
            key: old.get(key)
            for key in (
                "concurrency",
                "requests_per_round",
                "rounds",
                "confirm_rounds",
                "max_tokens",
            )
        }
        measured_on = dict(old.get("machine") or {})
        meta["date"] = old.get("date") or measured_on.get("date")
        measured_on.setdefault("date", meta["date"])
        measured_on.setdefault("commit", "unknown")  # not the recompute's
        meta["machine"] = {**machine(), **measured_on}  # where the sweep ran, not the recompute
        meta["recomputed"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        opts.concurrency = int(meta["concurrency"] or opts.concurrency)
        if opts.confirm_again:
            # The same rounds as the sweep's, so the two compare.
            opts.requests = int(meta["requests_per_round"] or opts.requests)
            opts.max_tokens = int(meta["max_tokens"] or opts.max_tokens)
            meta["confirm_rounds"] = opts.confirm_rounds
            meta["confirmed"] = meta["recomputed"]
            python = engine_python_path()
            models = build_tiny_models(python)
            log_dir = Path(tempfile.mkdtemp(prefix="bench-autotune-"))
            for name, sweep in raw.items():
                pair = (operator_choice(sweep, opts)["chosen"], best_k(sweep))
                confirmations.pop(name, None)
                if pair[0] != pair[1]:
                    confirmations[name] = head_to_head(
                        python, models, name, pair, log_dir=log_dir, opts=opts
                    )
            save_raw(out.with_suffix(".raw.json"), meta, raw, confirmations)
    else:
        ks = [int(k) for k in opts.ks.split(",")]
        if DEFAULT_K not in ks:
            parser.error(f"the sweep must include the default k={DEFAULT_K}")
        meta = {
            "concurrency": opts.concurrency,
            "requests_per_round": opts.requests,
            "rounds": opts.rounds,
            "confirm_rounds": opts.confirm_rounds,
            "max_tokens": opts.max_tokens,
            "machine": machine(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        python = engine_python_path()
        models = build_tiny_models(python)
        log_dir = Path(tempfile.mkdtemp(prefix="bench-autotune-"))
        raw_path = out.with_suffix(".raw.json")
        raw = {}
        confirmations = {}
        for name in opts.workloads.split(","):
            raw[name] = sweep_workload(python, models, name, ks, log_dir=log_dir, opts=opts)
            for k in ks:
                print(f"{name} k={k}: {json.dumps(raw[name][k])}", file=sys.stderr)
            save_raw(raw_path, meta, raw, confirmations)  # a failure later loses nothing
            pair = (operator_choice(raw[name], opts)["chosen"], best_k(raw[name]))
            if pair[0] != pair[1] and opts.confirm_rounds:
                confirmations[name] = head_to_head(
                    python, models, name, pair, log_dir=log_dir, opts=opts
                )
                save_raw(raw_path, meta, raw, confirmations)

    report = summarise(raw, opts, meta, confirmations)
    workloads = report["workloads"]
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    summary = {
        name: {
            key: w[key]
            for key in (
                "oracle_best_k",
                "operator_tokens_per_s",
                "oracle_best_tokens_per_s",
                "operator_vs_oracle",
                "operator_vs_default_k",
            )
        }
        | {"chosen_k": w["operator"]["chosen"]}
        for name, w in workloads.items()
    }
    print(json.dumps(summary, indent=2))
    print(f"written to {out} and {out.with_suffix('.png')}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
