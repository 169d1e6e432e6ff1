"""Speculative-decoding acceptance per revision, read from Prometheus.

vLLM exports counters of drafts, draft tokens and accepted tokens; the pods' `namespace` and
`specdeploy_dev_revision` labels (from the PodMonitor's podTargetLabels, or the test bed's
process kubelet) select one revision. Acceptance rate = rate(accepted) / rate(draft tokens);
mean acceptance length = 1 + rate(accepted) / rate(drafts).
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
REVISION_LABEL = "specdeploy_dev_revision"


class PrometheusUnavailableError(Exception):
    """Prometheus could not be queried; the message says why."""


@dataclass(frozen=True)
class Acceptance:
    """One revision's speculation over a window; None where there was no traffic."""

    acceptance_rate: float | None
    mean_acceptance_length: float | None
    draft_tokens: float


def _selector(namespace: str, revision: str) -> str:
    def quoted(value: str) -> str:
        return json.dumps(value)

    return f"{{namespace={quoted(namespace)},{REVISION_LABEL}={quoted(revision)}}}"


def acceptance_queries(namespace: str, revision: str, window: str) -> dict[str, str]:
    """The PromQL of each figure, for one revision over `window` (e.g. "5m")."""
    selector = _selector(namespace, revision)

    def rate(metric: str) -> str:
        return f"sum(rate({metric}{selector}[{window}]))"

    return {
        "acceptance_rate": f"{rate(ACCEPTED_TOKENS)} / {rate(DRAFT_TOKENS)}",
        "mean_acceptance_length": f"1 + {rate(ACCEPTED_TOKENS)} / {rate(DRAFTS)}",
        "draft_tokens": f"sum(increase({DRAFT_TOKENS}{selector}[{window}]))",
    }


def _instant(base_url: str, query: str, timeout: float) -> float | None:
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body: dict[str, Any] = json.loads(response.read())
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as error:
        raise PrometheusUnavailableError(f"GET {url} failed: {error}") from error
    if body.get("status") != "success":
        raise PrometheusUnavailableError(f"{query}: {body.get('error', body)}")
    result = (body.get("data") or {}).get("result") or []
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value  # NaN: no drafts in the window


def read_acceptance(
    base_url: str, namespace: str, revision: str, window: str = "5m", timeout: float = 5.0
) -> Acceptance:
    """The revision's acceptance rate, mean acceptance length and draft tokens over `window`."""
    queries = acceptance_queries(namespace, revision, window)
    return Acceptance(
        acceptance_rate=_instant(base_url, queries["acceptance_rate"], timeout),
        mean_acceptance_length=_instant(base_url, queries["mean_acceptance_length"], timeout),
        draft_tokens=_instant(base_url, queries["draft_tokens"], timeout) or 0.0,
    )
