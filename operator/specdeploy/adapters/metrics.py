"""The operator's own metrics (prometheus_client), served on `metricsAddress` when set.

| metric | type | labels |
|---|---|---|
| `specdeploy_reconcile_duration_seconds` | histogram | |
| `specdeploy_reconcile_errors_total` | counter | |
| `specdeploy_analysis_verdicts_total` | counter | `result` (Pass, Fail, Inconclusive) |
| `specdeploy_canary_promotions_total` | counter | |
| `specdeploy_canary_rollbacks_total` | counter | |
| `specdeploy_acceptance_rate` | gauge | `namespace`, `name`: the serving revision's |
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from specdeploy.api.conditions import Reason
from specdeploy.plan.rollout import RolloutEvent

VERDICT_RESULTS = {
    Reason.ANALYSIS_PASSED: "Pass",
    Reason.ANALYSIS_FAILED: "Fail",
    Reason.ANALYSIS_INCONCLUSIVE: "Inconclusive",
}


class OperatorMetrics:
    """The metrics of one operator process, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconcile_seconds = Histogram(
            "specdeploy_reconcile_duration_seconds",
            "Time one reconcile of a SpeculativeDeployment took.",
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "specdeploy_reconcile_errors",
            "Reconciles that ended with an error (retried).",
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

    def serve(self, address: str) -> int:
        """Serves /metrics on `address` (host:port; port 0 picks one); returns the port."""
        host, _, port = address.rpartition(":")
        server, _ = start_http_server(int(port), addr=host or "0.0.0.0", registry=self.registry)
        return int(server.server_port)
