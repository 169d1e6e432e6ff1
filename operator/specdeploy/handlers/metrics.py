"""The operator's own Prometheus metrics, served at `metricsEndpoint` when the config sets it.

What a person watching the operator asks: is it reconciling, how long does a reconcile take,
does it fail, and how many writes does it send (a steady cluster should see none).
"""

from __future__ import annotations

import time
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram, start_http_server

RECONCILES = Counter(
    "specdeploy_reconciles_total",
    "Reconciles of a SpeculativeDeployment, by result (ok, error).",
    ["result"],
)
RECONCILE_SECONDS = Histogram(
    "specdeploy_reconcile_duration_seconds",
    "Wall time of one reconcile.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
API_WRITES = Counter(
    "specdeploy_api_writes_total", "Non-GET requests the operator sent to the Kubernetes API."
)


@contextmanager
def measured_reconcile() -> Iterator[None]:
    """Counts one reconcile and its duration; an exception counts as an error and propagates."""
    began = time.monotonic()
    try:
        yield
    except BaseException:
        RECONCILES.labels(result="error").inc()
        raise
    else:
        RECONCILES.labels(result="ok").inc()
    finally:
        RECONCILE_SECONDS.observe(time.monotonic() - began)


def serve_metrics(
    endpoint: str, start: Callable[[int, str], object] = start_http_server
) -> tuple[str, int]:
    """Serves the metrics in a background thread at the host and port of `endpoint`
    (e.g. `http://0.0.0.0:8081/metrics`; every path answers); returns (host, port)."""
    parsed = urllib.parse.urlsplit(endpoint)
    if parsed.scheme != "http" or parsed.port is None:
        raise ValueError(f"metricsEndpoint {endpoint!r}: expected http://<host>:<port>/<path>")
    host = parsed.hostname or "0.0.0.0"
    start(parsed.port, host)
    return host, parsed.port
