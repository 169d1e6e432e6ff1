"""The test bed does what the operator relies on: a real API server with our CRD and its CEL
rules, Kueue gating and admitting GPU pods onto KWOK GPU nodes, and the Argo CD CRDs."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed import (
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    Kubectl,
    eventually,
    queued_namespace,
)

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[1]
CRD_DIR = REPO_ROOT / "crds"
INVALID_FIXTURES = REPO_ROOT / "tests" / "fixtures" / "invalid"
ADMISSION_GATE = "kueue.x-k8s.io/admission"


def _crd_documents() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        docs.extend(d for d in yaml.safe_load_all(path.read_text()) if d)
    return [d for d in docs if d.get("kind") == "CustomResourceDefinition"]


def _speculative_deployment_crd() -> dict[str, Any]:
    for crd in _crd_documents():
        if crd["spec"]["names"]["kind"] == "SpeculativeDeployment":
            return crd
    pytest.fail(f"no SpeculativeDeployment CRD in {CRD_DIR} (run `make crds`)")


@pytest.fixture(scope="session")
def specdeploy_crd(kubectl: Kubectl) -> dict[str, Any]:
    """Our CRD from crds/, installed (server-side apply) and Established."""
    crd = _speculative_deployment_crd()
    kubectl.apply([crd])
    kubectl.run(
        "wait", "--for=condition=Established", f"crd/{crd['metadata']['name']}", "--timeout=60s"
    )
    return crd


def _words(text: str) -> str:
    return " ".join(text.split())


def test_crd_installs_and_kubectl_explain_shows_field_docs(
    kubectl: Kubectl, specdeploy_crd: dict[str, Any]
) -> None:
    singular = specdeploy_crd["spec"]["names"]["singular"]
    assert singular == "speculativedeployment"

    # The API server publishes a new CRD's OpenAPI a little after it is Established.
    def explain() -> str | None:
        result = kubectl.run("explain", f"{singular}.spec", check=False)
        return result.stdout if result.returncode == 0 else None

    explained = _words(eventually(explain, 60, f"kubectl explain {singular}.spec"))

    served = next(v for v in specdeploy_crd["spec"]["versions"] if v.get("storage"))
    spec_schema = served["schema"]["openAPIV3Schema"]["properties"]["spec"]
    described = {
        name: prop["description"]
        for name, prop in spec_schema.get("properties", {}).items()
        if prop.get("description")
    }
    assert described, "the CRD's spec fields carry no descriptions"
    for name, description in described.items():
        assert name in explained, f"field {name} missing from kubectl explain"
        # kubectl re-wraps text, so compare the first words with whitespace collapsed.
        start = " ".join(description.split()[:6])
        assert start in explained, f"description of {name} missing: {start!r}"


def _invalid_fixtures() -> list[Path]:
    return sorted(INVALID_FIXTURES.glob("*.yaml")) if INVALID_FIXTURES.is_dir() else []


def _expectations(path: Path) -> list[str]:
    return [
        m.group(1).strip()
        for m in re.finditer(r"^#\s*expect:\s*(.+)$", path.read_text(), flags=re.MULTILINE)
    ]


@pytest.fixture(scope="module")
def refusal_namespace(kubectl: Kubectl) -> Iterator[str]:
    """One namespace for every invalid fixture: each is a server-side dry run, so nothing is
    stored and the cases cannot see each other; a namespace apiece made the namespace
    controller delete 127 of them while the next ones waited on their ServiceAccount."""
    with queued_namespace(kubectl, f"e2e-refusals-{uuid.uuid4().hex[:5]}") as name:
        yield name


@pytest.mark.parametrize(
    "fixture", _invalid_fixtures() or [INVALID_FIXTURES / "MISSING"], ids=lambda p: p.stem
)
def test_cel_rules_reject_invalid_resources_with_field_paths(
    kubectl: Kubectl, specdeploy_crd: dict[str, Any], refusal_namespace: str, fixture: Path
) -> None:
    assert fixture.exists(), f"no invalid fixtures in {INVALID_FIXTURES}"
    expected = _expectations(fixture)
    assert expected, f"{fixture.name} has no '# expect: <error text>' line"
    docs = [d for d in yaml.safe_load_all(fixture.read_text()) if d]
    for doc in docs:
        doc.setdefault("metadata", {})["namespace"] = refusal_namespace
    result = kubectl.run(
        "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(docs), check=False
    )
    assert result.returncode != 0, f"{fixture.name} was accepted by the API server"
    error = _words(result.stderr)
    for text in expected:
        assert _words(text) in error, f"expected {text!r} in: {result.stderr}"


def _gpu_deployment(name: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": {**labels, "kueue.x-k8s.io/queue-name": "interactive"},
        },
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "securityContext": RESTRICTED_POD_SECURITY,
                    "containers": [
                        {
                            "name": "engine",
                            "image": "registry.invalid/engine:test",
                            "securityContext": RESTRICTED_CONTAINER_SECURITY,
                            "resources": {
                                "requests": {"cpu": "4", "memory": "16Gi"},
                                "limits": {"nvidia.com/gpu": str(gpus)},
                            },
                        }
                    ],
                },
            },
        },
    }


def _pods(kubectl: Kubectl, namespace: str, app: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.get_json("pods", "-n", namespace, "-l", f"app={app}")[
        "items"
    ]
    return items


def _workload_for(kubectl: Kubectl, namespace: str, pod_name: str) -> dict[str, Any] | None:
    for workload in kubectl.get_json("workloads.kueue.x-k8s.io", "-n", namespace)["items"]:
        owners = workload["metadata"].get("ownerReferences", [])
        if any(o["kind"] == "Pod" and o["name"] == pod_name for o in owners):
            found: dict[str, Any] = workload
            return found
    return None


def _condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == kind:
            found: dict[str, Any] = cond
            return found
    return None


def _gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates", [])]


def test_gpu_deployment_is_gated_admitted_and_runs_on_a_kwok_gpu_node(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply([_gpu_deployment("fits", gpus=4)], "-n", namespace)
    pod = eventually(lambda: next(iter(_pods(kubectl, namespace, "fits")), None), 60, "a pod")
    # Kueue's pod webhook took the pod over: it was created behind the admission gate.
    assert pod["metadata"]["labels"].get("kueue.x-k8s.io/managed") == "true"

    def admitted() -> dict[str, Any] | None:
        workload = _workload_for(kubectl, namespace, pod["metadata"]["name"])
        cond = _condition(workload, "Admitted") if workload else None
        return workload if cond and cond["status"] == "True" else None

    workload = eventually(admitted, 60, "Kueue to admit the pod's Workload")
    assignment = workload["status"]["admission"]["podSetAssignments"][0]
    assert assignment["resourceUsage"]["nvidia.com/gpu"] == "4"

    def running() -> dict[str, Any] | None:
        pods = _pods(kubectl, namespace, "fits")
        ok = [p for p in pods if p["status"].get("phase") == "Running"]
        return ok[0] if ok else None

    pod = eventually(running, 60, "the pod to be Running")
    assert ADMISSION_GATE not in _gates(pod)
    node = kubectl.get_json("node", pod["spec"]["nodeName"])
    assert node["metadata"]["annotations"].get("kwok.x-k8s.io/node") == "fake"
    assert int(node["status"]["allocatable"].get("nvidia.com/gpu", "0")) >= 4
    flavor = assignment["flavors"]["nvidia.com/gpu"]
    rf = kubectl.get_json("resourceflavor", flavor)
    for key, value in rf["spec"]["nodeLabels"].items():
        assert node["metadata"]["labels"].get(key) == value


def test_gpu_deployment_over_quota_stays_gated_with_its_workload_pending(
    kubectl: Kubectl, namespace: str
) -> None:
    kubectl.apply([_gpu_deployment("too-big", gpus=64)], "-n", namespace)
    pod = eventually(lambda: next(iter(_pods(kubectl, namespace, "too-big")), None), 60, "a pod")

    def pending() -> dict[str, Any] | None:
        workload = _workload_for(kubectl, namespace, pod["metadata"]["name"])
        cond = _condition(workload, "QuotaReserved") if workload else None
        return workload if cond and cond["status"] == "False" else None

    workload = eventually(pending, 60, "Kueue to report the Workload as pending")
    message = _condition(workload, "QuotaReserved")["message"]  # type: ignore[index]
    assert "nvidia.com/gpu" in message or "insufficient" in message.lower(), message
    # Kueue's own queue accounting has taken the Workload in as pending: its decision is made.
    eventually(
        lambda: (
            kubectl.get_json("localqueue", "interactive", "-n", namespace)
            .get("status", {})
            .get("pendingWorkloads", 0)
            >= 1
        ),
        60,
        "LocalQueue interactive to count the Workload as pending",
    )
    again = _workload_for(kubectl, namespace, pod["metadata"]["name"])
    assert again is not None
    admitted = _condition(again, "Admitted")
    assert admitted is None or admitted["status"] != "True"
    pod = kubectl.get_json("pod", "-n", namespace, pod["metadata"]["name"])
    assert pod is not None
    assert ADMISSION_GATE in _gates(pod)
    assert not pod["spec"].get("nodeName")
    assert pod["status"].get("phase") == "Pending"


def test_applicationset_passes_server_side_dry_run(kubectl: Kubectl, namespace: str) -> None:
    appset = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": "specdeploy-demo", "namespace": namespace},
        "spec": {
            "goTemplate": True,
            "generators": [{"list": {"elements": [{"env": "staging"}, {"env": "prod"}]}}],
            "template": {
                "metadata": {"name": "specdeploy-{{.env}}"},
                "spec": {
                    "project": "default",
                    "source": {
                        "repoURL": "https://example.invalid/specdeploy.git",
                        "path": "examples/{{.env}}",
                        "targetRevision": "main",
                    },
                    "destination": {
                        "server": "https://kubernetes.default.svc",
                        "namespace": "{{.env}}",
                    },
                },
            },
        },
    }
    result = kubectl.run("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(appset))
    assert "(server dry run)" in result.stdout
    # A dry run stores nothing.
    listed = kubectl.get_json("applicationsets.argoproj.io", "-n", namespace)
    assert listed["items"] == []
