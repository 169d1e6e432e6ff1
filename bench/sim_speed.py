"""`make bench-sim`: the simulator's EAGLE-3 speed-up on the 70B profile against published figures.

Two simulators run side by side, the target profile alone and with the good EAGLE-3 head at
k=3; our own closed-loop client keeps `c` requests in flight on each (c = 1, 4, 16), each a
128-token prompt asking for 256 tokens (end of text ignored), and counts output tokens over the
wall time. Rounds alternate which side goes first. Each concurrency's figure is the median of
the rounds' ratios (speculating / target alone) divided by the published speed-up (vLLM's EAGLE-3
post: 2.03x at 1, 1.71x at 4, 1.66x at 16 on a 70B target), with its 95 % interval: met when the
whole interval lies within ±10 % of it. The target alone's step time is reported beside it, to
hold against public H100 figures (docs/simulator.md). bench/results/sim.json has every round.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from bench.confidence import Direction, Figure, Verdict, judge
from bench.record import REPO, LoadWatch, load_bound, write_result
from testbed.ports import free_port

TARGET = "sim/llama-3.1-70b-h100"
DRAFT = {"method": "eagle3", "model": "sim/eagle3-good", "num_speculative_tokens": 3}
#: Output throughput with EAGLE-3 over the target alone, by concurrency (DESIGN facts; vLLM's
#: EAGLE-3 post, 70B target).
PUBLISHED = {1: 2.03, 4: 1.71, 16: 1.66}
TOLERANCE = 0.10
PROMPT = " ".join(["the target verifies what the draft proposes"] * 18)  # 128 tokens
MAX_TOKENS = 256


@dataclass
class Sim:
    name: str
    url: str
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def simulator(name: str, speculative: dict[str, Any] | None, log_dir: Path) -> Iterator[Sim]:
    port = free_port()
    args = [sys.executable, "-m", "specdeploy.sim", "--model", TARGET, "--port", str(port)]
    args += ["--served-model-name", "model", "--max-num-seqs", "64"]
    if speculative:
        args += ["--speculative-config", json.dumps(speculative)]
    env = {**os.environ, "PYTHONPATH": str(REPO / "operator")}
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{name}.log", "wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    sim = Sim(name, f"http://127.0.0.1:{port}", process)
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError, urllib.error.URLError):
                urllib.request.urlopen(sim.url + "/health", timeout=2).close()
                break
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError(f"simulator {name} did not start (log in {log_dir})")
            time.sleep(0.2)
        yield sim
    finally:
        process.terminate()
        process.wait(10)


def throughput(sim: Sim, concurrency: int, requests_each: int) -> tuple[float, float]:
    """Output tokens per second with `concurrency` clients in a closed loop, and the mean step
    time (inter-token latency sum over count) the server measured over it."""

    def steps() -> tuple[float, float]:
        text = requests.get(sim.url + "/metrics", timeout=10).text
        found = {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "vllm:inter_token_latency_seconds"
            for sample in family.samples
            if sample.name.endswith(("_sum", "_count"))
        }
        return (
            found.get("vllm:inter_token_latency_seconds_sum", 0.0),
            found.get("vllm:inter_token_latency_seconds_count", 0.0),
        )

    body = {"model": "model", "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0}
    body["ignore_eos"] = True

    def client(_: int) -> int:
        tokens = 0
        with requests.Session() as session:
            for _ in range(requests_each):
                answer = session.post(sim.url + "/v1/completions", json=body, timeout=300)
                answer.raise_for_status()
                tokens += int(answer.json()["usage"]["completion_tokens"])
        return tokens

    before = steps()
    started = time.monotonic()
    with ThreadPoolExecutor(concurrency) as pool:
        tokens = sum(pool.map(client, range(concurrency)))
    elapsed = time.monotonic() - started
    after = steps()
    count = after[1] - before[1]
    return tokens / elapsed, (after[0] - before[0]) / count if count else 0.0


def within_band(concurrency: int, ratios: Sequence[float]) -> tuple[Figure, str, str]:
    """The ratios to the published figure judged against the band ±TOLERANCE: met when the
    whole interval is inside it, missed when it is wholly outside, else inconclusive."""
    name = f"speed-up at {concurrency} over published"
    low = judge(f"{name}, low side", ratios, 1 - TOLERANCE, Direction.AT_LEAST)
    high = judge(f"{name}, high side", ratios, 1 + TOLERANCE, Direction.AT_MOST)
    verdicts = {low.verdict, high.verdict}
    if verdicts == {Verdict.MET}:
        verdict = "met"
    elif Verdict.MISSED in verdicts:
        verdict = "missed"
    else:
        verdict = "inconclusive"
    return low, verdict, f"{low.reason}; {high.reason}"


def run(rounds: int, requests_each: int, concurrencies: Sequence[int]) -> dict[str, Any]:
    log_dir = REPO / ".run" / "bench-sim"
    measured: dict[int, dict[str, list[float]]] = {
        c: {"target": [], "eagle3": [], "target_step_ms": [], "eagle3_step_ms": []}
        for c in concurrencies
    }
    with (
        simulator("target", None, log_dir) as alone,
        simulator("eagle3", DRAFT, log_dir) as speculating,
        LoadWatch("sim") as watch,
    ):
        sides = {"target": alone, "eagle3": speculating}
        for number in range(rounds):
            order = ("target", "eagle3") if number % 2 == 0 else ("eagle3", "target")
            for c in concurrencies:
                for side in order:
                    tokens_per_s, step = throughput(sides[side], c, requests_each)
                    measured[c][side].append(tokens_per_s)
                    measured[c][f"{side}_step_ms"].append(step * 1000)
                print(
                    f"round {number + 1}/{rounds} c={c}: "
                    f"{measured[c]['eagle3'][-1] / measured[c]['target'][-1]:.2f}x",
                    file=sys.stderr,
                )
    figures = {}
    for c in concurrencies:
        ratios = [
            s / t / PUBLISHED[c]
            for s, t in zip(measured[c]["eagle3"], measured[c]["target"], strict=True)
        ]
        low, verdict, reason = within_band(c, ratios)
        figures[str(c)] = {
            "published": PUBLISHED[c],
            "speedup_rounds": [
                s / t for s, t in zip(measured[c]["eagle3"], measured[c]["target"], strict=True)
            ],
            "ratio_to_published": {"median": low.median, "interval": [low.low, low.high]},
            "verdict": verdict,
            "reason": reason,
            **{key: values for key, values in measured[c].items()},
        }
    return {
        "rounds": rounds,
        "requests_per_client": requests_each,
        "prompt_tokens": 128,
        "max_tokens": MAX_TOKENS,
        "target": TARGET,
        "draft": DRAFT,
        "figures": figures,
        "load": {"sim": watch.summary()},
        "load_bound": load_bound(),
    }


def table(result: dict[str, Any]) -> str:
    import statistics  # noqa: PLC0415

    lines = [
        "| concurrency | target alone, tokens/s | with EAGLE-3, tokens/s | speed-up (median) | "
        "published | ratio to published, 95 % interval | verdict | target step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c, figure in result["figures"].items():
        low, high = figure["ratio_to_published"]["interval"]
        lines.append(
            f"| {c} | {statistics.median(figure['target']):.0f} | "
            f"{statistics.median(figure['eagle3']):.0f} | "
            f"{statistics.median(figure['speedup_rounds']):.2f}x | {figure['published']:.2f}x | "
            f"{figure['ratio_to_published']['median']:.3f} ({low:.3f} to {high:.3f}) | "
            f"{figure['verdict']} | {statistics.median(figure['target_step_ms']):.1f} ms |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sim_speed", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests-per-client", type=int, default=2)
    parser.add_argument("--concurrency", default="1,4,16")
    opts = parser.parse_args(argv)
    concurrencies = [int(c) for c in opts.concurrency.split(",")]
    unknown = [c for c in concurrencies if c not in PUBLISHED]
    if unknown:
        parser.error(f"no published figure at concurrency {unknown}; choose from {list(PUBLISHED)}")
    result = run(opts.rounds, opts.requests_per_client, concurrencies)
    write_result("sim", result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
