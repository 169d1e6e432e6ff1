"""Every queue an example SpeculativeDeployment names exists in the example Kueue setup."""

from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_example_queues_exist_in_their_namespaces() -> None:
    kueue = list(yaml.safe_load_all((EXAMPLES / "kueue" / "queues.yaml").read_text()))
    local_queues = {
        (doc["metadata"]["namespace"], doc["metadata"]["name"])
        for doc in kueue
        if doc["kind"] == "LocalQueue"
    }
    priorities = {
        doc["metadata"]["name"] for doc in kueue if doc["kind"] == "WorkloadPriorityClass"
    }
    examples = [yaml.safe_load(path.read_text()) for path in sorted(EXAMPLES.glob("*.yaml"))]
    assert len(examples) >= 4
    placements = [(sd["metadata"], sd["spec"]["placement"]) for sd in examples]
    # Every example is placed through a queue that exists, in its own namespace.
    queues = [(metadata["namespace"], placement["queue"]) for metadata, placement in placements]
    assert set(queues) <= local_queues, queues
    named = [p["priorityClass"] for _, p in placements if "priorityClass" in p]
    assert len(named) >= 3, "the examples show priority classes"
    assert set(named) <= priorities, named
