"""Every queue an example SpeculativeDeployment names exists in the example Kueue setup."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / "kueue" / name).read_text()) if d]


def test_example_namespaces_are_made_with_the_queues() -> None:
    made = {d["metadata"]["name"] for d in _docs("namespaces.yaml") if d["kind"] == "Namespace"}
    local_queues = {
        d["metadata"]["namespace"] for d in _docs("queues.yaml") if d["kind"] == "LocalQueue"
    }
    examples = {yaml.safe_load(p.read_text())["metadata"]["namespace"] for p in _examples()}
    assert local_queues | examples <= made


def _examples() -> list[Path]:
    return sorted(EXAMPLES.glob("*.yaml"))


def _quota(flavor: dict[str, Any], resource: str) -> float:
    return sum(float(r["nominalQuota"]) for r in flavor["resources"] if r["name"] == resource)


def test_each_examples_pinned_gpu_has_quota_on_a_flavor_of_that_product() -> None:
    """A pinned product (and MIG policy) must meet a flavor whose nodeLabels name that product
    and whose quota holds the resource kind the sizing asks for (whole GPUs or MIG slices) in
    the ClusterQueue behind the example's LocalQueue: the queues once gave MIG quota only to an
    A100 flavor while the MIG example pins H100."""
    docs = _docs("queues.yaml")
    products = {
        d["metadata"]["name"]: d["spec"]["nodeLabels"].get("nvidia.com/gpu.product")
        for d in docs
        if d["kind"] == "ResourceFlavor"
    }
    cluster_queue_of = {
        (d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["clusterQueue"]
        for d in docs
        if d["kind"] == "LocalQueue"
    }
    flavors_of = {
        d["metadata"]["name"]: [f for g in d["spec"]["resourceGroups"] for f in g["flavors"]]
        for d in docs
        if d["kind"] == "ClusterQueue"
    }
    for path in _examples():
        sd = yaml.safe_load(path.read_text())
        placement = sd["spec"]["placement"]
        gpu = placement.get("gpu") or {}
        mig = gpu.get("mig", "Auto")
        kinds = {"Never": ["gpu"], "Required": ["mig"], "Auto": ["gpu", "mig"]}[mig]
        queue = cluster_queue_of[(sd["metadata"]["namespace"], placement["queue"])]
        fitting = [
            flavor["name"]
            for flavor in flavors_of[queue]
            if gpu.get("product") in (None, products[flavor["name"]])
            and any(
                _quota(flavor, r["name"]) > 0
                for r in flavor["resources"]
                if ("gpu" in kinds and r["name"] == "nvidia.com/gpu")
                or ("mig" in kinds and r["name"].startswith("nvidia.com/mig-"))
            )
        ]
        assert fitting, f"{path.name}: no flavor of {queue} has quota for {gpu}"


#: Node labels the GPU operator sets (GPU feature discovery, the MIG manager) that tell nodes of
#: one cluster apart; nvidia.com/mig.strategy is not one of them: under the mixed strategy it is
#: `mixed` on every GPU node.
GPU_OPERATOR_SELECTING_LABELS = {"nvidia.com/gpu.product", "nvidia.com/mig.config"}
NODES = Path(__file__).resolve().parents[1] / "e2e" / "manifests" / "nodes.yaml"


def test_example_flavors_select_whole_gpu_and_mig_nodes_by_labels_the_gpu_operator_sets() -> None:
    """Each flavor selects by GPU product and MIG layout only, and on the test bed's nodes
    (labelled as the GPU operator labels them under its mixed strategy) exactly the nodes of its
    kind: whole H100s, partitioned H100s, H200s."""
    flavors = {
        d["metadata"]["name"]: d for d in _docs("queues.yaml") if d["kind"] == "ResourceFlavor"
    }
    nodes = [d for d in yaml.safe_load_all(NODES.read_text()) if d and d["kind"] == "Node"]
    selected = {}
    for name, flavor in flavors.items():
        wanted = flavor["spec"]["nodeLabels"]
        assert set(wanted) <= GPU_OPERATOR_SELECTING_LABELS, (name, wanted)
        selected[name] = sorted(
            n["metadata"]["name"]
            for n in nodes
            if all(n["metadata"]["labels"].get(k) == v for k, v in wanted.items())
        )
    assert selected == {
        "nvidia-h100": ["kwok-h100-0", "kwok-h100-1"],
        "nvidia-h100-mig": ["kwok-h100-mig-0"],
        "nvidia-h200": ["kwok-h200-0"],
    }
    # The nodes say what the GPU operator says under mixed: the same strategy everywhere.
    assert {n["metadata"]["labels"]["nvidia.com/mig.strategy"] for n in nodes} == {"mixed"}
