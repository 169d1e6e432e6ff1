"""Fixtures for the end-to-end suite, and the rule that it never passes by skipping.

The cluster is the local test bed (``python -m testbed up``): a running one is reused, otherwise
the session starts one and stops it at the end. ``SPECDEPLOY_E2E_KUBECONFIG`` names any other
cluster instead (kind with KWOK and Kueue, see docs/testbed.md); the test bed is then not touched.

With ``SPECDEPLOY_E2E_REQUIRED=1`` (``make e2e`` sets it) a skipped test counts as a failure and a
run that collected no e2e test fails.

Real engines started outside the cluster come from one pool for the whole session
(``engine_pool``: see ``engine_harness.EnginePool``), keyed by pair, so every module and test
asking for the same pair shares one running engine. The tests that use it run before the
modules whose engines are the operator's pods (marker ``engine``), the engines their module
names with the marker ``engines(...)`` start in the background as the session begins (while
the cluster-only tests ahead of them run), and the pool stops its engines after its last user,
before the operator's engines need the memory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient

from cpu_share import CpuShares, read_cpu_times
from engine_cluster import (
    OperatorProcess,
    apply_crds,
    kwok_operator_config,
    operator_running,
)
from engine_harness import (
    EnginePool,
    build_tiny_models,
    engine_python,
    engine_python_path,
    pool_summary,
    tiny_models,
)
from testbed import ClusterEnv, Kubectl, down, eventually, queued_namespace, up
from testbed.kubectl import api_client
from testbed.processes import logged_failures
from testbed.prometheus_operator import served_pod_monitor_crd

REPO_ROOT = Path(__file__).resolve().parents[1]

__all__ = ["engine_python", "tiny_models"]  # session fixtures of engine_harness, for every module

REQUIRED = os.environ.get("SPECDEPLOY_E2E_REQUIRED") == "1"
_E2E_ITEMS = pytest.StashKey[int]()
_CPU = CpuShares()


def _required_failure(reason: str) -> str:
    return (
        f"SPECDEPLOY_E2E_REQUIRED=1: the end-to-end suite may not skip, but: {reason}\n"
        "Fix the missing prerequisite (make tools system-deps engine-venv) instead of skipping."
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "engines(*names): the engine pool's engines a module needs first"
    )
    config.addinivalue_line("markers", "serial: disturbs the whole test bed; runs alone")


def uses_pool(item: pytest.Item) -> bool:
    return "engine_pool" in getattr(item, "fixturenames", ())


#: Tests that disturb the whole test bed (control-plane faults, a hung Prometheus, a drained
#: node, cluster-wide CRDs installed and removed, helm releases of the CRD): under
#: `make e2e` (testbed.lanes) they run alone, after the cluster-only and the real-engine tests
#: have run side by side.
SERIAL_MODULES = frozenset(
    {
        "test_faults.py",
        "test_chart.py",
        "test_chart_pods.py",
        "test_render_vs_operator.py",
        # Freezes Prometheus until a new pod's first requests have finished.
        "test_first_scrape.py",
    }
)
SERIAL_TESTS = frozenset(
    {
        "test_draining_the_mig_node_under_a_serving_sd_makes_no_new_revision",
        "test_the_analysis_holds_while_prometheus_is_down_survives_a_killed_operator_then_promotes",
        "test_with_the_pod_monitor_crd_prometheus_scrapes_the_pair_through_the_operators_podmonitor",
        "test_a_pod_monitor_of_the_real_crd_decides_where_and_how_the_pod_is_scraped",
        # Removes Kueue's webhook for Deployments: every queued pod meanwhile bypasses quota.
        "test_quota_that_kueue_does_not_enforce_is_said_in_the_log_and_in_admitted",
    }
)


def is_serial(item: pytest.Item) -> bool:
    name = getattr(item, "originalname", item.name)
    module = item.path.name
    crd = "pod_monitor_crd" in getattr(item, "fixturenames", ())
    return module in SERIAL_MODULES or name in SERIAL_TESTS or crd


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Marks the tests that must run alone (`serial`), before `-m` selects; then moves the
    engine pool's tests just ahead of the first test of the operator's engines (marker
    `engine`), keeping their order: their engines then warm up while the cluster-only tests
    before them run, and are stopped before the operator's engines start."""
    for item in items:
        if is_serial(item):
            item.add_marker(pytest.mark.serial)
    pooled = [item for item in items if uses_pool(item)]
    if not pooled:
        return
    rest = [item for item in items if not uses_pool(item)]
    first_engine = next(
        (i for i, item in enumerate(rest) if item.get_closest_marker("engine")), len(rest)
    )
    items[:] = rest[:first_engine] + pooled + rest[first_engine:]


