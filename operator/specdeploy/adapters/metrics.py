"""The operator's own metrics (prometheus_client), served at `metricsEndpoint` when set.

What a person watching the operator asks: is it reconciling, how long does a reconcile take, does
it fail, how many writes does it send (a steady cluster should see none), and what do its canary
analyses decide.

| metric | type | labels |
|---|---|---|
| `specdeploy_reconciles_total` | counter | `result` (ok, error) |
| `specdeploy_reconcile_duration_seconds` | histogram | |
| `specdeploy_api_writes_total` | counter | |
| `specdeploy_events_dropped_total` | counter | |
| `specdeploy_analysis_verdicts_total` | counter | `result` (Pass, Fail, Inconclusive) |
| `specdeploy_canary_promotions_total` | counter | |
| `specdeploy_canary_rollbacks_total` | counter | |
| `specdeploy_acceptance_rate` | gauge | `namespace`, `name`: the serving revision's |
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from specdeploy.api.conditions import Reason
from specdeploy.plan.rollout.revisions import RolloutEvent

VERDICT_RESULTS = {
    Reason.ANALYSIS_PASSED: "Pass",
    Reason.ANALYSIS_FAILED: "Fail",
    Reason.ANALYSIS_INCONCLUSIVE: "Inconclusive",
    Reason.METRICS_UNAVAILABLE: "Error",
}


class OperatorMetrics:
    """The metrics of one operator process, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter(
            "specdeploy_reconciles",
            "Reconciles of a SpeculativeDeployment, by result (ok, error).",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "specdeploy_reconcile_duration_seconds",
            "Wall time of one reconcile.",
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.api_writes = Counter(
            "specdeploy_api_writes",
            "Non-GET requests the operator sent to the Kubernetes API.",
            registry=self.registry,
        )
        self.events_dropped = Counter(
            "specdeploy_events_dropped",
            "Kubernetes Events dropped unposted: too many were waiting (Events are best effort).",
            registry=self.registry,
        )
        self.verdicts = Counter(
            "specdeploy_analysis_verdicts",
            "Canary analysis verdicts counted, by result.",
            ["result"],
            registry=self.registry,
        )
        self.promotions = Counter(
            "specdeploy_canary_promotions",
            "Canaries promoted by their analysis.",
            registry=self.registry,
        )
        self.rollbacks = Counter(
            "specdeploy_canary_rollbacks",
            "Canaries rolled back by their analysis.",
            registry=self.registry,
        )
        self.acceptance = Gauge(
            "specdeploy_acceptance_rate",
            "Acceptance rate of the serving revision, as last written to status.",
            ["namespace", "name"],
            registry=self.registry,
        )

    def count_events(self, events: Iterable[RolloutEvent]) -> None:
        """Counts the rollout decisions a reconcile posted as Events."""
        for event in events:
            if event.reason in VERDICT_RESULTS:
                self.verdicts.labels(VERDICT_RESULTS[event.reason]).inc()
            elif event.reason == Reason.CANARY_PROMOTED:
                self.promotions.inc()
            elif event.reason == Reason.ROLLED_BACK:
                self.rollbacks.inc()

    def set_acceptance(self, namespace: str, name: str, rate: float | None) -> None:
        """The serving revision's acceptance rate; none (no series) when not measured."""
        if rate is not None:
            self.acceptance.labels(namespace, name).set(rate)
            return
        with contextlib.suppress(KeyError):
            self.acceptance.remove(namespace, name)

    def serve(self, endpoint: str) -> tuple[str, int]:
        """Serves the metrics in a background thread at the host and port of `endpoint`
        (e.g. `http://0.0.0.0:8081/metrics`; every path answers); returns (host, port)."""
        host, port = parse_metrics_endpoint(endpoint)
        start_http_server(port, addr=host, registry=self.registry)
        return host, port


def parse_metrics_endpoint(endpoint: str) -> tuple[str, int]:
    """(host, port) of `metricsEndpoint`; a ValueError naming it when it is not http with a port."""
    parsed = urllib.parse.urlsplit(endpoint)
    if parsed.scheme != "http" or parsed.port is None:
        raise ValueError(f"metricsEndpoint {endpoint!r}: expected http://<host>:<port>/<path>")
    return parsed.hostname or "0.0.0.0", parsed.port
