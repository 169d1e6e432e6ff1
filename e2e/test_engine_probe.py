"""The probe inside a real CPU vLLM: the launcher, vLLM's --middleware, and vLLM's own counters.

What a pod with `spec.rollout.analysis.probe` runs, without the operator: the tiny target with a
draft, the probe's settings and prompts in the environment, `--middleware
specdeploy.engine.probe.ProbeGate`. The probe runs once the engine answers; `/specdeploy/ready`
answers 200 only after it, and `/metrics` then carries the probe's figures, equal to what vLLM
itself counted over the probe (no other request reached it).
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engine_harness import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    GENERATED_TOKENS,
    EngineServer,
    engine_python,
    http_text,
    parse_counters,
    start_engine,
    tiny_models,
    vllm_args,
)
from specdeploy.api.contract import PROBE_ENV, PROBE_MIDDLEWARE, PROBE_PROMPTS_ENV, PROBE_READY_PATH
from specdeploy.engine.tiny_models import PROBE_PROMPTS
from testbed.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

__all__ = ["engine_python", "tiny_models"]  # fixtures used below

MAX_TOKENS = 48
REQUEST_SUCCESS = "vllm:request_success_total"


def status_of(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, urllib.error.URLError):
        return 0


def probe_gauges(metrics: str) -> dict[str, float]:
    """The specdeploy_probe_* samples of /metrics, by name (per-position ones summed)."""
    return {
        name.removeprefix("specdeploy_probe_"): value
        for name, value in parse_counters(metrics).items()
        if name.startswith("specdeploy_probe_")
    }


def start_probed(
    python: Path, models: dict[str, str], draft: str, log_dir: Path, tokens: int = 3
) -> EngineServer:
    port = free_port()
    speculative = {
        "method": "draft_model",
        "model": models[draft],
        "num_speculative_tokens": tokens,
    }
    args = vllm_args(models["target"], port, speculative=speculative)
    args += ["--middleware", PROBE_MIDDLEWARE]
    env = {
        PROBE_ENV: json.dumps({"maxTokens": MAX_TOKENS, "temperature": 0, "timeoutSeconds": 300}),
        PROBE_PROMPTS_ENV: json.dumps(PROBE_PROMPTS),
        "SPECDEPLOY_PORT": str(port),
    }
    return start_engine(python, f"probe-{draft}", args, log_dir, env=env, port=port)


def wait_ready(server: EngineServer, timeout: float = 420) -> dict[str, float]:
    """Polls the readiness path until it answers 200; vLLM's counters at that moment."""
    deadline = time.monotonic() + timeout
    healthy_before_ready = False
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise AssertionError(f"the engine exited:\n{server.tail()}")
        ready = status_of(server.url + PROBE_READY_PATH)
        if ready == 200:
            counters = server.counters()
            counters["healthy_before_ready"] = float(healthy_before_ready)
            return counters
        healthy_before_ready |= ready == 503 and status_of(server.url + "/health") == 200
        time.sleep(0.2)
    raise AssertionError(f"{PROBE_READY_PATH} never answered 200:\n{server.tail()}")


def test_a_pod_is_ready_only_after_its_probe_and_exports_exactly_what_vllm_counted(
    engine_python: Path, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    server = start_probed(engine_python, tiny_models, "draft-small", tmp_path)
    try:
        at_ready = wait_ready(server)
        # Readiness came after every probe request finished (and nothing else ran).
        assert at_ready[REQUEST_SUCCESS] == len(PROBE_PROMPTS), at_ready
        assert at_ready[GENERATED_TOKENS] == len(PROBE_PROMPTS) * MAX_TOKENS
        figures = probe_gauges(http_text(server.url + "/metrics"))
        print(f"\nprobe figures: {json.dumps(figures)}")
        assert figures["prompts"] == figures["requests"] == len(PROBE_PROMPTS)
        assert figures["complete"] == 1.0
        assert figures["errors"] == 0.0
        assert figures["output_tokens"] == at_ready[GENERATED_TOKENS]
        assert figures["draft_tokens"] == at_ready[DRAFT_TOKENS] > 0
        assert figures["accepted_tokens"] == at_ready[ACCEPTED_TOKENS]
        assert figures["first_tokens"] == len(PROBE_PROMPTS)
        decoded = figures["output_tokens"] - figures["first_tokens"]
        assert figures["decode_steps"] < decoded  # speculation: more than a token a step
        assert figures["accepted_tokens"] / figures["draft_tokens"] > 0.6  # draft-small: ~0.8
        # A user's request changes vLLM's counters, never the probe's figures.
        server.complete("A node sees", max_tokens=16)
        after = probe_gauges(http_text(server.url + "/metrics"))
        assert after == figures
        assert server.counters()[REQUEST_SUCCESS] == len(PROBE_PROMPTS) + 1
    finally:
        server.stop()


def test_a_bad_draft_s_probe_shows_its_acceptance(
    engine_python: Path, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    server = start_probed(engine_python, tiny_models, "draft-bad", tmp_path)
    try:
        wait_ready(server)
        figures = probe_gauges(http_text(server.url + "/metrics"))
        assert figures["complete"] == 1.0
        assert figures["accepted_tokens"] / figures["draft_tokens"] < 0.1, figures
    finally:
        server.stop()
