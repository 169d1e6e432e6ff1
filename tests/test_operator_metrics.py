"""The operator's own metrics: reconciles counted by result and timed, writes counted; the
endpoint parsed."""

from __future__ import annotations

import pytest

from fake_kube import FakeKube
from specdeploy.adapters.metrics import OperatorMetrics, parse_metrics_endpoint
from specdeploy.api.config import OperatorConfig
from specdeploy.handlers.reconcile import Reconciler
from test_reconcile import NODES, sd_body


class BrokenKube(FakeKube):
    def list_gpu_nodes(self) -> list[dict[str, object]]:
        raise RuntimeError("API down")


def test_a_reconcile_is_counted_by_result_and_timed() -> None:
    metrics = OperatorMetrics()
    kube = FakeKube(NODES)
    kube.objects[("SpeculativeDeployment", "ns", "chat")] = sd_body()
    Reconciler(kube, OperatorConfig(), lambda *_: None, metrics=metrics).reconcile(  # type: ignore[arg-type]
        "ns", "chat"
    )
    broken = BrokenKube(NODES)
    broken.objects[("SpeculativeDeployment", "ns", "chat")] = sd_body()
    reconciler = Reconciler(broken, OperatorConfig(), lambda *_: None, metrics=metrics)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="API down"):
        reconciler.reconcile("ns", "chat")
    value = metrics.registry.get_sample_value
    assert value("specdeploy_reconciles_total", {"result": "ok"}) == 1
    assert value("specdeploy_reconciles_total", {"result": "error"}) == 1
    assert value("specdeploy_reconcile_duration_seconds_count") == 2


def test_metrics_are_served_at_the_endpoints_host_and_port() -> None:
    assert parse_metrics_endpoint("http://127.0.0.1:9102/metrics") == ("127.0.0.1", 9102)


@pytest.mark.parametrize("endpoint", ["https://0.0.0.0:8081/metrics", "http://0.0.0.0/metrics"])
def test_an_endpoint_without_http_and_port_is_refused(endpoint: str) -> None:
    with pytest.raises(ValueError, match="metricsEndpoint"):
        parse_metrics_endpoint(endpoint)
