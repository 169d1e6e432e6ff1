"""The operator's counting of counters (`window_increase`), and its step time per stretch of a
window (`stretch_step_seconds`), as the test bed's real Prometheus answers them.

Two local exporters are scraped through a file service-discovery target in the test bed's
Prometheus (every 2 s). One serves a counter that grows steadily, one whose value drops to zero
(a restarted container), one that appears already at 205 (a pod that served requests before
its first scrape) and the `_created` series beside them; the other serves a growing counter and
fails two of its scrapes (Prometheus then writes staleness markers). Once Prometheus holds all
of it, the helper's PromQL is evaluated at many moments around those events (the HTTP API's
`time` parameter) and compared with what Prometheus' own samples say each window held.

One exporter is scraped through two targets that differ by a label only (a PodMonitor and an
annotations job both reading one pod): the helper counts the pod once, where a plain sum counts
it twice.

A third exporter serves vLLM's inter-token latency sum and count with a mean step of 20 ms,
30 ms for one stretch's worth of time: each stretch's step time is the sum's growth over the
count's between its first and last scrape, exactly, and the median of the stretches is the
20 ms the exporter ran at the rest of the time. Its generation tokens and first tokens grow
too, 2.5 tokens a step in the slow time (speculation on): each stretch's time per output
token is its sum's growth over its own tokens decoded, exactly.
"""

from __future__ import annotations

import itertools
import json
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_api_client import PrometheusConnect

from specdeploy.adapters.prometheus import (
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY_COUNT,
    INTER_TOKEN_LATENCY_SUM,
    TIME_TO_FIRST_TOKEN_COUNT,
    RevisionPods,
    by_stretch,
    stretch_step_seconds,
    stretch_time_per_output_token,
    window_increase,
)
from testbed import ClusterEnv, eventually

pytestmark = pytest.mark.e2e

METRIC = "specdeploy_counting_requests_total"
CREATED = "specdeploy_counting_requests_created"
WINDOW_S = 10  # five of the test bed's 2 s scrapes
WINDOW = f"{WINDOW_S}s"
BORN_AT = 205.0
RATE = 10.0  # per second, for the counters that grow


class Exporter:
    """Serves `/metrics` from functions of the time, one per series; `failing` answers 500."""

    def __init__(self, series: dict[str, Callable[[float], float | None]]) -> None:
        self.series = series
        self.failing = False
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if exporter.failing:
                    self.send_response(500)
                    self.end_headers()
                    return
                now = time.time()
                lines = []
                for name, value_at in exporter.series.items():
                    value = value_at(now)
                    if value is not None:
                        lines.append(f"{name} {value}")
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_port
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def registered(
    cluster: ClusterEnv,
    exporters: list[Exporter],
    scrapes: list[dict[str, str]] | None = None,
) -> tuple[str, Path]:
    """(label matchers, target file): the exporters as targets of the test bed's Prometheus,
    under a namespace label of their own, each with the labels of `scrapes` (by position)
    beside; the matchers are the operator's own for one SD's revision."""
    if not cluster.prometheus_sd_dir:
        raise RuntimeError("this test needs the test bed's Prometheus file service discovery")
    pods = RevisionPods(f"counting-{uuid.uuid4().hex[:8]}", "counting", "r1")
    target_file = Path(cluster.prometheus_sd_dir) / f"{pods.namespace}.json"
    groups = [
        {
            "targets": [f"127.0.0.1:{exporter.port}"],
            "labels": {
                "namespace": pods.namespace,
                "specdeploy_dev_name": pods.name,
                "specdeploy_dev_revision": pods.revision,
                **(scrapes[n] if scrapes else {}),
            },
        }
        for n, exporter in enumerate(exporters)
    ]
    target_file.write_text(json.dumps(groups))
    return pods.selector, target_file


