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
    for path in EXAMPLES.glob("*.yaml"):
        sd = yaml.safe_load(path.read_text())
        placement = sd["spec"].get("placement", {})
        if "queue" in placement:
            assert (sd["metadata"]["namespace"], placement["queue"]) in local_queues, path.name
        if "priorityClass" in placement:
            assert placement["priorityClass"] in priorities, path.name
