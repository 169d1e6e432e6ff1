"""Fixtures for the end-to-end suite, and the rule that it never passes by skipping.

The cluster is the local test bed (``python -m testbed up``): a running one is reused, otherwise
the session starts one and stops it at the end. ``SPECDEPLOY_E2E_KUBECONFIG`` names any other
cluster instead (kind with KWOK and Kueue, see docs/testbed.md); the test bed is then not touched.

With ``SPECDEPLOY_E2E_REQUIRED=1`` (``make e2e`` sets it) a skipped test counts as a failure and a
run that collected no e2e test fails.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import config as kubernetes_config

from engine_cluster import (
    OperatorProcess,
    apply_crds,
    kwok_operator_config,
    operator_running,
)
from testbed import ClusterEnv, Kubectl, create_namespace_with_queues, down, eventually, up
from testbed.prometheus_operator import served_pod_monitor_crd

REPO_ROOT = Path(__file__).resolve().parents[1]

REQUIRED = os.environ.get("SPECDEPLOY_E2E_REQUIRED") == "1"
_E2E_ITEMS = pytest.StashKey[int]()


def _required_failure(reason: str) -> str:
    return (
        f"SPECDEPLOY_E2E_REQUIRED=1: the end-to-end suite may not skip, but: {reason}\n"
        "Fix the missing prerequisite (make tools system-deps engine-venv) instead of skipping."
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    session.stash[_E2E_ITEMS] = sum(1 for item in session.items if item.get_closest_marker("e2e"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if REQUIRED and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = _required_failure(f"{item.nodeid} was skipped ({reason})")
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not REQUIRED:
        return
    collected = session.stash.get(_E2E_ITEMS, 0)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = len(reporter.stats.get("skipped", [])) if reporter else 0
    problems = []
    if collected == 0:
        problems.append("no e2e test was collected")
    if skipped:
        problems.append(f"{skipped} test(s) were skipped")
    if problems:
        message = _required_failure("; ".join(problems))
        if reporter:
            reporter.write_line("")
            reporter.write_line(message, red=True, bold=True)
        else:
            print(message)
        if session.exitstatus in (0, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _external_env(kubeconfig: str) -> ClusterEnv:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise RuntimeError("SPECDEPLOY_E2E_KUBECONFIG is set but kubectl is not on PATH")
    return ClusterEnv(
        kubeconfig=str(Path(kubeconfig).resolve()),
        api_server="",
        prometheus_url=os.environ.get("SPECDEPLOY_PROMETHEUS_URL", ""),
        prometheus_sd_dir="",
        bin_dir=str(Path(kubectl).parent),
        manifests_dir="",
        run_dir="",
        versions={},
    )


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterEnv]:
    """The cluster under test: reused when running, else started now and stopped at the end."""
    external = os.environ.get("SPECDEPLOY_E2E_KUBECONFIG")
    if external:
        yield _external_env(external)
        return
    # Started here, the components stop with this process even if it is killed.
    env, started = up(die_with_parent=True)
    try:
        yield env
    finally:
        if started and os.environ.get("SPECDEPLOY_KEEP_CLUSTER") != "1":
            down()


@pytest.fixture(scope="session")
def kubeconfig(cluster: ClusterEnv) -> Path:
    """The admin kubeconfig of the cluster under test."""
    return Path(cluster.kubeconfig)


@pytest.fixture(scope="session")
def kubectl(cluster: ClusterEnv) -> Kubectl:
    """kubectl (the pinned one for the test bed) bound to the admin kubeconfig."""
    return cluster.kubectl()


@pytest.fixture(scope="session")
def k8s_api(kubeconfig: Path) -> Any:
    """A ``kubernetes.client.ApiClient`` for the cluster under test."""
    return kubernetes_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


@pytest.fixture(scope="session")
def prometheus_url(cluster: ClusterEnv) -> str:
    """Base URL of the Prometheus that scrapes the test bed's pods."""
    if not cluster.prometheus_url:
        raise RuntimeError("no Prometheus URL: set SPECDEPLOY_PROMETHEUS_URL for this cluster")
    return cluster.prometheus_url


@pytest.fixture
def namespace(kubectl: Kubectl, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace with the LocalQueues `interactive` and `batch`; deleted afterwards."""
    stem = "".join(c if c.isalnum() else "-" for c in request.node.name.lower())[:40].strip("-")
    name = f"e2e-{stem}-{uuid.uuid4().hex[:5]}"
    create_namespace_with_queues(kubectl, name)
    try:
        yield name
    finally:
        kubectl.run("delete", "namespace", name, "--wait=false", check=False)


# --- CRDs the operator looks for -----------------------------------------------------------------


@pytest.fixture(scope="session")
def sd_crd(kubectl: Kubectl) -> None:
    """The SpeculativeDeployment CRD from crds/, served and discoverable, and the examples'
    Kueue WorkloadPriorityClasses (high, low)."""
    apply_crds(kubectl)
    queues = yaml.safe_load_all((REPO_ROOT / "examples" / "kueue" / "queues.yaml").read_text())
    kubectl.apply([d for d in queues if d and d.get("kind") == "WorkloadPriorityClass"])
    # Served once established; kubectl caches discovery, and listing the group refreshes it.
    eventually(
        lambda: (
            "speculativedeployments"
            in kubectl.run("api-resources", "--api-group=specdeploy.dev", check=False).stdout
        ),
        30,
        "the SpeculativeDeployment kind in discovery",
    )


@pytest.fixture
def pod_monitor_crd(kubectl: Kubectl) -> Iterator[None]:
    """The Prometheus Operator's PodMonitor CRD (its pinned release), for one test."""
    with served_pod_monitor_crd(kubectl):
        yield


# --- the operator ---------------------------------------------------------------------------------


@pytest.fixture
def operator(
    cluster: ClusterEnv, kubectl: Kubectl, namespace: str, tmp_path: Path, sd_crd: None
) -> Iterator[OperatorProcess]:
    """The operator watching this test's namespace (GPU pods KWOK-run, `batch` a batch queue);
    its config file is `workdir/operator.yaml`; its log is printed when a test fails."""
    config = kwok_operator_config(cluster.prometheus_url)
    running = OperatorProcess(cluster.kubeconfig, config, tmp_path, (namespace,))
    with operator_running(running, kubectl, namespace):
        yield running
