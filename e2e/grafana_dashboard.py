"""The PromQL of the chart's Grafana dashboard (charts/specdeploy/dashboards/specdeploy.json).

Each query as Prometheus would receive it once Grafana has put in its variables, and the metric
names it reads, for the tests that parse them with a real Prometheus and look the names up in
the operator's registry and in a real engine's /metrics.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "charts/specdeploy/dashboards/specdeploy.json"

# What Grafana puts in place of its variables: every value of a multi-value variable (its
# allValue), and a rate interval.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "1m",
    "$__range": "1h",
    "$namespace": ".*",
    "$sd": ".*",
    "$revision": ".*",
}
_LABEL_VALUES = re.compile(r"^label_values\((?:(.*),\s*)?([A-Za-z_]\w*)\)$", re.DOTALL)
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
_KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def load_dashboard(path: Path = DASHBOARD) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard.get("panels", []):
        found.append(panel)
        found.extend(panel.get("panels", []))  # the panels of a collapsed row
    return found


def dashboard_queries(dashboard: dict[str, Any]) -> dict[str, str]:
    """Every PromQL expression of the dashboard, by where it is ("panel/refId" or
    "variable/name"), with Grafana's variables still in."""
    queries: dict[str, str] = {}
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            queries[f"{panel['title']}/{target['refId']}"] = target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        query = variable["query"]
        text = query["query"] if isinstance(query, dict) else query
        matched = _LABEL_VALUES.match(text.strip())
        if matched is None:
            raise ValueError(f"variable {variable['name']}: not label_values(...): {text}")
        if matched.group(1):  # label_values(<series selector>, <label>)
            queries[f"variable/{variable['name']}"] = matched.group(1)
    return queries


def as_promql(expr: str) -> str:
    """`expr` as Prometheus receives it from Grafana; a ValueError for an unknown variable."""
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    if "$" in expr:
        raise ValueError(f"a Grafana variable the tests do not know: {expr}")
    return expr


def metric_names(promql: str) -> set[str]:
    """The metric names `promql` selects (not its functions, labels or keywords)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', promql)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])[A-Za-z_:][\w:]*", text):
        word = match.group(0)
        if text[match.end() :].lstrip().startswith("(") or word.lower() in _KEYWORDS:
            continue  # a function or an aggregation, or a keyword
        names.add(word)
    return names


def dashboard_metric_names(dashboard: dict[str, Any]) -> set[str]:
    """Every metric name the dashboard's queries read."""
    return {n for q in dashboard_queries(dashboard).values() for n in metric_names(as_promql(q))}
