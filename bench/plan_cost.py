"""Benchmark the operator's pure decisions: what one reconcile costs before any API call.

    make bench-plan              # or: PYTHONPATH=operator:e2e:. python -m bench.plan_cost

For each example SpeculativeDeployment, times the speculation decision, the sizing against the
test bed's GPU nodes (e2e/manifests/nodes.yaml), the revision hash and the child Deployment,
repeated many times, and writes the per-reconcile cost and the implied reconciles per second of
one core to bench/results/plan.json. A benchmark, not a test: figures depend on the machine.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import yaml

from bench.record import REPO, LoadWatch, write_result
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision, SpeculativeDeployment
from specdeploy.plan.children.manifests import build_revision_deployment
from specdeploy.plan.children.revision import revision_hash
from specdeploy.plan.placement.gpu_catalog import catalog_for_config, read_gpu_inventories
from specdeploy.plan.placement.sizing import size_pair
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec

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


def main(argv: list[str] | None = None) -> int:
    del argv  # no options
    config = OperatorConfig.from_mapping({"batchQueues": ["batch"]})
    nodes = [
        n
        for n in yaml.safe_load_all((REPO / "e2e" / "manifests" / "nodes.yaml").read_text())
        if n and n.get("kind") == "Node"
    ]
    results: dict[str, Any] = {}
    with LoadWatch("plan") as load:
        for name, body in examples().items():
            results[name] = time_example(name, body, nodes, config)
    write_result(
        "plan",
        {
            "what": "pure planning per reconcile (no API calls), examples/ on the test bed's nodes",
            "nodes": len(nodes),
            "rounds": ROUNDS,
            "repeats": REPEATS,
            "results": results,
            "load": {"plan": load.summary()},
        },
    )
    return 0


def time_example(
    name: str, body: dict[str, Any], nodes: list[dict[str, Any]], config: OperatorConfig
) -> dict[str, Any]:
    """The best and median cost of one reconcile's plan over REPEATS runs of ROUNDS."""
    per_call = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(ROUNDS):
            one_reconcile_plan(body, nodes, config)
        per_call.append((time.perf_counter() - start) / ROUNDS)
    best = min(per_call)
    print(f"{name:28s} {best * 1e6:8.1f} us/reconcile  ({1 / best:8.0f}/s)")
    return {
        "microseconds_per_reconcile_best": round(best * 1e6, 1),
        "microseconds_per_reconcile_median": round(statistics.median(per_call) * 1e6, 1),
        "reconciles_per_second_one_core": round(1 / best),
    }


if __name__ == "__main__":
    raise SystemExit(main())
