"""What Prometheus measured of one revision's pods, through prometheus-api-client.

vLLM exports counters of drafts, draft tokens and accepted tokens and histograms of inter-token
latency and time to first token; the pods' `namespace`, `specdeploy_dev_name` and
`specdeploy_dev_revision` labels (from the PodMonitor's podTargetLabels, or scrape annotations)
select one SD's revision: two SDs of the same pair in one namespace share a revision hash, and
never each other's figures. A pod scraped twice (a PodMonitor and an annotations job beside it)
counts once: each series is taken per pod (`max by (pod, ...)`) before the pods are summed.
Every query of one reading is evaluated at one instant (`at`), so a scrape landing between two
queries cannot skew a ratio of them, and the canary and the stable are read at the same moment.
Acceptance rate = accepted tokens / draft tokens; mean acceptance length = 1 + accepted tokens /
drafts, each counted over the window by `window_increase`.

Every counter-based figure (the counters above, and a histogram's buckets, sum and count) is
counted by `window_increase`, which counts a series Prometheus first saw inside the window from
zero: a pod that served requests before its first scrape has them counted, where `increase()`
and `rate()` alone cannot count a series' first sample.

Metrics are selected by exact name: each vLLM counter also exports a `<name>_created` series,
which a regular expression over names would sum in.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.exceptions import RequestException
from urllib3.util.retry import Retry

from specdeploy.api.contract import PROBE_GAUGES, PROBE_METRIC_PREFIX, PROBE_PER_POSITION_GAUGE
from specdeploy.plan.rollout.analysis import (
    MAX_STRETCHES,
    Measurement,
    acceptance_by_position,
    duration_seconds,
    running_batch,
)
from specdeploy.plan.rollout.autotune import AutotuneMeasurement
from specdeploy.plan.rollout.probe import ProbeResult

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds_bucket"
INTER_TOKEN_LATENCY_SUM = "vllm:inter_token_latency_seconds_sum"
INTER_TOKEN_LATENCY_COUNT = "vllm:inter_token_latency_seconds_count"
# One series per draft position (label `position`, "0" to k-1), as many as the pods' k.
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
RUNNING = "vllm:num_requests_running"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds_bucket"
TIME_TO_FIRST_TOKEN_SUM = "vllm:time_to_first_token_seconds_sum"
TIME_TO_FIRST_TOKEN_COUNT = "vllm:time_to_first_token_seconds_count"
GENERATION_TOKENS = "vllm:generation_tokens_total"
# vLLM's engine steps: the count of its iteration_tokens_total histogram (one observation a step).
ENGINE_STEPS = "vllm:iteration_tokens_total_count"
# Finished requests, by label finished_reason (stop, length, abort, error, repetition).
REQUEST_SUCCESS = "vllm:request_success_total"
# Every response of vLLM's API server (prometheus-fastapi-instrumentator, as vLLM 0.32 mounts
# it), by handler, method and status grouped ("2xx", "4xx", "5xx"); /metrics, /health and the
# other probes' handlers are left out by vLLM. It sees what never reaches the engine: a chat
# template or a tool parser that raises, a validation error, an overload.
HTTP_REQUESTS = "http_requests_total"
REVISION_LABEL = "specdeploy_dev_revision"
NAME_LABEL = "specdeploy_dev_name"
#: The labels that tell one pod's series of a metric apart, kept when a pod's doubles (one per
#: scrape job) are folded into one: vLLM's engine index, a finished request's reason, a draft
#: position, a histogram bucket, an HTTP response's handler, method and status. The scrape's own
#: labels (job, instance, endpoint) are dropped.
_SERIES_KEYS = (
    "pod",
    "engine",
    "finished_reason",
    "position",
    "le",
    "handler",
    "method",
    "status",
)
DEFAULT_TIMEOUT_SECONDS = 5


log = logging.getLogger("specdeploy.prometheus")


class PrometheusUnavailableError(Exception):
    """Prometheus could not be queried; the message says why."""


# A metric's exact name, as the exposition format spells it: no regular expression, no selector.
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class RevisionPods:
    """The pods of one revision of one SD, as Prometheus' labels select them."""

    namespace: str
    name: str
    revision: str

    @property
    def selector(self) -> str:
        """The label matchers, as `{namespace="...",specdeploy_dev_name="...",
        specdeploy_dev_revision="..."}`, to put after a metric's name."""
        return (
            f"{{namespace={json.dumps(self.namespace)},{NAME_LABEL}={json.dumps(self.name)},"
            f"{REVISION_LABEL}={json.dumps(self.revision)}}}"
        )


