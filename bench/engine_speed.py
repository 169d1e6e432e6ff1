"""Benchmark the CPU engine with and without speculation (the good draft) at several concurrencies.

    make bench-engine            # or: PYTHONPATH=operator:e2e:. python -m bench.engine_speed

Starts the tiny target alone through the launcher and keeps it up; beside it, one at a time,
the target with draft-good, then with draft-small (two engines at once, each pinned to a CPU of
its own). At each concurrency the two take turns in alternating rounds of the same greedy
completions; each round's ratio of tokens/s (with the draft over without) is a paired round,
judged against 1.0 (the draft pays). Writes bench/results/engine-cpu.json. A benchmark, not a
test: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.confidence import Direction, judge
from bench.record import REPO, LoadWatch, load_bound, machine
from engine_harness import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    EngineServer,
    build_tiny_models,
    engine_python_path,
    start_engine,
    vllm_args,
)
from testbed.ports import free_port

PROMPTS = [
    "The quick fox",
    "A lazy dog sees the river",
    "Every small engine serves",
    "This careful teacher reads the old book at night.",
    "Some brave bird follows the ship",
    "One tired node checks the queue again.",
]


def one_request(server: EngineServer, prompt: str, max_tokens: int) -> tuple[float, int]:
    started = time.monotonic()
    answer = server.complete(prompt, max_tokens=max_tokens)
    return time.monotonic() - started, int(answer["usage"]["completion_tokens"])


def run_level(
    server: EngineServer, concurrency: int, requests: int, max_tokens: int
) -> dict[str, Any]:
    before = server.counters()
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(requests)]
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(lambda p: one_request(server, p, max_tokens), prompts))
    wall = time.monotonic() - started
    after = server.counters()
    latencies = sorted(r[0] for r in results)
    tokens = sum(r[1] for r in results)
    drafted = after.get(DRAFT_TOKENS, 0.0) - before.get(DRAFT_TOKENS, 0.0)
    accepted = after.get(ACCEPTED_TOKENS, 0.0) - before.get(ACCEPTED_TOKENS, 0.0)
    return {
        "concurrency": concurrency,
        "requests": requests,
        "output_tokens": tokens,
        "wall_s": round(wall, 3),
        "output_tokens_per_s": round(tokens / wall, 2),
        "latency_mean_s": round(statistics.fmean(latencies), 3),
        "latency_p50_s": round(latencies[len(latencies) // 2], 3),
        "latency_max_s": round(latencies[-1], 3),
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
    }


def paired_level(
    base: EngineServer,
    spec: EngineServer,
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
    rounds: int,
) -> dict[str, Any]:
    """`rounds` alternating rounds of the same completions on the engine without speculation
    and the one with it (which goes first swaps each round): each round's tokens/s of both."""
    base_runs: list[dict[str, Any]] = []
    spec_runs: list[dict[str, Any]] = []
    for round_ in range(rounds):
        order = [(base, base_runs), (spec, spec_runs)]
        for server, runs in order if round_ % 2 == 0 else reversed(order):
            runs.append(run_level(server, concurrency, requests, max_tokens))
    return {
        "concurrency": concurrency,
        "base": base_runs,
        "speculation": spec_runs,
        "ratios": [
            round(s["output_tokens_per_s"] / b["output_tokens_per_s"], 3)
            for s, b in zip(spec_runs, base_runs, strict=True)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "engine-cpu.json"))
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-level", type=int, default=0, help="default: 4x, min 16")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per level")
    parser.add_argument("--num-speculative-tokens", type=int, default=3)
    parser.add_argument(
        "--preload-iomp",
        action="store_true",
        help="LD_PRELOAD the engine venv's Intel OpenMP (vLLM's advice for CPU speculation)",
    )
    opts = parser.parse_args(argv)
    levels = [int(c) for c in opts.concurrency.split(",")]

    python = engine_python_path()
    models = build_tiny_models(python)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    env: dict[str, str] = {}
    if opts.preload_iomp:
        iomp = python.parent.parent / "lib" / "libiomp5.so"
        if not iomp.is_file():
            parser.error(f"{iomp} not found")
        env["LD_PRELOAD"] = str(iomp)

    def start(name: str, speculative: dict[str, Any] | None) -> EngineServer:
        port = free_port()
        args = vllm_args(models["target"], port, speculative=speculative)
        server = start_engine(python, name, args, log_dir, port=port, env=env)
        server.wait_ready()
        server.complete(PROMPTS[0], max_tokens=8)  # warm-up
        return server

    results: dict[str, Any] = {}
    loads: dict[str, Any] = {}
    figures = []
    # The engine without speculation stays up; each draft's engine runs beside it (each on a
    # CPU of its own), and the two take turns.
    base = start("no-speculation", None)
    try:
        for draft in ("draft-good", "draft-small"):
            spec = start(
                draft,
                {
                    "method": "draft_model",
                    "model": models[draft],
                    "num_speculative_tokens": opts.num_speculative_tokens,
                },
            )
            try:
                levels_done = []
                with LoadWatch(draft) as load:
                    for level in levels:
                        requests = opts.requests_per_level or max(16, 4 * level)
                        levels_done.append(
                            paired_level(
                                base,
                                spec,
                                concurrency=level,
                                requests=requests,
                                max_tokens=opts.max_tokens,
                                rounds=opts.rounds,
                            )
                        )
                        print(f"{draft} c={level}: {levels_done[-1]['ratios']}", file=sys.stderr)
                results[draft] = {
                    "startup_s": round(spec.ready_after_s or 0, 1),
                    "levels": levels_done,
                }
                loads[draft] = load.summary()
                for done in levels_done:
                    figures.append(
                        judge(
                            f"bench-engine {draft} over no speculation, concurrency "
                            f"{done['concurrency']}, tokens/s",
                            done["ratios"],
                            1.0,
                            Direction.AT_LEAST,
                            load=load.peak,
                            load_bound=load_bound(),
                            context="side by side, alternating rounds",
                        ).to_json()
                    )
            finally:
                spec.stop()
    finally:
        base.stop()
    report = {
        "what": "tiny Llama target (hidden 256, 4 layers) on the vLLM CPU engine, greedy; "
        "draft-good = draft_model with the target's own weights, draft-small = one-layer "
        "draft_model cut from the target; each beside the engine without speculation, "
        f"{opts.rounds} alternating rounds per concurrency, target 1.0 = the draft pays",
        "engine_args": vllm_args("<target>", 0)[1:],
        "num_speculative_tokens": opts.num_speculative_tokens,
        "max_tokens": opts.max_tokens,
        "rounds": opts.rounds,
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1", **env},
        "machine": machine(),
        "results": results,
        "figures": figures,
        "load": loads,
    }
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
