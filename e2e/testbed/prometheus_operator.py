"""The Prometheus Operator's PodMonitor CRD, as its pinned release ships it, for the tests.

`make prometheus-operator-crd` (a prerequisite of `make e2e` and `make demo`) copies it into the
cache with hack/fetch-prometheus-operator-crd.sh, which also pins the version. The CRD is
cluster-wide and the operator chooses a PodMonitor over scrape annotations by whether it is
established, so a test installs it only for as long as it needs it.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from testbed.kubectl import Kubectl
from testbed.polling import eventually

REPO_ROOT = Path(__file__).resolve().parents[2]
FETCH_SCRIPT = REPO_ROOT / "hack" / "fetch-prometheus-operator-crd.sh"
POD_MONITOR_CRD_NAME = "podmonitors.monitoring.coreos.com"
POD_MONITOR_CRD_FILE = "monitoring.coreos.com_podmonitors.yaml"
# The annotation the Prometheus Operator's release CRDs carry their version in.
VERSION_ANNOTATION = "operator.prometheus.io/version"


def pod_monitor_crd_folder() -> Path:
    """The cache folder holding the pinned release's PodMonitor CRD; fetches nothing."""
    out = subprocess.run(
        ["bash", str(FETCH_SCRIPT), "--print-dir"], check=True, stdout=subprocess.PIPE, text=True
    ).stdout
    folder = Path(out.strip().splitlines()[-1])
    if not (folder / ".complete").exists() or not (folder / POD_MONITOR_CRD_FILE).exists():
        raise RuntimeError(
            f"the Prometheus Operator's PodMonitor CRD is not in {folder}: run "
            f"`make prometheus-operator-crd` (bash {FETCH_SCRIPT.relative_to(REPO_ROOT)}; "
            "needs Go and the Go module proxy)"
        )
    return folder


def pinned_version() -> str:
    """The pinned Prometheus Operator release, e.g. `v0.85.0`."""
    return (pod_monitor_crd_folder() / "version").read_text().strip()


def monitor_crd(plural: str = "podmonitors") -> dict[str, Any]:
    """The CustomResourceDefinition of `podmonitors` or `servicemonitors` of the pinned
    release."""
    name = f"{plural}.monitoring.coreos.com"
    path = pod_monitor_crd_folder() / f"monitoring.coreos.com_{plural}.yaml"
    if not path.exists():
        raise RuntimeError(f"{path} is missing: run `make prometheus-operator-crd`")
    [crd] = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    if crd.get("kind") != "CustomResourceDefinition" or crd["metadata"]["name"] != name:
        raise RuntimeError(f"{path.name} is not the {name} CRD")
    found: dict[str, Any] = crd
    return found


def pod_monitor_crd() -> dict[str, Any]:
    """The PodMonitor CustomResourceDefinition of the pinned release."""
    return monitor_crd("podmonitors")


@contextlib.contextmanager
def served_pod_monitor_crd(kubectl: Kubectl, timeout: float = 60.0) -> Iterator[dict[str, Any]]:
    """The real PodMonitor CRD installed (server-side apply: it is large), established and in
    discovery while the block runs; deleted afterwards unless it was there before."""
    with served_monitor_crd(kubectl, "podmonitors", timeout) as crd:
        yield crd


@contextlib.contextmanager
def served_monitor_crd(
    kubectl: Kubectl, plural: str, timeout: float = 60.0
) -> Iterator[dict[str, Any]]:
    """The real CRD of `podmonitors` or `servicemonitors` installed, established and in
    discovery while the block runs; deleted afterwards unless it was there before."""
    crd = monitor_crd(plural)
    crd_name = crd["metadata"]["name"]
    there_before = kubectl.run("get", "crd", crd_name, "-o", "name", check=False).returncode == 0
    if not there_before:
        kubectl.apply([crd])
    try:
        # Again when it fails at once: `kubectl wait` exits 1 while the new CRD has no
        # status.conditions yet (".status.conditions accessor error").
        eventually(
            lambda: (
                kubectl.run(
                    "wait",
                    "--for=condition=Established",
                    f"crd/{crd_name}",
                    f"--timeout={int(timeout)}s",
                    check=False,
                    timeout=timeout + 10,
                ).returncode
                == 0
            ),
            timeout,
            f"{crd_name} Established",
        )
        # kubectl caches discovery; listing the group refreshes it.
        eventually(
            lambda: (
                plural
                in kubectl.run(
                    "api-resources", "--api-group=monitoring.coreos.com", check=False
                ).stdout
            ),
            timeout,
            f"{plural} in discovery",
        )
        yield crd
    finally:
        if not there_before:
            # Gone, with every PodMonitor, before the next test's operator looks for it.
            kubectl.run(
                "delete",
                "crd",
                crd_name,
                f"--timeout={int(timeout)}s",
                check=False,
                timeout=timeout + 10,
            )
