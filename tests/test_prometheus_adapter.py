"""The reader's PromQL, and its answers read from Prometheus' HTTP API (a local stand-in server)."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specdeploy.adapters.prometheus import (
    ACCEPTED_PER_POSITION,
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    DRAFTS,
    INTER_TOKEN_LATENCY,
    INTER_TOKEN_LATENCY_COUNT,
    INTER_TOKEN_LATENCY_SUM,
    TIME_TO_FIRST_TOKEN,
    PrometheusReader,
    accepted_by_position,
    autotune_queries,
    measurement_queries,
    revision_selector,
    window_increase,
)

# What the stand-in answers to each of the reader's queries, by figure.
ANSWERS = {
    "acceptance_rate": "0.75",
    "mean_acceptance_length": "2.5",
    "draft_tokens": "4200",
    "inter_token_latency_p50": "0.025",
    "step_seconds": "0.031",
    "time_to_first_token_p50": "NaN",
}
QUERIES = {query: name for name, query in measurement_queries("serving", "abc123", "5m").items()}


class FakePrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        name = QUERIES.get(query)
        result = [] if name is None else [{"metric": {}, "value": [0, ANSWERS[name]]}]
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


SELECTOR = '{namespace="serving",specdeploy_dev_revision="abc123"}'


def counted(metric: str, by: str = "") -> str:
    """window_increase's PromQL spelled out, for a 5m window over SELECTOR."""
    series = f"{metric}{SELECTOR}[5m]"
    seen_before = f"present_over_time({series} offset 5m)"
    grouping = f" by ({by})" if by else ""
    return (
        f"sum{grouping} ((increase({series}) and {seen_before}) or "
        f"(last_over_time({series}) unless {seen_before}))"
    )


def test_a_series_first_seen_inside_the_window_counts_from_zero() -> None:
    # increase() over the window for a series Prometheus saw in the window before; all of its
    # last value for one it first saw inside the window (a pod that served before its first
    # scrape). The real Prometheus' answers are checked in e2e/test_prometheus_counting.py.
    metric = "vllm:spec_decode_num_draft_tokens_total"
    assert window_increase(metric, SELECTOR, "5m") == counted(metric)
    assert revision_selector("serving", "abc123") == SELECTOR


def test_the_sum_is_grouped_by_the_labels_asked_for() -> None:
    query = window_increase("vllm:time_to_first_token_seconds_bucket", "{}", "20s", ("le",))
    assert query.startswith(
        "sum by (le) ((increase(vllm:time_to_first_token_seconds_bucket{}[20s])"
    )
    two = window_increase("vllm:request_success_total", "{}", "1m", ("le", "finished_reason"))
    assert two.startswith("sum by (le, finished_reason) (")


@pytest.mark.parametrize(
    "name",
    [
        "vllm:spec_decode_num_.*_total",
        '{__name__=~"vllm:spec_decode.*"}',
        'vllm:spec_decode_num_drafts_total{engine="0"}',
        "",
        "0vllm",
    ],
)
def test_only_an_exact_metric_name_is_counted(name: str) -> None:
    # A regular expression over names would sum in the `<name>_created` series.
    with pytest.raises(ValueError, match="not a metric name"):
        window_increase(name, SELECTOR, "5m")


def test_every_counter_based_figure_counts_a_new_series_from_zero() -> None:
    # Once each window_increase of the reader's queries is taken out, no bare increase() or
    # rate() is left: no figure can lose the requests a pod served before its first scrape.
    measured = measurement_queries("serving", "abc123", "5m")
    tuned = autotune_queries("serving", "abc123", "5m")
    figures = {
        **{f"measurement {name}": query for name, query in measured.items()},
        **{f"autotune {name}": query for name, query in tuned.items()},
    }
    helpers = sorted(
        {
            counted(metric, by)
            for metric, by in (
                (ACCEPTED_TOKENS, ""),
                (DRAFT_TOKENS, ""),
                (DRAFTS, ""),
                (ACCEPTED_PER_POSITION, "position"),
                (INTER_TOKEN_LATENCY, "le"),
                (INTER_TOKEN_LATENCY_SUM, ""),
                (INTER_TOKEN_LATENCY_COUNT, ""),
                (TIME_TO_FIRST_TOKEN, "le"),
            )
        },
        key=len,
        reverse=True,
    )
    for name, query in figures.items():
        rest = query
        for helper in helpers:
            rest = rest.replace(helper, "<counted>")
        assert "increase(" not in rest, (name, rest)
        assert "rate(" not in rest, (name, rest)
    assert measured["acceptance_rate"] == f"{counted(ACCEPTED_TOKENS)} / {counted(DRAFT_TOKENS)}"
    assert measured["mean_acceptance_length"] == (
        f"1 + {counted(ACCEPTED_TOKENS)} / {counted(DRAFTS)}"
    )
    assert measured["draft_tokens"] == counted(DRAFT_TOKENS)
    assert measured["inter_token_latency_p50"] == (
        f"histogram_quantile(0.5, {counted(INTER_TOKEN_LATENCY, 'le')})"
    )
    assert measured["time_to_first_token_p50"] == (
        f"histogram_quantile(0.5, {counted(TIME_TO_FIRST_TOKEN, 'le')})"
    )
    assert tuned["drafts"] == counted(DRAFTS)
    assert tuned["draft_tokens"] == counted(DRAFT_TOKENS)
    assert tuned["accepted_per_position"] == counted(ACCEPTED_PER_POSITION, "position")


def test_queries_select_the_revision_by_namespace_and_label() -> None:
    queries = measurement_queries("serving", "abc123", "5m")
    for query in queries.values():
        assert "vllm:" in query
        assert query.count("vllm:") == query.count(f"{SELECTOR}[5m]")
    # The mean step time, exact where the p50 is interpolated inside a bucket, and the very
    # figure the autotuner records as a step cost.
    assert queries["step_seconds"] == (
        f"{counted(INTER_TOKEN_LATENCY_SUM)} / {counted(INTER_TOKEN_LATENCY_COUNT)}"
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
    # The cause, short enough for status and Events; the query is only logged.
    assert "Connection refused" in measured.error
    assert "vllm:" not in measured.error
    assert measured.acceptance_rate is None


def test_autotune_batch_sizes_are_gauges_averaged_over_the_window() -> None:
    queries = autotune_queries("serving", "abc123", "5m")
    assert queries["mean_batch_size"] == (
        f"avg(avg_over_time(vllm:num_requests_running{SELECTOR}[5m]))"
    )
    assert queries["max_batch_size"] == (
        f"max(max_over_time(vllm:num_requests_running{SELECTOR}[5m]))"
    )


def test_per_position_answers_are_ordered_by_position_with_gaps_as_zero() -> None:
    result = [
        {"metric": {"position": "2"}, "value": [0, "30"]},
        {"metric": {"position": "0"}, "value": [0, "80"]},
        {"metric": {"position": "3"}, "value": [0, "NaN"]},
    ]
    assert accepted_by_position(result) == (80.0, 0.0, 30.0)
    assert accepted_by_position([]) == ()
