"""Benchmark the CPU engine with and without speculation (the good draft) at several concurrencies.

    make bench-engine            # or: PYTHONPATH=operator:e2e:. python -m bench.engine_speed

Starts one engine at a time through the launcher (the tiny target alone, then with the good
draft_model), sends a bounded number of greedy completions at each concurrency, and writes
output tokens/s and latency to bench/results/engine-cpu.json. A benchmark, not a test: the
figures depend on the machine and on what else runs on it.
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

from bench.record import REPO, LoadWatch, machine
from engine_harness import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    EngineServer,
    build_tiny_models,
    engine_python_path,
    free_port,
    start_engine,
    vllm_args,
)

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "engine-cpu.json"))
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--requests-per-level", type=int, default=0, help="default: 4x, min 16")
    parser.add_argument("--repeats", type=int, default=3, help="runs per level; the median counts")
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
    modes: dict[str, dict[str, Any] | None] = {
        "no-speculation": None,
        "draft-good": {
            "method": "draft_model",
            "model": models["draft-good"],
            "num_speculative_tokens": opts.num_speculative_tokens,
        },
        "draft-small": {
            "method": "draft_model",
            "model": models["draft-small"],
            "num_speculative_tokens": opts.num_speculative_tokens,
        },
    }
    results: dict[str, Any] = {}
    loads: dict[str, Any] = {}
    for mode, spec in modes.items():
        port = free_port()
        args = vllm_args(models["target"], port, speculative=spec)
        server = start_engine(python, mode, args, log_dir, port=port, env=env)
        try:
            startup = server.wait_ready()
            server.complete(PROMPTS[0], max_tokens=8)  # warm-up
            runs = []
            with LoadWatch(mode) as load:
                for level in levels:
                    requests = opts.requests_per_level or max(16, 4 * level)
                    repeats = [
                        run_level(server, level, requests, opts.max_tokens)
                        for _ in range(opts.repeats)
                    ]
                    repeats.sort(key=lambda r: float(r["output_tokens_per_s"]))
                    median = dict(repeats[len(repeats) // 2])
                    median["output_tokens_per_s_all"] = [r["output_tokens_per_s"] for r in repeats]
                    runs.append(median)
                    print(f"{mode} c={level}: {json.dumps(median)}", file=sys.stderr)
            results[mode] = {"startup_s": round(startup, 1), "runs": runs}
            loads[mode] = load.summary()
        finally:
            server.stop()

    speedup: dict[str, dict[str, Any]] = {}
    for mode in ("draft-good", "draft-small"):
        speedup[mode] = {}
        for base, spec_run in zip(
            results["no-speculation"]["runs"], results[mode]["runs"], strict=True
        ):
            speedup[mode][str(base["concurrency"])] = {
                "output_tokens_per_s": round(
                    spec_run["output_tokens_per_s"] / base["output_tokens_per_s"], 3
                ),
                "latency_mean": round(spec_run["latency_mean_s"] / base["latency_mean_s"], 3),
            }
    report = {
        "what": "tiny Llama target (hidden 256, 4 layers) on the vLLM CPU engine, greedy; "
        "draft-good = draft_model with the target's own weights, draft-small = one-layer "
        "draft_model cut from the target",
        "engine_args": vllm_args("<target>", 0)[1:],
        "num_speculative_tokens": opts.num_speculative_tokens,
        "max_tokens": opts.max_tokens,
        "repeats_per_level": opts.repeats,
        "engine_env": {"VLLM_CPU_KVCACHE_SPACE": "1", **env},
        "machine": machine(),
        "results": results,
        "load": loads,
        "speedup_with_speculation": speedup,
    }
    out = Path(opts.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(speedup, indent=2))
    print(f"written to {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
