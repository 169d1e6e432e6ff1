"""The probe inside an engine pod: its prompts, its figures from vLLM's counters, its middleware."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdeploy.api.contract import PROBE_ENV, PROBE_PROMPTS_ENV, PROBE_RUN_ENV
from specdeploy.engine import launcher
from specdeploy.engine.probe import (
    ProbeFigures,
    ProbeGate,
    ProbeSettings,
    append_to_exposition,
    parse_prompts,
    read_counters,
    render_probe_metrics,
    results_path,
    run_probe,
    settings_from_env,
    write_results,
)


def test_prompts_are_a_json_list_or_one_per_line() -> None:
    assert parse_prompts('["a b", "c\\nd"]') == ("a b", "c\nd")
    assert parse_prompts("The cat sat\n\n  A node sees \n") == ("The cat sat", "A node sees")
    for bad, why in (
        ("[1, 2]", "list of strings"),
        ("[", "not a JSON list"),
        (" \n", "no prompts"),
    ):
        with pytest.raises(ValueError, match=why):
            parse_prompts(bad)


def test_the_prompt_set_fingerprint_follows_prompts_and_sampling_not_the_timeout() -> None:
    base = ProbeSettings(prompts=("a", "b"))
    assert base.prompt_set == ProbeSettings(prompts=("a", "b"), timeout_seconds=5).prompt_set
    assert base.prompt_set != ProbeSettings(prompts=("b", "a")).prompt_set
    assert base.prompt_set != ProbeSettings(prompts=("a", "b"), max_tokens=65).prompt_set
    assert base.prompt_set != ProbeSettings(prompts=("a", "b"), temperature=0.5).prompt_set


def test_settings_come_from_the_pod_environment() -> None:
    env = {
        PROBE_ENV: json.dumps({"maxTokens": 16, "temperature": 0, "timeoutSeconds": 30}),
        PROBE_PROMPTS_ENV: "one\ntwo",
    }
    assert settings_from_env(env) == ProbeSettings(("one", "two"), 16, 0.0, 30.0)
    assert settings_from_env({}) is None
    with pytest.raises(ValueError, match="exceed"):
        settings_from_env({**env, PROBE_PROMPTS_ENV: "x" * (128 * 1024 + 1)})


def test_the_launcher_refuses_a_probe_without_prompts_as_unusable_arguments() -> None:
    env = {PROBE_ENV: "{}", PROBE_PROMPTS_ENV: ""}
    with pytest.raises(launcher.LaunchError) as refused:
        launcher.check_probe(env)
    assert refused.value.code == 2
    assert "the probe cannot run: the probe has no prompts" in refused.value.message
    good = {PROBE_ENV: "{}", PROBE_PROMPTS_ENV: "one"}
    launcher.check_probe(good)
    assert good[PROBE_RUN_ENV]  # this run's results file


METRICS_BEFORE = """\
# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.7e9
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 30.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 20.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="2"} 4.0
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="tiny"} 32.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="tiny"} 10.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 10.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="tiny"} 10.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="tiny"} 0.09
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.05
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 2.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="tiny"} 0.0
vllm:request_success_total{engine="0",finished_reason="error",model_name="tiny"} 0.0
"""


def _grown(text: str, by: dict[str, float]) -> str:
    """The exposition with some samples grown (keyed by the start of their line)."""
    lines = []
    for original in text.splitlines():
        line = original
        for start, delta in by.items():
            if line.startswith(start):
                name, value = line.rsplit(" ", 1)
                line = f"{name} {float(value) + delta}"
        lines.append(line)
    return "\n".join(lines) + "\n"


METRICS_AFTER = _grown(
    METRICS_BEFORE,
    {
        "vllm:spec_decode_num_drafts_total": 40,
        "vllm:spec_decode_num_draft_tokens_total": 120,
        "vllm:spec_decode_num_accepted_tokens_total": 90,
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",'
        'position="0"}': 38,
        "vllm:generation_tokens_total": 132,
        "vllm:inter_token_latency_seconds_count": 40,
        "vllm:inter_token_latency_seconds_sum": 0.4,
        "vllm:time_to_first_token_seconds_count": 2,
        "vllm:time_to_first_token_seconds_sum": 0.06,
        'vllm:request_success_total{engine="0",finished_reason="length"': 1,
        'vllm:request_success_total{engine="0",finished_reason="error"': 1,
    },
)
SETTINGS = ProbeSettings(prompts=("one", "two"), max_tokens=64)


def test_counters_are_read_by_exact_name_never_the_created_series() -> None:
    counters = read_counters(METRICS_BEFORE)
    assert counters.totals["vllm:spec_decode_num_drafts_total"] == 10.0
    assert counters.accepted_per_position == {0: 9.0, 1: 7.0, 2: 4.0}
    assert counters.finished_by_reason == {"length": 2.0, "abort": 0.0, "error": 0.0}


class FakeEngine:
    """vLLM as the probe sees it over HTTP: health, models, metrics, completions."""

    def __init__(self, failing: set[str] | None = None) -> None:
        self.metrics = [METRICS_BEFORE, METRICS_AFTER]
        self.prompts: list[str] = []
        self.failing = failing or set()
        self.healthy_after = 2

    def __call__(
        self, method: str, url: str, body: dict[str, Any] | None, timeout: float
    ) -> tuple[int, str]:
        path = url.split("8000", 1)[1]
        if path == "/health":
            self.healthy_after -= 1
            return (200 if self.healthy_after <= 0 else 0), ""
        if path == "/v1/models":
            return 200, json.dumps({"data": [{"id": "tiny"}]})
        if path == "/metrics":
            return 200, self.metrics.pop(0)
        assert body is not None
        assert (body["max_tokens"], body["temperature"], body["ignore_eos"]) == (64, 0.0, True)
        self.prompts.append(body["prompt"])
        if body["prompt"] in self.failing:
            return 500, "{}"
        return 200, json.dumps({"choices": [{"finish_reason": "length"}]})


def test_the_probe_waits_for_the_engine_sends_each_prompt_once_and_counts_only_itself() -> None:
    engine = FakeEngine()
    figures = run_probe(SETTINGS, "http://127.0.0.1:8000", engine, sleep=lambda _: None)
    assert engine.prompts == ["one", "two"]
    assert figures.complete
    assert (figures.requests, figures.errors) == (2, 1)  # the engine counted one error
    assert (figures.drafts, figures.draft_tokens, figures.accepted_tokens) == (40, 120, 90)
    assert figures.accepted_per_position == {0: 38.0, 1: 0.0, 2: 0.0}
    assert figures.output_tokens == 132
    assert figures.decode_steps == 40
    assert figures.decode_seconds == pytest.approx(0.4)
    assert figures.first_tokens == 2
    assert figures.first_token_seconds == pytest.approx(0.06)


def test_a_failed_request_counts_as_an_error_and_a_timeout_leaves_it_incomplete() -> None:
    engine = FakeEngine(failing={"one"})
    figures = run_probe(SETTINGS, "http://127.0.0.1:8000", engine, sleep=lambda _: None)
    assert figures.errors == 1
    ticks = iter([0.0, 0.0, 100.0, 1000.0])
    engine = FakeEngine()
    slow = ProbeSettings(prompts=("one", "two"), timeout_seconds=50)
    figures = run_probe(
        slow, "http://127.0.0.1:8000", engine, clock=lambda: next(ticks), sleep=lambda _: None
    )
    assert engine.prompts == ["one"]
    assert not figures.complete


def test_the_last_prompt_cut_by_the_timeout_is_incomplete_never_an_error() -> None:
    # The probe's deadline passes while the last prompt waits: no answer (status 0). That is
    # the probe's timeout, not the canary failing a request: incomplete, no error.
    class Stalled(FakeEngine):
        def __call__(
            self, method: str, url: str, body: dict[str, Any] | None, timeout: float
        ) -> tuple[int, str]:
            if body is not None and body["prompt"] == "two":
                self.prompts.append("two")
                now[0] = 1000.0
                return 0, ""
            return super().__call__(method, url, body, timeout)

    now = [0.0]
    engine = Stalled()
    engine.metrics = [METRICS_BEFORE, METRICS_BEFORE]  # the engine counted no error
    slow = ProbeSettings(prompts=("one", "two"), timeout_seconds=50)
    figures = run_probe(
        slow, "http://127.0.0.1:8000", engine, clock=lambda: now[0], sleep=lambda _: None
    )
    assert engine.prompts == ["one", "two"]
    assert not figures.complete
    assert figures.errors == 0
    assert figures.requests == 1  # the prompt answered


FIGURES = ProbeFigures(
    prompt_set="abc123",
    prompts=2,
    complete=True,
    requests=2,
    errors=0,
    output_tokens=132.0,
    drafts=40.0,
    draft_tokens=120.0,
    accepted_tokens=90.0,
    accepted_per_position={0: 38.0, 1: 30.0, 2: 22.0},
    decode_seconds=0.4,
    decode_steps=40.0,
    first_token_seconds=0.06,
    first_tokens=2.0,
)


def test_the_figures_are_gauges_labelled_with_the_prompt_set() -> None:
    text = render_probe_metrics(FIGURES)
    assert 'specdeploy_probe_draft_tokens{prompt_set="abc123"} 120.0' in text
    assert 'specdeploy_probe_complete{prompt_set="abc123"} 1.0' in text
    assert (
        'specdeploy_probe_accepted_tokens_per_position{prompt_set="abc123",position="1"} 30.0'
        in text
    )
    # Prometheus' text parser reads every figure back.
    samples = {
        (sample.name, sample.labels.get("position")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    assert samples[("specdeploy_probe_decode_seconds", None)] == 0.4
    assert samples[("specdeploy_probe_accepted_tokens_per_position", "2")] == 22.0
    assert len(samples) == 15


def test_the_figures_go_before_an_openmetrics_eof() -> None:
    extra = "x 1\n"
    assert append_to_exposition(b"a 1\n# EOF\n", extra) == b"a 1\nx 1\n# EOF\n"
    assert append_to_exposition(b"a 1", extra) == b"a 1\nx 1\n"


async def _call(
    gate: ProbeGate, path: str, headers: list[tuple[bytes, bytes]] | None = None
) -> Any:
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "path": path, "raw_path": path.encode(), "headers": headers or []}
    await gate(scope, receive, send)
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, dict(sent[0]["headers"]), body


class InnerApp:
    """vLLM's app as the middleware sees it: /health, /metrics (gzip if asked) and the rest."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.encodings: list[bytes | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        self.encodings.append(dict(scope["headers"]).get(b"accept-encoding"))
        body = b"vllm:up 1\n" if scope["path"] == "/metrics" else b""
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-length", str(len(body)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


def test_the_gate_holds_readiness_until_the_probe_is_over_then_follows_health(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    env = {PROBE_RUN_ENV: "run-1"}  # no probe settings: nothing is started here
    inner = InnerApp()
    gate = ProbeGate(inner, env)
    assert asyncio.run(_call(gate, "/specdeploy/ready"))[0] == 503
    status, _, body = asyncio.run(_call(gate, "/metrics"))
    assert (status, body) == (200, b"vllm:up 1\n")  # no figures before the probe is over
    write_results(results_path(env), FIGURES)
    assert asyncio.run(_call(gate, "/specdeploy/ready"))[0] == 200
    assert inner.paths[-1] == "/health"
    status, headers, body = asyncio.run(_call(gate, "/metrics", [(b"accept-encoding", b"gzip")]))
    assert body.startswith(b"vllm:up 1\n# TYPE specdeploy_probe_prompts gauge")
    assert headers[b"content-length"] == str(len(body)).encode()
    assert inner.encodings[-1] is None  # asked uncompressed, to append to it
    assert asyncio.run(_call(gate, "/v1/completions"))[0] == 200
    assert inner.paths[-1] == "/v1/completions"