@pytest.fixture
def targets(cluster: ClusterEnv) -> Iterator[tuple[str, Exporter, Exporter, dict[str, float]]]:
    """(label matchers, steady exporter, flaky exporter, event times) with both exporters
    registered in the test bed's Prometheus under a namespace label of their own."""
    events: dict[str, float] = {}
    start = time.time()

    def steady(now: float) -> float:
        return 1000 + RATE * (now - start)

    def restarted(now: float) -> float:
        reset = events.get("reset")
        return 3000 + RATE * (now - start) if reset is None else RATE * (now - reset)

    def born(now: float) -> float | None:
        return BORN_AT if "born" in events else None

    created = {f'{CREATED}{{s="{s}"}}': (lambda now: start) for s in ("old", "reset", "born")}
    # Each series stands for one pod's counter, as vLLM's are labelled `pod` by their scrape.
    first = Exporter(
        {
            f'{METRIC}{{s="old",pod="old"}}': steady,
            f'{METRIC}{{s="reset",pod="reset"}}': restarted,
            f'{METRIC}{{s="born",pod="born"}}': born,
            **created,
        }
    )
    second = Exporter({f'{METRIC}{{s="blip",pod="blip"}}': lambda now: 5000 + RATE * (now - start)})
    selector, target_file = registered(cluster, [first, second])
    try:
        yield selector, first, second, events
    finally:
        target_file.unlink(missing_ok=True)
        first.close()
        second.close()


def samples(client: PrometheusConnect, selector: str, at: float, span: str) -> dict[str, list[Any]]:
    """Prometheus' raw samples of each series `s` over `span` before `at`."""
    found = client.custom_query(f"{METRIC}{selector}[{span}]", params={"time": at})
    return {series["metric"]["s"]: series["values"] for series in found}


def by_series(client: PrometheusConnect, query: str, at: float) -> dict[str, float]:
    found = client.custom_query(query, params={"time": at})
    return {series["metric"].get("s", ""): float(series["value"][1]) for series in found}


def test_a_series_born_inside_the_window_counts_from_zero_and_nothing_else_moves(
    prometheus_url: str, targets: tuple[str, Exporter, Exporter, dict[str, float]]
) -> None:
    selector, _, flaky, events = targets
    client = PrometheusConnect(url=prometheus_url, disable_ssl=True)

    def scraped(names: set[str]) -> bool:
        return names <= set(samples(client, selector, time.time(), "1m"))

    eventually(lambda: scraped({"old", "reset", "blip"}), 60, "the first scrapes of both targets")
    # Every series present for a whole window before anything happens to it.
    time.sleep(WINDOW_S + 8)
    flaky.failing = True
    events["reset"] = time.time()
    events["born"] = time.time()
    eventually(lambda: scraped({"born"}), 30, "the first scrape of the series born at 205")
    time.sleep(5)  # two scrapes of the flaky target fail meanwhile
    flaky.failing = False
    time.sleep(WINDOW_S + 8)  # every window that holds the events is now in Prometheus

    now = time.time()
    raw = samples(client, selector, now, "3m")
    born_first = float(raw["born"][0][0])
    assert float(raw["born"][0][1]) == BORN_AT, "the pod's requests came before its first scrape"
    blip_times = [float(t) for t, _ in raw["blip"]]
    assert max(b - a for a, b in itertools.pairwise(blip_times)) >= 4, (
        "the flaky target missed scrapes"
    )

    helper = window_increase(METRIC, selector, WINDOW, ("s",))
    total = window_increase(METRIC, selector, WINDOW)
    plain = f"sum by (s) (increase({METRIC}{selector}[{WINDOW}]))"
    old_way_missed_it = 0
    checked = 0
    moment = events["born"] - 6
    while moment < now - 1:
        moment += 0.5
        # Skip moments where a sample sits on a window's edge (closed ranges in Prometheus 2).
        edges = (moment - WINDOW_S, moment - 2 * WINDOW_S)
        if any(
            abs(float(t) - e) < 0.05 for values in raw.values() for t, _ in values for e in edges
        ):
            continue
        counted = by_series(client, helper, moment)
        checked += 1
        where = f"at {moment - events['born']:+.1f}s from the events: {counted}"
        # The series born at 205 counts all of it while its first sample is in the window, and
        # only what it grew after (nothing) once that sample has left the window.
        if moment - WINDOW_S < born_first <= moment:
            assert counted.get("born") == pytest.approx(BORN_AT), where
            if by_series(client, plain, moment).get("born", 0.0) == 0.0:
                old_way_missed_it += 1
        elif born_first < moment - WINDOW_S:
            assert counted.get("born") == pytest.approx(0.0), where
        else:
            assert "born" not in counted, where
        # Present before the window: its increase, extrapolated to the window's edges.
        assert 0.7 * RATE * WINDOW_S <= counted["old"] <= 1.3 * RATE * WINDOW_S, where
        # A reset counts from zero after it: never negative, never its value before the reset.
        assert 0 <= counted["reset"] <= 1.3 * RATE * WINDOW_S, where
        # Failed scrapes (staleness markers) never make a long-lived series look new.
        assert 0 <= counted.get("blip", 0.0) <= 1.3 * RATE * WINDOW_S, where
        # Several series add up, and the `_created` series beside them are not summed in.
        assert by_series(client, total, moment)[""] == pytest.approx(sum(counted.values())), where
    assert checked > 2 * WINDOW_S
    # The cause, on the real Prometheus: increase() cannot count a series' first sample.
    assert old_way_missed_it > 0