def window_increase(
    metric: str, selector: str, window: str, by: Sequence[str] = (), ago: int = 0
) -> str:
    """The PromQL of how much the counter `metric` grew over the last `window` (a PromQL
    duration such as "5m"), summed over the series `selector` picks, one sum per value of the
    labels `by` (e.g. `("le",)` for a histogram's buckets); with `ago` (seconds), over the
    `window` that ended that long ago.

    Each series counts in one of two ways, decided by whether Prometheus holds a sample of it in
    the window before this one (`present_over_time(...[window] offset window)`):
    - seen before the window: `increase()` over the window, so a counter reset (a restarted
      container) counts from zero after it, never negative;
    - first seen inside the window: its last value in the window, all of it, since the counter
      started from zero inside the window (a new pod); `increase()` alone would miss every
      request the pod served before its first scrape.
    The series of one pod that differ only by their scrape's labels (a pod scraped by two jobs)
    count once (`max by` the pod and the labels of `_SERIES_KEYS`). A series that was present
    before the window but has fewer than two samples in it counts nothing, and a failed scrape's
    staleness marker does not make a series look new (range selectors skip it). Used for ratios
    (acceptance rate), counts (draft tokens), histogram quantiles (`histogram_quantile(0.5,
    window_increase(bucket, ..., by=("le",)))`) and means (sum over count); the answer is empty
    when no series matches.

    `metric` must be an exact metric name: a regular expression over names would sum in the
    `<name>_created` series vLLM exports beside each counter.
    """
    if not _METRIC_NAME.fullmatch(metric):
        raise ValueError(f"not a metric name: {metric!r}")
    shift = f" offset {ago}s" if ago else ""
    before = f"{round(duration_seconds(window)) + ago}s" if ago else window
    series = f"{metric}{selector}[{window}]{shift}"
    seen_before = f"present_over_time({metric}{selector}[{window}] offset {before})"
    grouping = f" by ({', '.join(by)})" if by else ""
    per_series = ", ".join(dict.fromkeys((*_SERIES_KEYS, *by)))
    return (
        f"sum{grouping} (max by ({per_series}) ((increase({series}) and {seen_before}) or "
        f"(last_over_time({series}) unless {seen_before})))"
    )


def _mean_step_seconds(selector: str, window: str, ago: int = 0) -> str:
    """The mean decode step time: the inter-token latency's sum over its count (vLLM observes
    it once per decode step of each sequence), over the `window` that ended `ago` seconds
    ago. The autotuner's step costs read it over the window, the canary's verdicts over each
    stretch of it (`stretch_step_seconds`)."""
    return (
        f"{window_increase(INTER_TOKEN_LATENCY_SUM, selector, window, ago=ago)} / "
        f"{window_increase(INTER_TOKEN_LATENCY_COUNT, selector, window, ago=ago)}"
    )


def _time_per_output_token(selector: str, window: str, ago: int = 0) -> str:
    """The decode time per decoded token over the `window` that ended `ago` seconds ago: the
    inter-token latency's sum (every sequence's decode time) over the tokens decoded after each
    request's first (generation tokens less first tokens); no sample where none was decoded."""
    decoded = (
        f"({window_increase(GENERATION_TOKENS, selector, window, ago=ago)} - "
        f"{window_increase(TIME_TO_FIRST_TOKEN_COUNT, selector, window, ago=ago)}) > 0"
    )
    return f"{window_increase(INTER_TOKEN_LATENCY_SUM, selector, window, ago=ago)} / ({decoded})"


