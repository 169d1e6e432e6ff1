"""`specdeploy render` against the operator: for each example, what render prints offline is what
the operator applies on the test bed.

Each example in examples/ is applied (in the test's namespace, whose LocalQueues are the ones
the examples name) with the operator running (conftest's `operator`: `batch` is a batch queue,
as the batch example expects), and rendered with
`specdeploy render -f <example> --nodes <the test bed's nodes> --config <that config>`. Every
rendered object must be held by the live one (`plan.children.drift.differences`: the fields render
sets, server defaults ignored). Rendered again from the live SD (`kubectl get sd -o yaml`, which
has a uid), the children also carry the operator's ownerReferences and the applied-hash
annotation, a hash of the whole manifest the operator applied: equal hashes, equal manifests.

GPU pods are KWOK-run: no real engine starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine_cluster import OperatorProcess
from engine_harness import OPERATOR_SRC
from specdeploy.plan.children.drift import APPLIED_HASH_ANNOTATION, differences
from testbed import Kubectl, eventually

# The CRDs first, so the operator finds the PodMonitor kind served from its first reconcile.
pytestmark = [pytest.mark.e2e, pytest.mark.usefixtures("sd_crd", "pod_monitor_crd")]

REPO_ROOT = Path(__file__).resolve().parents[1]
# examples/kueue/ and examples/argocd/ hold no SpeculativeDeployment to render.
EXAMPLES = sorted((REPO_ROOT / "examples").glob("*.yaml"))
# Examples that do not place on the test bed's nodes today, with the reason. Their comparison
# is expected to fail, strictly: when they place, the mark must go.
NOT_PLACING_ON_THE_TEST_BED: dict[str, str] = {}
EXAMPLE_PARAMS = [
    pytest.param(
        path,
        id=path.name,
        marks=[pytest.mark.xfail(strict=True, reason=NOT_PLACING_ON_THE_TEST_BED[path.name])]
        if path.name in NOT_PLACING_ON_THE_TEST_BED
        else [],
    )
    for path in EXAMPLES
]
LIVE_KINDS = {
    "Deployment": "deployment",
    "LeaderWorkerSet": "leaderworkerset",
    "Service": "service",
    "PodMonitor": "podmonitor",
}


def specdeploy_render(*args: str) -> subprocess.CompletedProcess[str]:
    """`specdeploy render` as a user runs it, in a process of its own."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(OPERATOR_SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-m", "specdeploy.cli", "render", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def rendered_objects(*args: str) -> list[dict[str, Any]]:
    done = specdeploy_render(*args)
    assert done.returncode == 0, f"render exited {done.returncode}: {done.stderr}"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def live(kubectl: Kubectl, manifest: dict[str, Any]) -> dict[str, Any] | None:
    metadata = manifest["metadata"]
    found = kubectl.run(
        "get",
        LIVE_KINDS[manifest["kind"]],
        metadata["name"],
        "-n",
        metadata["namespace"],
        "-o",
        "yaml",
        check=False,
    )
    return yaml.safe_load(found.stdout) if found.returncode == 0 else None


def held_by_the_cluster(kubectl: Kubectl, rendered: list[dict[str, Any]]) -> dict[str, list[str]]:
    """For each rendered object the fields its live object lacks or holds otherwise (all
    empty: the cluster holds everything render printed)."""
    missing: dict[str, list[str]] = {}
    for manifest in rendered:
        key = f"{manifest['kind']} {manifest['metadata']['name']}"
        current = live(kubectl, manifest)
        missing[key] = ["(missing)"] if current is None else differences(manifest, current)
    return missing


@pytest.mark.parametrize("path", EXAMPLE_PARAMS)
def test_render_equals_what_the_operator_applies(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, path: Path, tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text(kubectl.run("get", "nodes", "-o", "yaml").stdout)
    config = operator.workdir / "operator.yaml"
    rendered = rendered_objects(
        "-f", str(path), "--nodes", str(nodes), "--config", str(config), "-n", namespace
    )
    # A revision whose replicas span nodes is a LeaderWorkerSet (examples/llama-405b-...).
    revision_kind = "LeaderWorkerSet" if "405b" in path.name else "Deployment"
    assert [m["kind"] for m in rendered] == [revision_kind, "Service", "PodMonitor"]

    body = yaml.safe_load(path.read_text())
    body["metadata"]["namespace"] = namespace
    kubectl.apply([body])

    def all_held() -> dict[str, list[str]] | None:
        found = held_by_the_cluster(kubectl, rendered)
        return found if not any(found.values()) else None

    try:
        eventually(all_held, 60, "the operator's children to hold every rendered field")
    except TimeoutError:
        pytest.fail(f"live objects differ from render: {held_by_the_cluster(kubectl, rendered)}")

    # The SD's own account of the decision agrees with render's (its status is written after
    # the children, in the same reconcile).
    revision = rendered[0]["metadata"]["labels"]["specdeploy.dev/revision"]

    def recorded() -> dict[str, Any] | None:
        sd: dict[str, Any] = kubectl.get_json("sd", body["metadata"]["name"], "-n", namespace)
        revisions = (sd.get("status") or {}).get("revisions") or []
        return sd if revision in {r["revision"] for r in revisions} else None

    sd = eventually(recorded, 30, f"revision {revision} in the SD's status")
    spec = rendered[0]["spec"]
    template = (
        spec["leaderWorkerTemplate"]["leaderTemplate"] if "405b" in path.name else spec["template"]
    )
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert limits[sd["status"]["sizing"]["resourceName"]] == sd["status"]["sizing"]["count"]

    # Rendered from the live SD (it has a uid now): the operator's own applied-hash annotation.
    live_sd = tmp_path / "live-sd.yaml"
    live_sd.write_text(
        kubectl.run("get", "sd", body["metadata"]["name"], "-n", namespace, "-o", "yaml").stdout
    )
    exact = rendered_objects("-f", str(live_sd), "--nodes", str(nodes), "--config", str(config))
    assert held_by_the_cluster(kubectl, exact) == {
        f"{m['kind']} {m['metadata']['name']}": [] for m in exact
    }
    for manifest in exact:
        current = live(kubectl, manifest) or {}
        annotations = current["metadata"].get("annotations") or {}
        assert (
            annotations.get(APPLIED_HASH_ANNOTATION)
            == manifest["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
        )