def test_a_pod_scraped_by_two_jobs_counts_once(cluster: ClusterEnv, prometheus_url: str) -> None:
    # One pod's counter, scraped by a PodMonitor and by an annotations job beside it: two
    # series that differ by their scrape's labels only.
    start = time.time()
    exporter = Exporter({f'{METRIC}{{pod="p1"}}': lambda now: 100 + RATE * (now - start)})
    selector, target_file = registered(
        cluster, [exporter, exporter], [{"endpoint": "monitor"}, {"endpoint": "annotations"}]
    )
    client = PrometheusConnect(url=prometheus_url, disable_ssl=True)
    try:
        eventually(
            lambda: len(client.custom_query(f"{METRIC}{selector}")) == 2,
            60,
            "both scrapes of the pod",
        )
        time.sleep(2 * WINDOW_S + 4)
        once = window_increase(METRIC, selector, WINDOW)
        twice = f"sum(increase({METRIC}{selector}[{WINDOW}]))"
        for moment in (time.time() - 0.7 * n for n in range(4)):
            counted = by_series(client, once, moment)[""]
            assert 0.7 * RATE * WINDOW_S <= counted <= 1.3 * RATE * WINDOW_S, (moment, counted)
            # The plain sum counts the pod twice.
            assert by_series(client, twice, moment)[""] > 1.5 * counted, moment
    finally:
        target_file.unlink(missing_ok=True)
        exporter.close()


STEPS_PER_SECOND = 50.0
STRETCH_S = 6  # three of the test bed's 2 s scrapes
STRETCHED_WINDOW_S = 5 * STRETCH_S
SLOW_S = STRETCH_S  # the time the steps took 30 ms: it touches two of the five stretches at most


