"""What the benchmarks' watches call ready, read from an event's JSON as parsed."""

from __future__ import annotations

from typing import Any

from bench.bed import deployment_ready


def deployment(
    *, generation: int = 1, observed: int | None = 1, ready: int = 1, updated: int = 1
) -> dict[str, Any]:
    status: dict[str, Any] = {"readyReplicas": ready, "updatedReplicas": updated}
    if observed is not None:
        status["observedGeneration"] = observed
    return {
        "metadata": {"name": "raw", "generation": generation},
        "spec": {"replicas": 1},
        "status": status,
    }


def test_a_deployment_is_ready_once_its_controller_counts_every_replica_of_its_spec() -> None:
    assert deployment_ready(deployment())
    assert not deployment_ready(deployment(ready=0))
    assert not deployment_ready(deployment(updated=0))
    assert not deployment_ready(deployment(observed=None))
    assert not deployment_ready(deployment(generation=2))
    assert not deployment_ready({"metadata": {"generation": 1}, "spec": {"replicas": 1}})
