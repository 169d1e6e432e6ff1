#!/usr/bin/env python3
"""Benchmark the operator's pure decisions: what one reconcile costs before any API call.

    make bench-plan              # or: PYTHONPATH=operator:e2e python hack/bench-plan.py

For each example SpeculativeDeployment, times the speculation decision, the sizing against the
test bed's GPU nodes (e2e/manifests/nodes.yaml), the revision hash and the child Deployment,
repeated many times, and writes the per-reconcile cost and the implied reconciles per second of
one core to bench/results/plan.json. A benchmark, not a test: figures depend on the machine.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "operator")]

from specdeploy.api.config import OperatorConfig  # noqa: E402
from specdeploy.api.models import SizingDecision, SpeculativeDeployment  # noqa: E402
from specdeploy.plan.children.manifests import build_revision_deployment  # noqa: E402
from specdeploy.plan.children.revision import revision_hash  # noqa: E402
from specdeploy.plan.placement.gpu_catalog import catalog_for_config, read_gpu_inventories  # noqa: E402
from specdeploy.plan.placement.sizing import size_pair  # noqa: E402
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec  # noqa: E402

ROUNDS = 2000
REPEATS = 5


def examples() -> dict[str, dict[str, Any]]:
    found = {}
    for path in sorted((REPO / "examples").glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document and document.get("kind") == "SpeculativeDeployment":
                document["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
                found[path.stem] = document
    return found


def one_reconcile_plan(
    body: dict[str, Any], nodes: list[dict[str, Any]], config: OperatorConfig
) -> str:
    """The pure part of a reconcile, from the raw bodies the API returns to the child manifest."""
    catalog = catalog_for_config(config)
    sd = SpeculativeDeployment.from_body(body)
    speculation = decide_speculation(sd.spec, config)
    served = sd.model_copy(update={"spec": served_spec(sd.spec, speculation)})
    inventory = read_gpu_inventories(nodes, catalog)
    sizing = size_pair(served.spec, inventory, config, catalog)
    if not isinstance(sizing, SizingDecision):
        return "unschedulable"
    revision = revision_hash(served.spec, sizing, config)
    build_revision_deployment(served, revision, sizing, config, replicas=sd.spec.replicas)
    return revision


def main() -> int:
    config = OperatorConfig.from_mapping({"batchQueues": ["batch"]})
    nodes = [
        n
        for n in yaml.safe_load_all((REPO / "e2e" / "manifests" / "nodes.yaml").read_text())
        if n and n.get("kind") == "Node"
    ]
    results: dict[str, Any] = {}
    for name, body in examples().items():
        per_call = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(ROUNDS):
                one_reconcile_plan(body, nodes, config)
            per_call.append((time.perf_counter() - start) / ROUNDS)
        best = min(per_call)
        results[name] = {
            "microseconds_per_reconcile_best": round(best * 1e6, 1),
            "microseconds_per_reconcile_median": round(statistics.median(per_call) * 1e6, 1),
            "reconciles_per_second_one_core": round(1 / best),
        }
        print(f"{name:28s} {best * 1e6:8.1f} us/reconcile  ({1 / best:8.0f}/s)")
    out = REPO / "bench" / "results" / "plan.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "what": "pure planning per reconcile (no API calls), examples/ on the test bed's nodes",
        "nodes": len(nodes),
        "rounds": ROUNDS,
        "repeats": REPEATS,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": results,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written to {out.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
