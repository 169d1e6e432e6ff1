"""The chart's Grafana dashboard: the operator metrics it reads exist, its queries are complete,
and the chart ships it when asked. Its PromQL is parsed by a real Prometheus and its vLLM
metric names are looked up in a real engine's /metrics in the e2e suite
(e2e/test_dashboard_promql.py, e2e/test_engine.py).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from chart_harness import Helm
from grafana_dashboard import (
    DASHBOARD,
    as_promql,
    dashboard_metric_names,
    dashboard_queries,
    load_dashboard,
    metric_names,
)
from specdeploy.adapters.metrics import OperatorMetrics
from testbed.cluster import tools_dir

# The sample names each kind of prometheus_client metric exposes.
EXPOSED_SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
}
OPERATOR_PREFIX = "specdeploy_"
ENGINE_PREFIX = "vllm:"
# What the dashboard promises to show, by the metric it needs.
PROMISED = {
    "acceptance rate": "vllm:spec_decode_num_accepted_tokens_total",
    "mean acceptance length": "vllm:spec_decode_num_drafts_total",
    "tokens/s": "vllm:generation_tokens_total",
    "inter-token latency": "vllm:inter_token_latency_seconds_bucket",
    "time to first token": "vllm:time_to_first_token_seconds_bucket",
    "verdicts": "specdeploy_analysis_verdicts_total",
    "promotions": "specdeploy_canary_promotions_total",
    "rollbacks": "specdeploy_canary_rollbacks_total",
}


def operator_metric_names() -> set[str]:
    """Every sample name the operator's registry exposes, labelled children or not."""
    names = set()
    for family in OperatorMetrics().registry.collect():
        names |= {family.name + suffix for suffix in EXPOSED_SUFFIXES[family.type]}
    return names


def test_every_operator_metric_the_dashboard_reads_is_in_the_registry() -> None:
    read = dashboard_metric_names(load_dashboard())
    operator = {n for n in read if n.startswith(OPERATOR_PREFIX)}
    assert operator, "the dashboard reads no operator metric"
    assert operator <= operator_metric_names(), operator - operator_metric_names()
    # Everything else is the engine's, checked against a real engine's /metrics in e2e.
    assert {n for n in read if not n.startswith(OPERATOR_PREFIX)} == {
        n for n in read if n.startswith(ENGINE_PREFIX)
    }


def test_the_dashboard_shows_what_it_promises() -> None:
    read = dashboard_metric_names(load_dashboard())
    assert {what: metric in read for what, metric in PROMISED.items()} == dict.fromkeys(
        PROMISED, True
    )


def test_every_query_names_only_variables_grafana_fills_in() -> None:
    queries = dashboard_queries(load_dashboard())
    assert len(queries) >= 15
    for where, expr in queries.items():
        assert metric_names(as_promql(expr)), f"{where} reads no metric: {expr}"


def test_per_revision_panels_split_by_the_podmonitors_revision_label() -> None:
    """The PodMonitor's podTargetLabels give each engine series `specdeploy_dev_revision`."""
    for where, expr in dashboard_queries(load_dashboard()).items():
        if ENGINE_PREFIX in expr and not where.startswith("variable/"):
            assert "by (" in expr, where
            assert "specdeploy_dev_revision" in expr, where


def test_metric_names_ignores_functions_labels_and_keywords() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, pod) (rate(a_bucket{pod=~"x"}[5m])))'
        " / on(pod) group_left b + 1e3 * c offset 5m"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c"}


def test_panel_ids_are_unique_and_every_target_uses_the_datasource_variable() -> None:
    dashboard = load_dashboard()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


# --- helm template --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Helm:
    """The pinned helm of the test bed's tools (`make tools`), without a cluster."""
    return Helm(tools_dir(build=False) / "helm")


def _dashboards(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == "ConfigMap" and "specdeploy.json" in o["data"]]


@pytest.mark.helm
def test_chart_ships_the_dashboard_only_when_enabled(helm: Helm) -> None:
    assert _dashboards(helm.template("-n", "ops")) == []
    [config_map] = _dashboards(
        helm.template(
            "-n",
            "ops",
            "--set",
            "grafanaDashboard.enabled=true",
            "--set",
            "grafanaDashboard.namespace=monitoring",
        )
    )
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["specdeploy.json"]) == json.loads(DASHBOARD.read_text())