def pytest_collection_finish(session: pytest.Session) -> None:
    session.stash[_E2E_ITEMS] = sum(1 for item in session.items if item.get_closest_marker("e2e"))
    pooled = [item for item in session.items if uses_pool(item)]
    if pooled and not session.config.option.collectonly:
        _POOL.last_user = pooled[-1].nodeid
        names = [n for i in pooled for m in i.iter_markers("engines") for n in m.args]
        _POOL.warm_up(list(dict.fromkeys(names))[:2])


class _SessionPool:
    """The session's engine pool, made (and its first engines started) in the background."""

    def __init__(self) -> None:
        self.pool: EnginePool | None = None
        self.error: BaseException | None = None
        self.last_user: str | None = None
        self.thread: threading.Thread | None = None

    def warm_up(self, names: list[str]) -> None:
        def make() -> None:
            try:
                python = engine_python_path()
                log_dir = Path(tempfile.mkdtemp(prefix="engine-pool-"))
                self.pool = EnginePool(python, build_tiny_models(python), log_dir)
                self.pool.prestart(*names)
            except BaseException as error:  # reported by the fixture, in the test that asks
                self.error = error

        self.thread = threading.Thread(target=make, name="engine pool warm-up", daemon=True)
        self.thread.start()

    def get(self) -> EnginePool:
        if self.thread is None:
            self.warm_up([])
        assert self.thread is not None
        self.thread.join()
        if self.error is not None:
            pytest.fail(f"the engine pool could not start: {self.error}")
        assert self.pool is not None
        return self.pool

    def close(self) -> None:
        if self.pool is not None:
            print(f"\n{pool_summary(self.pool)}")
            self.pool.close()
        self.pool, self.thread = None, None


_POOL = _SessionPool()


def pytest_runtest_teardown(item: pytest.Item) -> None:
    if item.nodeid == _POOL.last_user:
        _POOL.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Any:
    """Counts the machine's CPU time over each test (setup, call and teardown) by module."""
    before, start = read_cpu_times(), time.monotonic()
    try:
        return (yield)
    finally:
        _CPU.record(item.path.stem, before, read_cpu_times(), time.monotonic() - start)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """The CPUs' busy share by module (cpu_share), and e2e-cpu.json beside the junit file."""
    if not _CPU.modules:
        return
    terminalreporter.section("CPUs busy while each module ran")
    for line in _CPU.lines():
        terminalreporter.write_line(line)
    junit = getattr(config.option, "xmlpath", None)
    if junit:
        _CPU.write(Path(junit).with_name("e2e-cpu.json"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    if REQUIRED and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = _required_failure(f"{item.nodeid} was skipped ({reason})")
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _POOL.close()
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
    kubelet_log = Path(env.run_dir) / "process-kubelet.log"
    offset = kubelet_log.stat().st_size if kubelet_log.exists() else 0
    try:
        yield env
    finally:
        # Read before `down`, which may remove the run folder.
        errors = logged_failures(kubelet_log, offset)
        if started and os.environ.get("SPECDEPLOY_KEEP_CLUSTER") != "1":
            down()
    # A test bed that failed inside (a pod's worker ended, so its pod stopped for good) shows in
    # the tests only as a timeout somewhere else: the session fails on it, by name.
    assert not errors, f"the process kubelet ({kubelet_log}) logged errors:\n" + "\n".join(errors)


@pytest.fixture(scope="session")
def engine_pool() -> EnginePool:
    """Real CPU engines on the tiny models, shared by the session and keyed by pair.

    How a test uses it: ask for `engine_pool` (do not import it) and call
    `engine_pool.get("draft-small")` (`plain`, `draft-good`, `draft-small`, `draft-bad`,
    `eagle3`), or first `engine_pool.define(name, args_for_port, served_name)` for arguments
    built elsewhere. The engine returned is ready and may have served other tests: read its
    counters before and after, never stop it. Mark the module `pytest.mark.engines(...)` with
    the names it needs first, so they start in the background when the session begins. The
    pool stops its engines after the last test that asked for it."""
    return _POOL.get()


@pytest.fixture(scope="session")
def kubeconfig(cluster: ClusterEnv) -> Path:
    """The admin kubeconfig of the cluster under test."""
    return Path(cluster.kubeconfig)


@pytest.fixture(scope="session")
def kubectl(cluster: ClusterEnv) -> Kubectl:
    """kubectl (the pinned one for the test bed) bound to the admin kubeconfig."""
    return cluster.kubectl()


@pytest.fixture(scope="session")
def k8s_api(kubeconfig: Path) -> ApiClient:
    """The Python client for the cluster under test (the one the e2e helpers read through)."""
    return api_client(kubeconfig)


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
    with queued_namespace(kubectl, name):
        yield name


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
