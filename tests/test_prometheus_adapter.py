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
    ENGINE_STEPS,
    GENERATION_TOKENS,
    HTTP_REQUESTS,
    INTER_TOKEN_LATENCY_COUNT,
    INTER_TOKEN_LATENCY_SUM,
    REQUEST_SUCCESS,
    STRETCH_QUERIES,
    TIME_TO_FIRST_TOKEN_COUNT,
    TIME_TO_FIRST_TOKEN_SUM,
    PrometheusReader,
    RevisionPods,
    accepted_by_position,
    autotune_queries,
    measurement_queries,
    probe_queries,
    window_increase,
)

PODS = RevisionPods("serving", "chat", "abc123")

# What the stand-in answers to each of the reader's queries, by figure: a number, or a vector
# of (labels, number).
ANSWERS: dict[str, str | list[tuple[dict[str, str], str]]] = {
    "acceptance_rate": "0.75",
    "mean_acceptance_length": "2.5",
    "draft_tokens": "4200",
    "drafts": "400",
    "accepted_per_position": [({"position": "1"}, "240"), ({"position": "0"}, "360")],
    "step_seconds_sum": "12.4",
    "steps": "400",
    "output_tokens": "1040",
    "first_token_seconds_sum": "NaN",
    "first_tokens": "40",
    "engine_steps": "440",
    "finished": "40",
    "failed": "2",
    "responses": "44",
    "server_errors": "NaN",
    # Newest first once read; a stretch without steps is NaN.
    "stretch_step_seconds": [
        ({"stretch": "2"}, "0.030"),
        ({"stretch": "0"}, "0.031"),
        ({"stretch": "3"}, "NaN"),
        ({"stretch": "1"}, "0.045"),
    ],
    # Each stretch's decode time over its own tokens decoded.
    "stretch_time_per_output_token": [
        ({"stretch": "1"}, "0.018"),
        ({"stretch": "0"}, "0.0124"),
        ({"stretch": "2"}, "0.012"),
    ],
}
QUERIES = {query: name for name, query in measurement_queries(PODS, "5m", "1m").items()}


def autotune_answers(revision: str, scraped_max: str) -> dict[str, str]:
    """The stand-in's answers to the autotuner's queries for `revision`: 100 decode steps and 10
    prefills in 110 engine steps (one sequence a step), and what the gauge showed at scrapes."""
    figures = {
        "drafts": "100",
        "draft_tokens": "100",
        "step_seconds": "0.01",
        "decode_steps": "100",
        "first_tokens": "10",
        "engine_steps": "110",
        "scraped_max_batch_size": scraped_max,
    }
    queries = autotune_queries(RevisionPods("serving", "chat", revision), "5m")
    return {queries[name]: value for name, value in figures.items()}


# By query: the autotuner's, for a revision whose short batches fell between scrapes and for
# one whose scrapes caught three at once.
BY_QUERY = {**autotune_answers("between", "0"), **autotune_answers("caught", "3")}


class FakePrometheus(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        name = QUERIES.get(query)
        value = ANSWERS[name] if name is not None else BY_QUERY.get(query)
        if isinstance(value, list):
            result = [{"metric": labels, "value": [0, number]} for labels, number in value]
        else:
            result = [] if value is None else [{"metric": {}, "value": [0, value]}]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}}
        self.send_response(200)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


class BehindAProxy(FakePrometheus):
    """Refuses a long request line with 414, as a proxy in front of Prometheus does (nginx
    from 8 KiB by default; 4 KiB here, between the stretches' query and the longest other)."""

    def do_GET(self) -> None:
        if len(self.path) > 4096:
            self.send_response(414)
            self.end_headers()
            return
        super().do_GET()


