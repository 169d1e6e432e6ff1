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
    PrometheusUnavailableError,
    acceptance_queries,
    read_acceptance,
)


class FakePrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        if query.startswith("1 + "):
            value = "2.5"
        elif query.startswith("sum(increase"):
            value = "4200"
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
    queries = acceptance_queries("serving", "abc123", "5m")
    assert queries["acceptance_rate"] == (
        'sum(rate(vllm:spec_decode_num_accepted_tokens_total{namespace="serving",'
        'specdeploy_dev_revision="abc123"}[5m])) / '
        'sum(rate(vllm:spec_decode_num_draft_tokens_total{namespace="serving",'
        'specdeploy_dev_revision="abc123"}[5m]))'
    )
    assert queries["mean_acceptance_length"].startswith("1 + ")
    assert "vllm:spec_decode_num_drafts_total" in queries["mean_acceptance_length"]


def test_reads_the_three_figures(prometheus: str) -> None:
    acceptance = read_acceptance(prometheus, "serving", "abc123")
    assert acceptance.acceptance_rate == pytest.approx(0.75)
    assert acceptance.mean_acceptance_length == pytest.approx(2.5)
    assert acceptance.draft_tokens == pytest.approx(4200)


def test_no_traffic_gives_no_rate(prometheus: str) -> None:
    acceptance = read_acceptance(prometheus, "serving", "idle")
    assert acceptance.acceptance_rate is None
    assert acceptance.draft_tokens == 0


def test_unreachable_prometheus_is_reported() -> None:
    with pytest.raises(PrometheusUnavailableError):
        read_acceptance("http://127.0.0.1:9", "ns", "rev", timeout=1)
