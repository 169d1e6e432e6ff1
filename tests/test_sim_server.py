"""The simulator's HTTP side and its fault knobs, called in process (ASGI) and as a server."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from specdeploy.sim.engine import SimEngine, SpeculationSchedule
from specdeploy.sim.metrics import EngineMetrics
from specdeploy.sim.profiles import Faults, load_catalog
from specdeploy.sim.server import ServedModel, SimApp
from testbed.ports import free_port

REPO = Path(__file__).resolve().parent.parent
TARGET = "sim/llama-3.1-70b-h100"


def app_with(faults: Faults) -> SimApp:
    catalog = load_catalog()
    metrics = EngineMetrics("m", 512, 0)
    engine = SimEngine(catalog.target(TARGET), None, SpeculationSchedule(), metrics)
    engine.faults = faults
    return SimApp(engine, ServedModel(("m",), TARGET, 512), time.monotonic)


async def call(
    app: SimApp, path: str, body: dict[str, Any], method: str = "POST"
) -> tuple[int, dict[str, Any]]:
    sent: list[dict[str, Any]] = []
    raw = json.dumps(body).encode()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, json.loads(payload)


def completion(app: SimApp, **body: Any) -> tuple[int, dict[str, Any]]:
    request = {"model": "m", "prompt": "The cat sat", "max_tokens": 4, **body}
    return asyncio.run(call(app, "/v1/completions", request))


def test_an_error_rate_answers_that_status_before_the_engine_and_counts_it_in_http_only() -> None:
    app = app_with(Faults(error_rates={503: 1.0}))
    status, body = completion(app)
    assert status == 503
    assert body["error"]["type"] == "ServiceUnavailableError"
    assert body["error"]["code"] == 503
    registry = app.metrics.registry
    http = registry.get_sample_value(
        "http_requests_total", {"method": "POST", "status": "5xx", "handler": "/v1/completions"}
    )
    assert http == 1
    success = registry.get_sample_value(
        "vllm:request_success_total",
        {"model_name": "m", "engine": "0", "finished_reason": "length"},
    )
    assert success == 0


def test_the_fault_knobs_change_at_run_time_and_stay_out_of_the_http_families() -> None:
    app = app_with(Faults())
    assert completion(app)[0] == 200
    knobs = {"errorRates": {"503": 1.0}, "firstTokenExtraMs": 5}
    assert asyncio.run(call(app, "/sim/faults", knobs, "PUT")) == (200, knobs)
    assert asyncio.run(call(app, "/sim/faults", {}, "GET")) == (200, knobs)
    assert completion(app)[0] == 503
    status, body = asyncio.run(call(app, "/sim/faults", {"bogus": 1}, "PUT"))
    assert status == 400
    assert "unknown fault knob(s) bogus" in body["error"]["message"]
    assert asyncio.run(call(app, "/sim/faults", {}, "PUT"))[0] == 200
    assert completion(app)[0] == 200
    handlers = {
        sample.labels["handler"]
        for family in app.metrics.registry.collect()
        if family.name == "http_requests"
        for sample in family.samples
    }
    assert handlers == {"/v1/completions"}


def test_an_engine_error_finishes_with_error_and_answers_500() -> None:
    status, body = completion(app_with(Faults(engine_error_rate=1.0)))
    assert status == 500
    assert body["error"]["type"] == "InternalServerError"


def test_a_slower_first_token_delays_the_answer_by_its_time() -> None:
    began = time.monotonic()
    status, _ = completion(app_with(Faults(first_token_extra_ms=300)))
    assert status == 200
    assert time.monotonic() - began >= 0.3


def test_vllms_refusals_for_a_prompt_or_max_tokens_that_cannot_fit() -> None:
    app = app_with(Faults())
    assert completion(app, prompt="a " * 600)[1]["error"]["param"] == "input_tokens"
    assert completion(app, max_tokens=0)[1]["error"]["param"] == "max_tokens"
    status, body = completion(app, model="other")
    assert (status, body["error"]["message"]) == (
        404,
        "The model `other` does not exist. Valid aliases: m.",
    )
    # A completion that would not fit beside its prompt is shortened, as vLLM does.
    status, body = completion(app, prompt="a " * 500, max_tokens=100)
    assert status == 200
    assert body["usage"]["completion_tokens"] == 512 - 500


@pytest.fixture
def crashing(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    catalog = tmp_path / "catalog.yaml"
    target = {"stepMs": 1, "prefillTokensPerSecond": 100000, "kvTokens": 100000}
    faults = {"crashAfterRequests": 1, "startDelaySeconds": 1.0}
    catalog.write_text(yaml.safe_dump({"targets": {"sim/crashing": {**target, "faults": faults}}}))
    port = free_port()
    env = {"PYTHONPATH": str(REPO / "operator"), "SIM_CATALOG": str(catalog), "PATH": ""}
    began = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "specdeploy.sim", "--model", "sim/crashing", "--port", str(port)],
        env=env,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                requests.get(url + "/health", timeout=1)
                break
            except requests.ConnectionError:
                assert process.poll() is None, "the simulator exited before serving"
                assert time.monotonic() - began < 30
                time.sleep(0.1)
        assert time.monotonic() - began >= 1.0, "the port opened before the start delay"
        yield url, process
    finally:
        process.kill()
        process.wait(10)


def test_a_crash_after_n_requests_ends_the_process(
    crashing: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, process = crashing
    body = {"model": "sim/crashing", "prompt": "hi", "max_tokens": 2}
    assert requests.post(url + "/v1/completions", json=body, timeout=10).status_code == 200
    with pytest.raises(requests.ConnectionError):
        requests.post(url + "/v1/completions", json=body, timeout=10)
    assert process.wait(10) == 1
