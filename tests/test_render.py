"""`specdeploy render`: a CR's children without a cluster, equal to what the reconcile applies."""

from __future__ import annotations

import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from specdeploy.api.config import OperatorConfig
from specdeploy.cli import EXIT_DOES_NOT_PLACE, EXIT_INVALID, EXIT_UNREADABLE, main
from specdeploy.plan.children.drift import APPLIED_HASH_ANNOTATION
from specdeploy.plan.decide import Snapshot, decide
from specdeploy.plan.placement.gpu_catalog import GPU_PRODUCTS, read_gpu_inventories
from specdeploy.render import (
    DoesNotPlaceError,
    InvalidSpeculativeDeploymentError,
    catalog_nodes,
    load_speculative_deployment,
    read_nodes,
    render,
)

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def example(name: str) -> dict[str, Any]:
    return load_speculative_deployment((ROOT / "examples" / name).read_text())


def h100_mig_node(name: str = "gpu-1", gpus: int = 4) -> dict[str, Any]:
    """H100s under the mixed strategy: `gpus` whole GPUs and 2 slices of 3g.40gb."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/mig.strategy": "mixed",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus), "nvidia.com/mig-3g.40gb": "2"}},
    }


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["render", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_each_example_renders_its_three_children(
    path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A replica across nodes needs nodes sharing its topology label: the test bed's have one.
    across = "multinode" in path.name
    nodes = ["--nodes", str(ROOT / "e2e" / "manifests" / "nodes.yaml")] if across else []
    code, out, err = run_cli(["-f", str(path), *nodes], capsys)
    assert code == 0, err
    documents = list(yaml.safe_load_all(out))
    kind = "LeaderWorkerSet" if across else "Deployment"
    assert [d["kind"] for d in documents] == [kind, "Service", "PodMonitor"]
    body = yaml.safe_load(path.read_text())
    name, namespace = body["metadata"]["name"], body["metadata"]["namespace"]
    deployment = documents[0]
    revision = deployment["metadata"]["labels"]["specdeploy.dev/revision"]
    assert deployment["metadata"]["name"] == f"{name}-{revision}"
    assert all(d["metadata"]["namespace"] == namespace for d in documents)
    # The header is comments (the output applies as is) and names the revision, the
    # arithmetic and the exact vllm arguments the container gets.
    header = [line for line in out.splitlines() if line.startswith("#")]
    assert f"# revision: {revision} " in "\n".join(header)
    assert any(line.startswith("#   / gpuMemoryUtilization = ") for line in header)
    if across:
        group = deployment["spec"]["leaderWorkerTemplate"]
        commands = {"leader": group["leaderTemplate"], "workers": group["workerTemplate"]}
    else:
        commands = {"": deployment["spec"]["template"]}
    for role, template in commands.items():
        prefix = f"# {role}: vllm serve " if role else "# vllm serve "
        [command] = [line for line in header if line.startswith(prefix)]
        container = template["spec"]["containers"][0]
        assert shlex.split(command.removeprefix(prefix)) == container["args"][2:]


def test_render_is_what_the_reconcile_applies_to_an_empty_namespace() -> None:
    """With a uid (a CR read back from the cluster), render gives the reconcile's manifests
    exactly, ownerReferences and applied-hash annotation included."""
    body = example("llama-8b-eagle3-mig.yaml")
    body["metadata"]["uid"] = "6f1c0a5e-0000-4000-8000-000000000001"
    nodes = [h100_mig_node()]
    config = OperatorConfig(batch_queues=["batch"])
    rendering = render(body, nodes, config, now=NOW)
    snapshot = Snapshot(
        body=body,
        nodes=nodes,
        deployments=[],
        records=[],
        service=None,
        pod_monitor_served=True,
        pod_monitor=None,
        pods=[],
        workloads=[],
        local_queue=None,
    )
    assert list(rendering.manifests) == list(decide(snapshot, config, GPU_PRODUCTS, NOW).applies)
    assert (
        rendering.manifests[0]["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    )
    assert rendering.sizing.mig_profile == "3g.40gb"


def test_without_a_uid_no_owner_reference_nor_applied_hash() -> None:
    rendering = render(example("qwen-7b-ngram.yaml"), None, OperatorConfig())
    for manifest in rendering.manifests:
        assert "ownerReferences" not in manifest["metadata"]
        assert APPLIED_HASH_ANNOTATION not in (manifest["metadata"].get("annotations") or {})


def test_the_config_decides_speculation_and_image() -> None:
    body = example("llama-8b-batch-queue.yaml")
    default = render(body, None, OperatorConfig())
    batch = render(body, None, OperatorConfig(batch_queues=["batch"], engine_image="e:2"))
    assert default.speculation.state == "Enabled"
    assert batch.speculation.state == "Disabled"
    assert "--speculative-config" not in batch.vllm_args
    assert batch.revision != default.revision
    container = batch.manifests[0]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "e:2"


def test_nodes_file_decides_the_sizing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [h100_mig_node()]})
    )
    code, out, err = run_cli(
        ["-f", str(ROOT / "examples" / "qwen-7b-ngram.yaml"), "--nodes", str(nodes)], capsys
    )
    # 49 GiB for Qwen 7B with its default KV budget (32k x 16): no 3g.40gb slice holds it, one
    # whole H100 does (the built-in catalog would choose a 3g.71gb slice of an H200).
    assert code == 0, err
    assert f"# nodes: {nodes} (1 nodes)" in out
    limits = next(yaml.safe_load_all(out))["spec"]["template"]["spec"]["containers"][0]
    assert limits["resources"]["limits"] == {"nvidia.com/gpu": 1, "memory": "32Gi"}


def test_namespace_flag_and_the_default_namespace() -> None:
    body = example("qwen-7b-ngram.yaml")
    moved = render(body, None, OperatorConfig(), namespace="elsewhere")
    assert {m["metadata"]["namespace"] for m in moved.manifests} == {"elsewhere"}
    del body["metadata"]["namespace"]
    assert render(body, None, OperatorConfig()).manifests[1]["metadata"]["namespace"] == "default"


def test_an_invalid_cr_exits_1_naming_each_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    body = example("llama-8b-eagle3-mig.yaml")
    body["spec"]["placement"]["gpu"]["mig"] = "Sometimes"  # schema: enum
    del body["spec"]["pair"]["draft"]["model"]  # CEL: eagle3 needs a draft model
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run_cli(["-f", str(path)], capsys)
    assert code == EXIT_INVALID
    assert out == ""
    assert "spec.placement.gpu.mig: 'Sometimes' is not one of" in err
    assert "spec.pair.draft.model: Invalid value: draft.model is required" in err


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("kind: Deployment\napiVersion: apps/v1\n", "expected specdeploy.dev/v1alpha1"),
        ("a: 1\n---\nb: 2\n", "found 2 documents"),
        ("a: [1\n", "not YAML"),
    ],
)
def test_not_one_speculative_deployment_is_invalid(text: str, reason: str) -> None:
    with pytest.raises(InvalidSpeculativeDeploymentError, match=reason):
        load_speculative_deployment(text)


def test_a_cr_without_a_name_is_invalid() -> None:
    body = example("qwen-7b-ngram.yaml")
    del body["metadata"]["name"]
    with pytest.raises(InvalidSpeculativeDeploymentError, match=r"metadata\.name: Required"):
        render(body, None, OperatorConfig())


def test_a_pair_that_does_not_place_exits_3_with_the_numbers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(yaml.safe_dump([h100_mig_node(gpus=2)]))
    # 70B with its head needs 4 x H100 (tensor parallel 4); this node has 2 and slices.
    body = example("llama-70b-eagle3-tp4.yaml")
    path = tmp_path / "sd.yaml"
    path.write_text(yaml.safe_dump(body))
    code, out, err = run_cli(["-f", str(path), "--nodes", str(nodes)], capsys)
    assert code == EXIT_DOES_NOT_PLACE
    assert out == ""
    assert "does not place: needs " in err
    assert "GiB per replica" in err
    assert "nothing in the cluster fits" in err


def test_a_model_of_unknown_shape_does_not_place() -> None:
    body = example("qwen-7b-ngram.yaml")
    body["spec"]["pair"]["target"]["model"] = "example/unknown-model"
    with pytest.raises(DoesNotPlaceError, match="no architecture shape for example/unknown-model"):
        render(body, None, OperatorConfig())


def test_unreadable_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example_path = str(ROOT / "examples" / "qwen-7b-ngram.yaml")
    code, _, err = run_cli(["-f", str(tmp_path / "missing.yaml")], capsys)
    assert code == EXIT_UNREADABLE
    assert "missing.yaml" in err
    not_nodes = tmp_path / "nodes.yaml"
    not_nodes.write_text("- {kind: Pod}\n")
    code, _, err = run_cli(["-f", example_path, "--nodes", str(not_nodes)], capsys)
    assert code == EXIT_UNREADABLE
    assert "item 0 is not a Node" in err
    bad_config = tmp_path / "config.yaml"
    bad_config.write_text("reconcileIntervalSeconds: -1\n")
    code, _, err = run_cli(["-f", example_path, "--config", str(bad_config)], capsys)
    assert code == EXIT_UNREADABLE
    assert "reconcileIntervalSeconds" in err or "reconcile_interval_seconds" in err


def test_every_catalog_product_is_a_node_offering_all_its_profiles() -> None:
    inventories = read_gpu_inventories(catalog_nodes(GPU_PRODUCTS))
    assert len(inventories) == len(GPU_PRODUCTS)
    for inventory in inventories:
        assert inventory.product is not None
        assert inventory.whole_gpus == 8
        offered = {o.profile.name for o in inventory.mig_offers}
        assert offered == {p.name for p in inventory.product.mig_profiles}


def test_read_nodes_takes_a_list_object_a_yaml_list_and_documents() -> None:
    node = h100_mig_node()
    as_list = yaml.safe_dump({"kind": "List", "items": [node]})
    as_sequence = yaml.safe_dump([node, h100_mig_node("gpu-2")])
    as_documents = yaml.safe_dump_all([node, h100_mig_node("gpu-2")])
    assert read_nodes(as_list) == [node]
    assert len(read_nodes(as_sequence)) == 2
    assert len(read_nodes(as_documents)) == 2