def test_the_step_time_of_each_stretch_is_its_sum_over_its_count(cluster: ClusterEnv) -> None:
    start = time.time()
    slow = (start + STRETCHED_WINDOW_S, start + STRETCHED_WINDOW_S + SLOW_S)

    def count(now: float) -> float:
        return STEPS_PER_SECOND * (now - start)

    def total(now: float) -> float:
        slowed = max(0.0, min(now, slow[1]) - slow[0])
        return 0.020 * count(now) + 0.010 * STEPS_PER_SECOND * slowed

    def first_tokens(now: float) -> float:
        return 2.0 * (now - start)

    def generated(now: float) -> float:
        # One token a step, 2.5 in the slow time, and each request's first.
        slowed = max(0.0, min(now, slow[1]) - slow[0])
        return count(now) + 1.5 * STEPS_PER_SECOND * slowed + first_tokens(now)

    exporter = Exporter(
        {
            INTER_TOKEN_LATENCY_COUNT: count,
            INTER_TOKEN_LATENCY_SUM: total,
            GENERATION_TOKENS: generated,
            TIME_TO_FIRST_TOKEN_COUNT: first_tokens,
        }
    )
    selector, target_file = registered(cluster, [exporter])
    try:
        # A whole window before the slow stretch, the slow stretch, and half a window after.
        time.sleep(slow[1] - start + STRETCHED_WINDOW_S / 2)
    finally:
        target_file.unlink(missing_ok=True)
        exporter.close()
    client = PrometheusConnect(url=cluster.prometheus_url, disable_ssl=True)
    raw = {
        name: [(float(t), float(v)) for t, v in values]
        for name, values in (
            (series["metric"]["__name__"], series["values"])
            for series in client.custom_query(
                f'{{__name__=~"{INTER_TOKEN_LATENCY_SUM}|{INTER_TOKEN_LATENCY_COUNT}|'
                f'{GENERATION_TOKENS}|{TIME_TO_FIRST_TOKEN_COUNT}",'
                f"{selector[1:-1]}}}[3m]",
                params={"time": time.time()},
            )
        )
    }
    sums, counts = raw[INTER_TOKEN_LATENCY_SUM], raw[INTER_TOKEN_LATENCY_COUNT]
    tokens, firsts = raw[GENERATION_TOKENS], raw[TIME_TO_FIRST_TOKEN_COUNT]
    for samples in (counts, tokens, firsts):
        assert [t for t, _ in sums] == [t for t, _ in samples], "one scrape, one timestamp"
    # Read 1 s after the last scrape: each stretch's edge sits 1 s from the 2 s scrapes.
    at = sums[-1][0] + 1.0
    window, stretch = f"{STRETCHED_WINDOW_S}s", f"{STRETCH_S}s"

    def read_per_stretch(
        query: str, figure: Callable[[int, int], float], slow_value: float
    ) -> tuple[dict[int, float], list[dict[str, Any]]]:
        """The query's stretches as Prometheus read them, each checked against `figure` of the
        stretch's first and last samples; wholly inside the slow time `slow_value`, wholly
        outside it 20 ms."""
        answer = client.custom_query(query, params={"time": at})
        read = {int(series["metric"]["stretch"]): float(series["value"][1]) for series in answer}
        expected = {}
        for n in range(STRETCHED_WINDOW_S // STRETCH_S):
            end = at - n * STRETCH_S
            inside = [i for i, (t, _) in enumerate(sums) if end - STRETCH_S < t <= end]
            expected[n] = figure(inside[0], inside[-1])
        print(f"read {read}, from the samples {expected}, slow from {slow[0] - at:+.1f} s")
        assert read.keys() == expected.keys()
        for n, value in expected.items():
            assert read[n] == pytest.approx(value, rel=1e-6), n
        for n, value in read.items():
            end = at - n * STRETCH_S
            if slow[0] <= end - STRETCH_S and end <= slow[1]:
                assert value == pytest.approx(slow_value, rel=1e-6), n
            elif end <= slow[0] or end - STRETCH_S >= slow[1]:
                assert value == pytest.approx(0.020, rel=1e-6), n
        return read, answer

    def grew(samples: list[tuple[float, float]], first: int, last: int) -> float:
        return samples[last][1] - samples[first][1]

    # Each stretch's step time: 30 ms wholly inside the slow time, 20 ms wholly outside it; the
    # median of the stretches is the 20 ms the exporter ran at most of the window.
    read, answer = read_per_stretch(
        stretch_step_seconds(selector, window, stretch),
        lambda first, last: grew(sums, first, last) / grew(counts, first, last),
        0.030,
    )
    assert statistics.median(by_stretch(answer)) == pytest.approx(0.020, rel=1e-6)
    # At least half of the slow time falls in one stretch's scrapes (30 ms over 2 of its 4 s).
    assert max(read.values()) >= 0.025 * (1 - 1e-6), "the slow time is seen"
    # Each stretch's time per output token: its sum's growth over its own tokens decoded, 30 ms
    # over 2.5 tokens wholly inside the slow time.
    read_per_stretch(
        stretch_time_per_output_token(selector, window, stretch),
        lambda first, last: (
            grew(sums, first, last) / (grew(tokens, first, last) - grew(firsts, first, last))
        ),
        0.012,
    )
