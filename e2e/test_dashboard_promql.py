"""Every PromQL expression of the chart's Grafana dashboard parses, asked of the test bed's real
Prometheus (a query that does not parse is refused with `bad_data`).

Grafana's variables are filled in as Grafana would (all values, a rate interval). That each
metric exists is checked elsewhere: the operator's in its registry (tests/), vLLM's in a real
engine's /metrics (e2e/test_engine.py).
"""

from __future__ import annotations

import pytest
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException

from grafana_dashboard import as_promql, dashboard_queries, load_dashboard

pytestmark = pytest.mark.e2e

QUERIES = dashboard_queries(load_dashboard())


def test_prometheus_refuses_a_query_that_does_not_parse(prometheus_url: str) -> None:
    """The check below can fail: a broken expression is refused, not answered empty."""
    client = PrometheusConnect(url=prometheus_url, disable_ssl=True)
    with pytest.raises(PrometheusApiClientException, match="bad_data"):
        client.custom_query("sum(rate(vllm:generation_tokens_total[1m])")


@pytest.mark.parametrize("where", sorted(QUERIES))
def test_dashboard_query_parses(prometheus_url: str, where: str) -> None:
    client = PrometheusConnect(url=prometheus_url, disable_ssl=True)
    result = client.custom_query(as_promql(QUERIES[where]))
    assert isinstance(result, list)