def serve(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def proxied() -> Iterator[str]:
    yield from serve(BehindAProxy)


@pytest.fixture
def prometheus() -> Iterator[str]:
    yield from serve(FakePrometheus)


#: The labels a pod's series are told apart by, when its doubles (two scrape jobs) fold.
PER_SERIES = "pod, engine, finished_reason, position, le, handler, method, status"
SELECTOR = '{namespace="serving",specdeploy_dev_name="chat",specdeploy_dev_revision="abc123"}'


def counted(metric: str, by: str = "") -> str:
    """window_increase's PromQL spelled out, for a 5m window over SELECTOR."""
    series = f"{metric}{SELECTOR}[5m]"
    seen_before = f"present_over_time({series} offset 5m)"
    grouping = f" by ({by})" if by else ""
    per_series = PER_SERIES + (f", {by}" if by and by not in PER_SERIES.split(", ") else "")
    return (
        f"sum{grouping} (max by ({per_series}) ((increase({series}) and {seen_before}) or "
        f"(last_over_time({series}) unless {seen_before})))"
    )


def test_a_series_first_seen_inside_the_window_counts_from_zero() -> None:
    # increase() over the window for a series Prometheus saw in the window before; all of its
    # last value for one it first saw inside the window (a pod that served before its first
    # scrape). The real Prometheus' answers are checked in e2e/test_prometheus_counting.py.
    metric = "vllm:spec_decode_num_draft_tokens_total"
    assert window_increase(metric, SELECTOR, "5m") == counted(metric)
    assert PODS.selector == SELECTOR


def test_a_window_ending_earlier_is_counted_the_same_way() -> None:
    metric = "vllm:inter_token_latency_seconds_sum"
    shifted = window_increase(metric, SELECTOR, "1m", ago=120)
    series = f"{metric}{SELECTOR}[1m] offset 120s"
    seen_before = f"present_over_time({metric}{SELECTOR}[1m] offset 180s)"
    assert shifted == (
        f"sum (max by ({PER_SERIES}) ((increase({series}) and {seen_before}) or "
        f"(last_over_time({series}) unless {seen_before})))"
    )


def stretch(ago: int, length: str) -> str:
    return (
        f"label_replace("
        f"{window_increase(INTER_TOKEN_LATENCY_SUM, SELECTOR, length, ago=ago)} / "
        f"{window_increase(INTER_TOKEN_LATENCY_COUNT, SELECTOR, length, ago=ago)}, "
        f'"stretch", "{ago // int(length[:-1])}", "", "")'
    )


@pytest.mark.parametrize(
    ("window", "interval", "stretches"),
    [
        # The defaults: five stretches of one interval, tiling the window back from now.
        ("5m", "60s", [(0, "60s"), (60, "60s"), (120, "60s"), (180, "60s"), (240, "60s")]),
        # A window cut at a live canary's start, not a whole number of intervals: as many
        # stretches as whole intervals, of whole seconds, from now back (the oldest 2 s left
        # out).
        ("35s", "10s", [(0, "11s"), (11, "11s"), (22, "11s")]),
        # More intervals than MAX_STRETCHES: ten longer stretches.
        ("1h", "30s", [(n * 360, "360s") for n in range(10)]),
        # A window shorter than an interval: one stretch, the whole window.
        ("5s", "10s", [(0, "5s")]),
    ],
)
def test_the_step_time_is_read_per_stretch_of_the_window(
    window: str, interval: str, stretches: list[tuple[int, str]]
) -> None:
    queries = measurement_queries(PODS, window, interval)
    assert queries["stretch_step_seconds"] == " or ".join(
        stretch(ago, length) for ago, length in stretches
    )
    # The time per output token of the same stretches: each its decode time over the tokens
    # it decoded (generation tokens less first tokens), none where it decoded nothing.
    assert queries["stretch_time_per_output_token"] == " or ".join(
        f"label_replace("
        f"{window_increase(INTER_TOKEN_LATENCY_SUM, SELECTOR, length, ago=ago)} / "
        f"(({window_increase(GENERATION_TOKENS, SELECTOR, length, ago=ago)} - "
        f"{window_increase(TIME_TO_FIRST_TOKEN_COUNT, SELECTOR, length, ago=ago)}) > 0), "
        f'"stretch", "{ago // int(length[:-1])}", "", "")'
        for ago, length in stretches
    )
    # Without the interval, no stretches are asked for.
    assert not set(STRETCH_QUERIES) & set(measurement_queries(PODS, window))


def test_the_sum_is_grouped_by_the_labels_asked_for() -> None:
    query = window_increase("vllm:time_to_first_token_seconds_bucket", "{}", "20s", ("le",))
    assert query.startswith(
        f"sum by (le) (max by ({PER_SERIES}) "
        "((increase(vllm:time_to_first_token_seconds_bucket{}[20s])"
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
    measured = measurement_queries(PODS, "5m")
    tuned = autotune_queries(PODS, "5m")
    figures = {
        **{f"measurement {name}": query for name, query in measured.items()},
        **{f"autotune {name}": query for name, query in tuned.items()},
    }
    failed = SELECTOR[:-1] + ',finished_reason=~"error|abort"}'
    helpers = sorted(
        {
            counted(metric, by)
            for metric, by in (
                (ACCEPTED_TOKENS, ""),
                (DRAFT_TOKENS, ""),
                (DRAFTS, ""),
                (ACCEPTED_PER_POSITION, "position"),
                (INTER_TOKEN_LATENCY_SUM, ""),
                (INTER_TOKEN_LATENCY_COUNT, ""),
                (TIME_TO_FIRST_TOKEN_SUM, ""),
                (TIME_TO_FIRST_TOKEN_COUNT, ""),
                (GENERATION_TOKENS, ""),
                (ENGINE_STEPS, ""),
                (REQUEST_SUCCESS, ""),
                (HTTP_REQUESTS, ""),
            )
        }
        | {window_increase(REQUEST_SUCCESS, failed, "5m")}
        | {window_increase(HTTP_REQUESTS, SELECTOR[:-1] + ',status="5xx"}', "5m")},
        key=len,
        reverse=True,
    )
    for name, query in figures.items():
        rest = query
        for helper in helpers:
            rest = rest.replace(helper, "<counted>")
        assert "increase(" not in rest, (name, rest)
        assert "rate(" not in rest, (name, rest)
        # Sums and counts only: no quantile interpolated inside vLLM's buckets.
        assert "histogram_quantile" not in query, name
    assert measured["acceptance_rate"] == f"{counted(ACCEPTED_TOKENS)} / {counted(DRAFT_TOKENS)}"
    assert measured["mean_acceptance_length"] == (
        f"1 + {counted(ACCEPTED_TOKENS)} / {counted(DRAFTS)}"
    )
    assert measured["draft_tokens"] == counted(DRAFT_TOKENS)
    assert measured["steps"] == counted(INTER_TOKEN_LATENCY_COUNT)
    assert measured["first_tokens"] == counted(TIME_TO_FIRST_TOKEN_COUNT)
    assert measured["failed"] == window_increase(REQUEST_SUCCESS, failed, "5m")
    assert tuned["drafts"] == counted(DRAFTS)
    assert tuned["draft_tokens"] == counted(DRAFT_TOKENS)
    assert tuned["accepted_per_position"] == counted(ACCEPTED_PER_POSITION, "position")


def test_queries_select_the_revision_by_namespace_and_label() -> None:
    queries = measurement_queries(PODS, "5m")
    for name, query in queries.items():
        metric = "http_requests_total" if name in ("responses", "server_errors") else "vllm:"
        assert metric in query
        # Every series by the revision's namespace and label (the failed requests' also by
        # their finish reason, the 5xx responses by their status).
        assert query.count(metric) == query.count(SELECTOR[:-1]) > 0
    # The step time's sum and count, exact where a p50 is interpolated inside a bucket: the
    # autotuner's step cost is their ratio.
    assert autotune_queries(PODS, "5m")["step_seconds"] == (
        f"{queries['step_seconds_sum']} / {queries['steps']}"
    )


def test_reads_every_figure_and_nan_is_no_figure(prometheus: str) -> None:
    measured = PrometheusReader(prometheus).measure(PODS, "5m", "1m")
    assert measured.error is None
    assert measured.acceptance_rate == pytest.approx(0.75)
    assert measured.mean_acceptance_length == pytest.approx(2.5)
    assert measured.draft_tokens == pytest.approx(4200)
    # Accepted at each position over the drafts, position 0 first.
    assert measured.acceptance_per_position == pytest.approx((0.9, 0.6))
    # The stretches newest first, the one without steps left out; the median of three is
    # judged, the window's mean (12.4 s / 400 steps) is kept beside it.
    assert measured.stretch_step_seconds == pytest.approx((0.031, 0.045, 0.030))
    assert measured.step_seconds == pytest.approx(0.031)
    assert measured.mean_step_seconds == pytest.approx(0.031)
    assert measured.tokens_per_step == pytest.approx(2.5)  # (1040 - 40) / 400
    # The median of the stretches' own, each over its own tokens per step.
    assert measured.stretch_time_per_output_token == pytest.approx((0.0124, 0.018, 0.012))
    assert measured.time_per_output_token == pytest.approx(0.0124)
    assert measured.time_to_first_token is None
    assert measured.batch_size == pytest.approx(1.0)  # (400 + 40) / 440
    # No 5xx series in the window: none of the 44 responses was one.
    assert (measured.responses, measured.server_errors) == (44.0, 0.0)
    assert measured.error_rate == pytest.approx(0.05)


def test_a_refused_stretches_query_leaves_the_window_s_mean_to_judge(
    proxied: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader = PrometheusReader(proxied)
    for _ in range(2):
        measured = reader.measure(PODS, "5m", "1m")
        # Every other figure read; no stretches, so the step time is the window's mean.
        assert measured.error is None
        assert measured.stretch_step_seconds == ()
        assert measured.acceptance_rate == pytest.approx(0.75)
        assert measured.step_seconds == pytest.approx(0.031)
        assert measured.stretch_time_per_output_token == ()
        assert measured.time_per_output_token == pytest.approx(0.0124)  # 12.4 s / 1000 tokens
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1, warned  # once per cause
    assert "414" in warned[0].getMessage()
    assert "the window's own step time and time per output token are judged" in (
        warned[0].getMessage()
    )


def test_no_traffic_gives_no_rate(prometheus: str) -> None:
    measured = PrometheusReader(prometheus).measure(RevisionPods("serving", "chat", "idle"), "5m")
    assert measured.acceptance_rate is None
    assert measured.draft_tokens == 0


def test_unreachable_prometheus_is_a_measurement_with_the_error() -> None:
    unreachable = PrometheusReader("http://127.0.0.1:9", timeout=1)
    measured = unreachable.measure(RevisionPods("ns", "sd", "rev"), "5m")
    assert measured.error is not None
    assert "127.0.0.1:9" in measured.error
    # The cause, short enough for status and Events; the query is only logged.
    assert "Connection refused" in measured.error
    assert "vllm:" not in measured.error
    assert measured.acceptance_rate is None


def test_the_autotuner_counts_its_mean_batch_and_bounds_the_scraped_largest_by_it(
    prometheus: str,
) -> None:
    queries = autotune_queries(PODS, "5m")
    assert queries["decode_steps"] == counted(INTER_TOKEN_LATENCY_COUNT)
    assert queries["first_tokens"] == counted(TIME_TO_FIRST_TOKEN_COUNT)
    assert queries["engine_steps"] == counted(ENGINE_STEPS)
    assert queries["scraped_max_batch_size"] == (
        f"max(max_over_time(vllm:num_requests_running{SELECTOR}[5m]))"
    )
    reader = PrometheusReader(prometheus)
    # Every step ran a sequence, yet each scrape fell between requests and read the gauge at 0.
    between = reader.measure_autotune(RevisionPods("serving", "chat", "between"), "5m")
    assert between.error is None
    assert between.mean_batch_size == pytest.approx(1.0)  # (100 + 10) / 110
    assert between.max_batch_size == pytest.approx(1.0)
    caught = reader.measure_autotune(RevisionPods("serving", "chat", "caught"), "5m")
    assert caught.mean_batch_size == pytest.approx(1.0)
    assert caught.max_batch_size == pytest.approx(3.0)


def test_per_position_answers_are_ordered_by_position_with_gaps_as_zero() -> None:
    result = [
        {"metric": {"position": "2"}, "value": [0, "30"]},
        {"metric": {"position": "0"}, "value": [0, "80"]},
        {"metric": {"position": "3"}, "value": [0, "NaN"]},
    ]
    assert accepted_by_position(result) == (80.0, 0.0, 30.0)
    assert accepted_by_position([]) == ()


PROBE_ANSWERS = {
    # Two pods ran prompt set "a1", one pod (started before the ConfigMap changed) set "b2".
    "pods": [("a1", "2"), ("b2", "1")],
    "complete": [("a1", "2"), ("b2", "1")],
    "prompts": [("a1", "8"), ("b2", "6")],
    "requests": [("a1", "16"), ("b2", "6")],
    "errors": [("a1", "0")],
    "output_tokens": [("a1", "1024"), ("b2", "384")],
    "drafts": [("a1", "300")],
    "draft_tokens": [("a1", "900")],
    "accepted_tokens": [("a1", "720")],
    "decode_seconds": [("a1", "3.0")],
    "decode_steps": [("a1", "300")],
    "first_token_seconds": [("a1", "0.32")],
    "first_tokens": [("a1", "16")],
}


def test_the_probe_s_figures_are_summed_over_pods_by_prompt_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queries = probe_queries(PODS)
    assert queries["draft_tokens"] == (
        f"sum by (prompt_set) (max by (pod, prompt_set) (specdeploy_probe_draft_tokens{SELECTOR}))"
    )
    by_query = {query: name for name, query in queries.items()}
    reader = PrometheusReader("http://127.0.0.1:9")

    def vector(query: str) -> list[dict[str, Any]]:
        name = by_query[query]
        if name == "accepted_tokens_per_position":
            return [
                {"metric": {"prompt_set": "a1", "position": str(p)}, "value": [0, v]}
                for p, v in ((0, "280"), (1, "240"), (2, "200"))
            ]
        return [
            {"metric": {"prompt_set": key}, "value": [0, value]}
            for key, value in PROBE_ANSWERS[name]
        ]

    monkeypatch.setattr(reader, "_vector", vector)
    probe = reader.measure_probe(PODS)
    assert probe is not None
    assert (probe.prompt_set, probe.pods, probe.complete, probe.prompts) == ("a1", 2, True, 8)
    assert probe.acceptance_rate == pytest.approx(0.8)
    assert probe.tokens_per_step == pytest.approx(3.36)  # (1024 - 16) / 300
    assert probe.accepted_per_position == (280.0, 240.0, 200.0)
    assert probe.time_to_first_token == pytest.approx(0.02)


def test_no_pod_reporting_a_probe_is_no_probe_and_a_failed_query_says_why() -> None:
    unreachable = PrometheusReader("http://127.0.0.1:9", timeout=1)
    assert unreachable.measure_probe(RevisionPods("ns", "sd", "r")) is not None
    failed = unreachable.measure_probe(RevisionPods("ns", "sd", "r"))
    assert failed is not None
    assert failed.error is not None
    assert "127.0.0.1:9" in failed.error


class _ScrapedAfter:
    """Prometheus answering nothing to the first `calls` queries, then the probe's figures."""

    def __init__(self, calls: int, by_query: dict[str, str]) -> None:
        self.calls = calls
        self.by_query = by_query
        self.made = 0

    def __call__(self, query: str) -> list[dict[str, Any]]:
        self.made += 1
        if self.made <= self.calls:
            return []  # not scraped yet
        name = self.by_query[query]
        if name == "accepted_tokens_per_position":
            return [{"metric": {"prompt_set": "a1", "position": "0"}, "value": [0, "280"]}]
        return [
            {"metric": {"prompt_set": key}, "value": [0, value]}
            for key, value in PROBE_ANSWERS[name]
        ]


def test_a_scrape_between_the_probe_s_queries_is_never_read_as_an_incomplete_probe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pods' gauges appear together in one scrape and stay. Wherever that scrape lands among
    # the queries, the reading is either none yet or the whole probe: a CI run read a complete
    # probe as incomplete (the `complete` gauge queried before the scrape, the pods after) and
    # the canary was judged on live traffic alone.
    queries = probe_queries(PODS)
    by_query = {query: name for name, query in queries.items()}
    for scraped_after in range(len(queries) + 2):  # the pods are counted first and last
        reader = PrometheusReader("http://127.0.0.1:9")
        monkeypatch.setattr(reader, "_vector", _ScrapedAfter(scraped_after, by_query))
        probe = reader.measure_probe(PODS)
        if probe is None:
            assert scraped_after > 0
            continue
        assert scraped_after == 0, (scraped_after, probe)
        assert (probe.pods, probe.complete, probe.draft_tokens) == (2, True, 900.0)
