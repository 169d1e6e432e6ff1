"""The operator's own metrics: reconciles counted by result and timed; the endpoint parsed."""

from __future__ import annotations

import pytest

from specdeploy.handlers.metrics import (
    RECONCILE_SECONDS,
    RECONCILES,
    measured_reconcile,
    serve_metrics,
)


def _count(result: str) -> float:
    for metric in RECONCILES.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total") and sample.labels == {"result": result}:
                return float(sample.value)
    return 0.0


def _observations() -> float:
    for metric in RECONCILE_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count"):
                return float(sample.value)
    return 0.0


def test_a_reconcile_is_counted_by_result_and_timed() -> None:
    ok, error, timed = _count("ok"), _count("error"), _observations()
    with measured_reconcile():
        pass
    with pytest.raises(RuntimeError), measured_reconcile():
        raise RuntimeError("API down")
    assert (_count("ok"), _count("error")) == (ok + 1, error + 1)
    assert _observations() == timed + 2


def test_metrics_are_served_at_the_endpoints_host_and_port() -> None:
    started: list[tuple[int, str]] = []
    assert serve_metrics(
        "http://127.0.0.1:9102/metrics", lambda port, host: started.append((port, host))
    ) == ("127.0.0.1", 9102)
    assert started == [(9102, "127.0.0.1")]


@pytest.mark.parametrize("endpoint", ["https://0.0.0.0:8081/metrics", "http://0.0.0.0/metrics"])
def test_an_endpoint_without_http_and_port_is_refused(endpoint: str) -> None:
    with pytest.raises(ValueError, match="metricsEndpoint"):
        serve_metrics(endpoint, lambda port, host: None)
