"""What Prometheus measured of one revision's pods, through prometheus-api-client.

vLLM exports counters of drafts, draft tokens and accepted tokens and histograms of inter-token
latency and time to first token; the pods' `namespace` and `specdeploy_dev_revision` labels (from
the PodMonitor's podTargetLabels, or scrape annotations) select one revision. Acceptance rate =
rate(accepted) / rate(draft tokens); mean acceptance length = 1 + rate(accepted) / rate(drafts).

Metrics are selected by exact name: each vLLM counter also exports a `<name>_created` series,
which a regular expression over names would sum in.
"""

from __future__ import annotations

import json
import math
from typing import Any

from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests.exceptions import RequestException
from urllib3.util.retry import Retry

from specdeploy.plan.rollout.analysis import Measurement
from specdeploy.plan.rollout.autotune import AutotuneMeasurement

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
REVISION_LABEL = "specdeploy_dev_revision"
DEFAULT_TIMEOUT_SECONDS = 5


class PrometheusUnavailableError(Exception):
    """Prometheus could not be queried; the message says why."""


def _selector(namespace: str, revision: str) -> str:
    return f"{{namespace={json.dumps(namespace)},{REVISION_LABEL}={json.dumps(revision)}}}"


def _mean_step_seconds(selector: str, window: str) -> str:
    """The mean decode step time: the inter-token latency's sum over its count (vLLM observes
    it once per decode step of each sequence). The canary's throughput verdict and the
    autotuner's step costs both read this figure."""
    return (
        f"sum(increase({INTER_TOKEN_LATENCY_SUM}{selector}[{window}])) / "
        f"sum(increase({INTER_TOKEN_LATENCY_COUNT}{selector}[{window}]))"
    )


def measurement_queries(namespace: str, revision: str, window: str) -> dict[str, str]:
    """The PromQL of each figure, for one revision over `window` (e.g. "5m")."""
    selector = _selector(namespace, revision)

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{selector}[{window}]))"

    def median(histogram: str) -> str:
        return f"histogram_quantile(0.5, sum by (le) (rate({histogram}{selector}[{window}])))"

    return {
        "acceptance_rate": f"{rate(ACCEPTED_TOKENS)} / {rate(DRAFT_TOKENS)}",
        "mean_acceptance_length": f"1 + {rate(ACCEPTED_TOKENS)} / {rate(DRAFTS)}",
        "draft_tokens": f"sum(increase({DRAFT_TOKENS}{selector}[{window}]))",
        "inter_token_latency_p50": median(INTER_TOKEN_LATENCY),
        "step_seconds": _mean_step_seconds(selector, window),
        "time_to_first_token_p50": median(TIME_TO_FIRST_TOKEN),
    }


def autotune_queries(namespace: str, revision: str, window: str) -> dict[str, str]:
    """The PromQL of the autotuner's inputs, for one revision over `window`.

    All but `accepted_per_position` (a vector by position) are single numbers. The step time is
    the mean inter-token latency (sum over count), which vLLM observes once per decode step of
    each sequence; the batch sizes are the running sequences per pod, averaged over the pods.
    """
    selector = _selector(namespace, revision)

    def increase(metric: str) -> str:
        return f"sum(increase({metric}{selector}[{window}]))"

    return {
        "drafts": increase(DRAFTS),
        "draft_tokens": increase(DRAFT_TOKENS),
        "accepted_per_position": (
            f"sum by (position) (increase({ACCEPTED_PER_POSITION}{selector}[{window}]))"
        ),
        "step_seconds": _mean_step_seconds(selector, window),
        "mean_batch_size": f"avg(avg_over_time({RUNNING}{selector}[{window}]))",
        "max_batch_size": f"max(max_over_time({RUNNING}{selector}[{window}]))",
    }


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


class PrometheusReader:
    """Reads measurements from one Prometheus; one attempt per query, short timeouts."""

    def __init__(self, url: str, timeout: int = DEFAULT_TIMEOUT_SECONDS) -> None:
        self.url = url
        self.timeout = timeout
        self.client = PrometheusConnect(
            url=url, disable_ssl=True, retry=Retry(total=0), timeout=timeout
        )

    def _vector(self, query: str) -> list[dict[str, Any]]:
        try:
            result: list[dict[str, Any]] = self.client.custom_query(query)
        except (PrometheusApiClientException, RequestException, ValueError) as error:
            raise PrometheusUnavailableError(f"{self.url}: {query}: {error}") from error
        return result

    def _instant(self, query: str) -> float | None:
        result = self._vector(query)
        if not result:
            return None
        value = float(result[0]["value"][1])
        return None if math.isnan(value) else value  # NaN: nothing in the window

    def measure(self, namespace: str, revision: str, window: str) -> Measurement:
        """The revision's figures over `window`; a failed query is a Measurement with `error`."""
        queries = measurement_queries(namespace, revision, window)
        try:
            found = {name: self._instant(query) for name, query in queries.items()}
        except PrometheusUnavailableError as error:
            return Measurement(error=str(error))
        return Measurement(
            acceptance_rate=found["acceptance_rate"],
            mean_acceptance_length=found["mean_acceptance_length"],
            draft_tokens=found["draft_tokens"] or 0.0,
            inter_token_latency_p50=found["inter_token_latency_p50"],
            step_seconds=found["step_seconds"],
            time_to_first_token_p50=found["time_to_first_token_p50"],
        )

    def measure_autotune(self, namespace: str, revision: str, window: str) -> AutotuneMeasurement:
        """The autotuner's inputs for the revision over `window`; a failed query is an
        AutotuneMeasurement with `error`."""
        queries = autotune_queries(namespace, revision, window)
        try:
            per_position = accepted_by_position(self._vector(queries.pop("accepted_per_position")))
            found = {name: self._instant(query) for name, query in queries.items()}
        except PrometheusUnavailableError as error:
            return AutotuneMeasurement(error=str(error))
        return AutotuneMeasurement(
            drafts=found["drafts"] or 0.0,
            draft_tokens=found["draft_tokens"] or 0.0,
            accepted_per_position=per_position,
            step_seconds=found["step_seconds"],
            mean_batch_size=found["mean_batch_size"],
            max_batch_size=found["max_batch_size"],
        )
