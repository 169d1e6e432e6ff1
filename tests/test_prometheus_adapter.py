"""Acceptance per revision from Prometheus' HTTP API (a local stand-in server)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specdeploy.adapters.prometheus import (
    PrometheusReader,
    accepted_by_position,
    autotune_queries,
    measurement_queries,
)


class FakePrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        if query.startswith("1 + "):
            value = "2.5"
        elif "inter_token_latency_seconds_sum" in query:
            value = "0.031"
        elif query.startswith("sum(increase"):
            value = "4200"
        elif "inter_token_latency" in query:
            value = "0.025"
        elif "time_to_first_token" in query:
            value = "NaN"
        else:
            value = "0.75"
        result = [] if 'revision="idle"' in query else [{"metric": {}, "value": [0, value]}]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def prometheus() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakePrometheus)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_queries_select_the_revision_by_namespace_and_label() -> None:
    queries = measurement_queries("serving", "abc123", "5m")
    assert queries["acceptance_rate"] == (
        'sum(rate(vllm:spec_decode_num_accepted_tokens_total{namespace="serving",'
        'specdeploy_dev_revision="abc123"}[5m])) / '
        'sum(rate(vllm:spec_decode_num_draft_tokens_total{namespace="serving",'
        'specdeploy_dev_revision="abc123"}[5m]))'
    )
    assert queries["mean_acceptance_length"].startswith("1 + ")
    assert "vllm:spec_decode_num_drafts_total{" in queries["mean_acceptance_length"]
    assert queries["inter_token_latency_p50"] == (
        "histogram_quantile(0.5, sum by (le) (rate(vllm:inter_token_latency_seconds_bucket"
        '{namespace="serving",specdeploy_dev_revision="abc123"}[5m])))'
    )
    # The mean step time, exact where the p50 is interpolated inside a bucket, and the very
    # figure the autotuner records as a step cost.
    assert queries["step_seconds"] == (
        'sum(increase(vllm:inter_token_latency_seconds_sum{namespace="serving",'
        'specdeploy_dev_revision="abc123"}[5m])) / '
        'sum(increase(vllm:inter_token_latency_seconds_count{namespace="serving",'
        'specdeploy_dev_revision="abc123"}[5m]))'
    )
    assert queries["step_seconds"] == autotune_queries("serving", "abc123", "5m")["step_seconds"]


def test_reads_every_figure_and_nan_is_no_figure(prometheus: str) -> None:
    measured = PrometheusReader(prometheus).measure("serving", "abc123", "5m")
    assert measured.error is None
    assert measured.acceptance_rate == pytest.approx(0.75)
    assert measured.mean_acceptance_length == pytest.approx(2.5)
    assert measured.draft_tokens == pytest.approx(4200)
    assert measured.inter_token_latency_p50 == pytest.approx(0.025)
    assert measured.step_seconds == pytest.approx(0.031)
    assert measured.time_to_first_token_p50 is None


def test_no_traffic_gives_no_rate(prometheus: str) -> None:
    measured = PrometheusReader(prometheus).measure("serving", "idle", "5m")
    assert measured.acceptance_rate is None
    assert measured.draft_tokens == 0


def test_unreachable_prometheus_is_a_measurement_with_the_error() -> None:
    measured = PrometheusReader("http://127.0.0.1:9", timeout=1).measure("ns", "rev", "5m")
    assert measured.error is not None
    assert "127.0.0.1:9" in measured.error
    assert measured.acceptance_rate is None


def test_autotune_queries_read_the_per_position_counters_by_position() -> None:
    queries = autotune_queries("serving", "abc123", "5m")
    selector = '{namespace="serving",specdeploy_dev_revision="abc123"}'
    assert queries["accepted_per_position"] == (
        "sum by (position) (increase("
        f"vllm:spec_decode_num_accepted_tokens_per_pos_total{selector}[5m]))"
    )
    assert queries["drafts"] == f"sum(increase(vllm:spec_decode_num_drafts_total{selector}[5m]))"
    assert queries["step_seconds"] == (
        f"sum(increase(vllm:inter_token_latency_seconds_sum{selector}[5m])) / "
        f"sum(increase(vllm:inter_token_latency_seconds_count{selector}[5m]))"
    )
    assert (
        queries["mean_batch_size"] == f"avg(avg_over_time(vllm:num_requests_running{selector}[5m]))"
    )


def test_per_position_answers_are_ordered_by_position_with_gaps_as_zero() -> None:
    result = [
        {"metric": {"position": "2"}, "value": [0, "30"]},
        {"metric": {"position": "0"}, "value": [0, "80"]},
        {"metric": {"position": "3"}, "value": [0, "NaN"]},
    ]
    assert accepted_by_position(result) == (80.0, 0.0, 30.0)
    assert accepted_by_position([]) == ()