def _per_stretch(
    figure: Callable[[str, str, int], str], selector: str, window: str, stretch: str
) -> str:
    """`figure` over each stretch of `window`: the window cut, from now back, into stretches of
    `stretch` (the analysis interval), at most MAX_STRETCHES (longer ones when it would hold
    more). One query: a vector of one sample per stretch that held the figure, labelled
    `stretch` ("0" the newest)."""
    whole = round(duration_seconds(window))
    count = max(1, min(MAX_STRETCHES, whole // max(1, round(duration_seconds(stretch)))))
    each = whole // count
    return " or ".join(
        f'label_replace({figure(selector, f"{each}s", n * each)}, "stretch", "{n}", "", "")'
        for n in range(count)
    )


def stretch_step_seconds(selector: str, window: str, stretch: str) -> str:
    """The mean decode step time of each stretch of `window` (`_per_stretch`): each the
    inter-token latency's sum over its count in that stretch."""
    return _per_stretch(_mean_step_seconds, selector, window, stretch)


def stretch_time_per_output_token(selector: str, window: str, stretch: str) -> str:
    """The time per output token of each stretch of `window` (`_per_stretch`): each the
    stretch's inter-token latency sum over the tokens it decoded, so a stretch's step time is
    divided by its own tokens per step, never by another stretch's."""
    return _per_stretch(_time_per_output_token, selector, window, stretch)


def measurement_queries(
    pods: RevisionPods, window: str, stretch: str | None = None
) -> dict[str, str]:
    """The PromQL of each figure, for one revision over `window` (e.g. "5m"): counters and
    histograms' sums and counts, never a quantile (plan.rollout.analysis says why); with
    `stretch` (the analysis interval), the step time of each stretch of the window too."""
    selector = pods.selector
    failed = selector[:-1] + ',finished_reason=~"error|abort"}'
    server_errors = selector[:-1] + ',status="5xx"}'

    def counted(metric: str, matchers: str = selector) -> str:
        return window_increase(metric, matchers, window)

    stretches = (
        {
            "stretch_step_seconds": stretch_step_seconds(selector, window, stretch),
            "stretch_time_per_output_token": stretch_time_per_output_token(
                selector, window, stretch
            ),
        }
        if stretch is not None
        else {}
    )
    return {
        **stretches,
        "acceptance_rate": f"{counted(ACCEPTED_TOKENS)} / {counted(DRAFT_TOKENS)}",
        "mean_acceptance_length": f"1 + {counted(ACCEPTED_TOKENS)} / {counted(DRAFTS)}",
        "draft_tokens": counted(DRAFT_TOKENS),
        "drafts": counted(DRAFTS),
        "accepted_per_position": window_increase(
            ACCEPTED_PER_POSITION, selector, window, ("position",)
        ),
        "step_seconds_sum": counted(INTER_TOKEN_LATENCY_SUM),
        "steps": counted(INTER_TOKEN_LATENCY_COUNT),
        "output_tokens": counted(GENERATION_TOKENS),
        "first_token_seconds_sum": counted(TIME_TO_FIRST_TOKEN_SUM),
        "first_tokens": counted(TIME_TO_FIRST_TOKEN_COUNT),
        "engine_steps": counted(ENGINE_STEPS),
        "finished": counted(REQUEST_SUCCESS),
        "failed": counted(REQUEST_SUCCESS, failed),
        "responses": counted(HTTP_REQUESTS),
        "server_errors": counted(HTTP_REQUESTS, server_errors),
    }


def probe_queries(pods: RevisionPods) -> dict[str, str]:
    """The PromQL of a revision's probe figures (engine/probe.py exports them as gauges, constant
    for a pod's life): each summed over the pods that report one, by prompt set. A pod scraped
    twice (by a PodMonitor and by annotations) counts once."""
    selector = pods.selector

    def summed(suffix: str, by: tuple[str, ...] = ()) -> str:
        name = PROBE_METRIC_PREFIX + suffix
        keys = ", ".join(("prompt_set", *by))
        return f"sum by ({keys}) (max by (pod, {keys}) ({name}{selector}))"

    queries = {suffix: summed(suffix) for suffix in PROBE_GAUGES}
    queries["pods"] = (
        f"count by (prompt_set) (max by (pod, prompt_set) ({PROBE_METRIC_PREFIX}prompts{selector}))"
    )
    queries["prompts"] = f"max by (prompt_set) ({PROBE_METRIC_PREFIX}prompts{selector})"
    queries[PROBE_PER_POSITION_GAUGE] = summed(PROBE_PER_POSITION_GAUGE, ("position",))
    return queries


def autotune_queries(pods: RevisionPods, window: str) -> dict[str, str]:
    """The PromQL of the autotuner's inputs, for one revision over `window`.

    All but `accepted_per_position` (a vector by position) are single numbers. The step time is
    the mean inter-token latency (sum over count), which vLLM observes once per decode step of
    each sequence. The mean batch is counted, as the canary's is (`running_batch`: sequence
    steps over engine steps); only the largest batch comes from the running-requests gauge, as
    the scrapes saw it, since no counter holds a maximum.
    """
    selector = pods.selector

    def counted(metric: str) -> str:
        return window_increase(metric, selector, window)

    return {
        "drafts": counted(DRAFTS),
        "draft_tokens": counted(DRAFT_TOKENS),
        "accepted_per_position": window_increase(
            ACCEPTED_PER_POSITION, selector, window, ("position",)
        ),
        "step_seconds": _mean_step_seconds(selector, window),
        "decode_steps": counted(INTER_TOKEN_LATENCY_COUNT),
        "first_tokens": counted(TIME_TO_FIRST_TOKEN_COUNT),
        "engine_steps": counted(ENGINE_STEPS),
        "scraped_max_batch_size": f"max(max_over_time({RUNNING}{selector}[{window}]))",
    }


def _label(series: dict[str, Any], name: str) -> str:
    return str(series.get("metric", {}).get(name, ""))


def accepted_by_position(result: list[dict[str, Any]]) -> tuple[float, ...]:
    """The per-position vector of a `sum by (position)` answer, position 0 first; positions
    missing in between (no sample in the window) count 0."""
    found: dict[int, float] = {}
    for series in result:
        position = series.get("metric", {}).get("position")
        value = float(series["value"][1])
        if position is not None and str(position).isdigit() and not math.isnan(value):
            found[int(position)] = value
    if not found:
        return ()
    return tuple(found.get(i, 0.0) for i in range(max(found) + 1))


#: The queries of one figure per stretch of the window (measurement_queries with a stretch).
STRETCH_QUERIES = ("stretch_step_seconds", "stretch_time_per_output_token")


def by_stretch(result: list[dict[str, Any]]) -> tuple[float, ...]:
    """The stretches' step times of a `stretch_step_seconds` answer, newest first; a stretch
    without steps (NaN) is left out."""
    found = sorted((int(_label(s, "stretch")), float(s["value"][1])) for s in result)
    return tuple(value for _, value in found if not math.isnan(value))


def _cause(error: Exception) -> str:
    """Why a query failed, in one short line: for a request that got no answer, urllib3's
    reason (a timeout, a refused connection) without the URL that requests puts around it."""
    if isinstance(error, RequestException) and error.args:
        return str(getattr(error.args[0], "reason", None) or error)
    return str(error)


def _pods_by_prompt_set(series: list[dict[str, Any]]) -> dict[str, float]:
    """The probe's pod counts (its `pods` query) by prompt set."""
    return {_label(s, "prompt_set"): float(s["value"][1]) for s in series}


class PrometheusReader:
    """Reads measurements from one Prometheus; one attempt per query, short timeouts."""

    def __init__(self, url: str, timeout: int = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.url = url
        self.timeout = timeout
        self.client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout
        )
        #: Why the stretches' query failed, each cause logged once as a warning.
        self._stretches_failed: set[str] = set()

    def _vector(self, query: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"time": f"{at:.3f}"} if at is not None else None
        try:
            result: list[dict[str, Any]] = self.client.custom_query(query, params=params)
        except (PrometheusApiClientException, RequestException, ValueError) as error:
            # The message lands in status and Events: the cause, not the (long) query.
            log.debug("query failed: %s: %s", query, error)
            raise PrometheusUnavailableError(f"{self.url}: {_cause(error)}") from error
        return result

    def _instant(self, query: str, at: float | None = None) -> float | None:
        result = self._vector(query, at)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value  # NaN: nothing in the window

    def measure(
        self,
        pods: RevisionPods,
        window: str,
        stretch: str | None = None,
        at: float | None = None,
    ) -> Measurement:
        """The revision's figures over the `window` that ends at `at` (seconds since the epoch;
        None: Prometheus' now), every query evaluated there, with the step time of each of its
        stretches when `stretch` is given; a failed query is a Measurement with `error`. When
        only the stretches' query fails (its URL is several KiB long, which a proxy in front of
        Prometheus may refuse), the figures come without stretches, so the window's mean step
        time is judged, and the cause is logged."""
        queries = measurement_queries(pods, window, stretch)
        split = {name: queries.pop(name) for name in STRETCH_QUERIES if name in queries}
        try:
            accepted = accepted_by_position(self._vector(queries.pop("accepted_per_position"), at))
            found = {name: self._instant(query, at) for name, query in queries.items()}
        except PrometheusUnavailableError as error:
            return Measurement(error=str(error))
        stretches = {name: self._stretches(query, at) for name, query in split.items()}
        return Measurement(
            acceptance_rate=found["acceptance_rate"],
            mean_acceptance_length=found["mean_acceptance_length"],
            draft_tokens=found["draft_tokens"] or 0.0,
            acceptance_per_position=acceptance_by_position(accepted, found["drafts"]),
            step_seconds_sum=found["step_seconds_sum"],
            steps=found["steps"],
            stretch_step_seconds=stretches.get("stretch_step_seconds", ()),
            stretch_time_per_output_token=stretches.get("stretch_time_per_output_token", ()),
            output_tokens=found["output_tokens"],
            first_token_seconds_sum=found["first_token_seconds_sum"],
            first_tokens=found["first_tokens"],
            engine_steps=found["engine_steps"],
            finished=found["finished"],
            # No error or abort series in the window: none failed.
            failed=found["failed"] or (0.0 if found["finished"] is not None else None),
            responses=found["responses"],
            # No 5xx series in the window: none answered 5xx.
            server_errors=found["server_errors"]
            or (0.0 if found["responses"] is not None else None),
        )

    def _stretches(self, query: str, at: float | None) -> tuple[float, ...]:
        """One figure per stretch of the window, newest first; none when Prometheus refused
        the query (its URL is several KiB long: a proxy may refuse it), logged once per cause:
        the window's own figure is then judged."""
        try:
            return by_stretch(self._vector(query, at))
        except PrometheusUnavailableError as error:
            said = str(error) not in self._stretches_failed
            self._stretches_failed.add(str(error))
            (log.warning if said else log.debug)(
                "the figures per stretch of the window were not read (%s): the window's own "
                "step time and time per output token are judged",
                error,
            )
            return ()

    def measure_probe(self, pods: RevisionPods) -> ProbeResult | None:
        """What the revision's pods measured on the probe (None: no pod reports one yet); a
        failed query is a ProbeResult with `error`. When its pods ran different prompt sets
        (the ConfigMap changed between their starts), the set most pods ran.

        One query per figure, and a scrape can land between two of them: a pod's gauges all
        appear in one scrape and stay, so the pods reporting are counted first and again last,
        and a reading whose counts differ is no reading yet (None), never one that sums some
        figures with the pod and some without (its probe read as incomplete)."""
        queries = probe_queries(pods)
        pods_query = queries.pop("pods")
        try:
            first = self._vector(pods_query)
            per_position = self._vector(queries.pop(PROBE_PER_POSITION_GAUGE))
            found = {name: self._vector(query) for name, query in queries.items()}
            last = self._vector(pods_query)
        except PrometheusUnavailableError as error:
            return ProbeResult(prompt_set="", error=str(error))
        reporting = _pods_by_prompt_set(first)
        if not reporting or reporting != _pods_by_prompt_set(last):
            return None
        chosen = max(reporting, key=lambda key: (reporting[key], key))

        def value(name: str) -> float:
            for series in found[name]:
                if _label(series, "prompt_set") == chosen:
                    number = float(series["value"][1])
                    return 0.0 if math.isnan(number) else number
            return 0.0

        positions = accepted_by_position(
            [s for s in per_position if _label(s, "prompt_set") == chosen]
        )
        return ProbeResult(
            prompt_set=chosen,
            pods=int(reporting[chosen]),
            complete_pods=int(value("complete")),
            prompts=int(value("prompts")),
            requests=value("requests"),
            errors=value("errors"),
            output_tokens=value("output_tokens"),
            drafts=value("drafts"),
            draft_tokens=value("draft_tokens"),
            accepted_tokens=value("accepted_tokens"),
            accepted_per_position=positions,
            decode_seconds=value("decode_seconds"),
            decode_steps=value("decode_steps"),
            first_token_seconds=value("first_token_seconds"),
            first_tokens=value("first_tokens"),
        )

    def measure_autotune(
        self, pods: RevisionPods, window: str, at: float | None = None
    ) -> AutotuneMeasurement:
        """The autotuner's inputs for the revision over `window`; a failed query is an
        AutotuneMeasurement with `error`."""
        queries = autotune_queries(pods, window)
        try:
            per_position = accepted_by_position(
                self._vector(queries.pop("accepted_per_position"), at)
            )
            found = {name: self._instant(query, at) for name, query in queries.items()}
        except PrometheusUnavailableError as error:
            return AutotuneMeasurement(error=str(error))
        mean = running_batch(found["decode_steps"], found["first_tokens"], found["engine_steps"])
        scraped = found["scraped_max_batch_size"]
        # A scrape can fall between batches that lasted less than its interval (a gauge read 0
        # while the counters show every step ran at least one sequence): the mean bounds it.
        largest = max((v for v in (scraped, mean) if v is not None), default=None)
        return AutotuneMeasurement(
            drafts=found["drafts"] or 0.0,
            draft_tokens=found["draft_tokens"] or 0.0,
            accepted_per_position=per_position,
            step_seconds=found["step_seconds"],
            mean_batch_size=mean,
            max_batch_size=largest,
        )
