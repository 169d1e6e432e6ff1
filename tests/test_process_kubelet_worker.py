"""The process kubelet against a stand-in API server: real local processes, no cluster."""

from __future__ import annotations

import copy
import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from testbed.images import ImageEntry
from testbed.pod_network import Networking
from testbed.pod_volumes import IssuedToken
from testbed.process_children import CpuAllocator, PidLedger, read_identity, spawn_child
from testbed.process_kubelet import (
    PodGoneError,
    PodMonitors,
    ProcessKubelet,
    ScrapeTargetFiles,
    read_local_ports,
)
from testbed.sample_server import SAMPLE_SERVER as SERVER

#: An image the test bed holds (testbed.process_plan.LOCAL_IMAGE_REPOSITORIES).
IMAGE = "specdeploy/engine:test"


class FakePodApi:
    """Keeps pods in memory; a status patch replaces the status, as a merge patch would."""

    def __init__(self) -> None:
        self.services: list[dict[str, Any]] = []
        self.pods: dict[str, dict[str, Any]] = {}
        self.deleted: list[str] = []
        self.lock = threading.Lock()
        self.version = 1
        self.objects: dict[tuple[str, str, str], dict[str, str]] = {}
        self.tokens_issued = 0

    def add(self, pod: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.version += 1
            pod["metadata"]["resourceVersion"] = str(self.version)
            self.pods[pod["metadata"]["name"]] = pod
            return copy.deepcopy(pod)

    def status_of(self, name: str) -> dict[str, Any]:
        with self.lock:
            return copy.deepcopy(self.pods[name].get("status") or {})

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        with self.lock:
            return [copy.deepcopy(p) for p in self.pods.values()], str(self.version)

    def watch_pods(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        return iter(())

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        with self.lock:
            if name not in self.pods:
                raise PodGoneError(name)
            return copy.deepcopy(self.pods[name])

    def patch_pod_status(self, pod: dict[str, Any], status: Mapping[str, Any]) -> dict[str, Any]:
        name = pod["metadata"]["name"]
        with self.lock:
            if name not in self.pods:
                raise PodGoneError(name)
            stored = self.pods[name]
            self.version += 1
            stored["metadata"]["resourceVersion"] = str(self.version)
            stored["status"] = json.loads(json.dumps(status))
            return copy.deepcopy(stored)

    def delete_pod_now(self, pod: dict[str, Any]) -> None:
        with self.lock:
            self.pods.pop(pod["metadata"]["name"], None)
            self.deleted.append(pod["metadata"]["name"])

    def read_object_data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return self.objects.get((kind, namespace, name))

    def request_token(self, pod: dict[str, Any], audience: str | None, seconds: int) -> IssuedToken:
        self.tokens_issued += 1
        return IssuedToken(f"token-{self.tokens_issued}-for-{pod['metadata']['name']}", seconds)

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        return copy.deepcopy(self.services)


class FakePodMonitorApi:
    """PodMonitors in memory; `monitors` None means their CRD is not served."""

    def __init__(self) -> None:
        self.monitors: list[dict[str, Any]] | None = None
        self.events: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()

    def list_pod_monitors(self) -> tuple[list[dict[str, Any]], str] | None:
        if self.monitors is None:
            return None
        return copy.deepcopy(self.monitors), "1"

    def watch_pod_monitors(self, resource_version: str) -> Iterator[tuple[str, dict[str, Any]]]:
        if self.monitors is None:
            raise ConnectionError("the PodMonitor CRD is gone")
        try:
            yield self.events.get(timeout=0.2)
        except queue.Empty:
            return


def local_pod(name: str, container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "labels": {"specdeploy.dev/name": "web", "specdeploy.dev/revision": "abc123"},
            "annotations": {
                "specdeploy.dev/local-process": "true",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "8000",
            },
        },
        "spec": {"nodeName": "gpu-node-1", "containers": [container], **spec},
        "status": {"phase": "Pending"},
    }


def wait_for(check: Callable[[], Any], seconds: float = 20.0) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(0.1)
    raise AssertionError(f"timed out after {seconds}s")


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[tuple[ProcessKubelet, FakePodApi, Path]]:
    api = FakePodApi()
    sd_dir = tmp_path / "sd"
    instance = ProcessKubelet(api, tmp_path / "run", sd_dir)
    yield instance, api, sd_dir
    instance.stop()


def condition(status: dict[str, Any], type_: str) -> str | None:
    return next((c["status"] for c in status.get("conditions") or [] if c["type"] == type_), None)


def test_server_pod_gets_ready_registered_and_stopped_on_delete(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, sd_dir = kubelet
    tmp_run = sd_dir.parent / "run"
    container = {
        "name": "web",
        "image": IMAGE,
        "command": [sys.executable, "-c", SERVER],
        "args": ["$(SPECDEPLOY_HOST)", "$(SPECDEPLOY_PORT)"],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
    }
    instance.observe("ADDED", api.add(local_pod("web", container)))

    status = wait_for(lambda: (s := api.status_of("web")) and condition(s, "Ready") == "True" and s)
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.0.1"
    web = status["containerStatuses"][0]
    assert web["ready"] is True
    assert "running" in web["state"]
    pid = int(web["containerID"].removeprefix("process://"))

    (group,) = json.loads((sd_dir / "team-a_web_uid-web.json").read_text())
    assert group["labels"]["specdeploy_dev_revision"] == "abc123"
    assert group["labels"]["pod"] == "web"
    assert group["labels"]["job"] == "kubernetes-pods"
    target = group["targets"][0]
    assert read_local_ports(tmp_run, api.read_pod("team-a", "web")) == {
        "web": int(target.split(":")[1])
    }
    with urllib.request.urlopen(f"http://{target}/metrics", timeout=5) as response:
        assert response.read().startswith(b"demo_requests_total")

    deleting = api.read_pod("team-a", "web")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["metadata"]["deletionGracePeriodSeconds"] = 5
    instance.observe("MODIFIED", deleting)
    wait_for(lambda: "web" in api.deleted)
    assert read_identity(pid) is None
    assert not (sd_dir / "team-a_web_uid-web.json").exists()


def test_exit_code_and_termination_message_land_in_status(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, _ = kubelet
    script = (
        "import os, sys; "
        "path = os.environ['SPECDEPLOY_TERMINATION_LOG']; "
        "open(path, 'w').write('pair refused: vocab differs\\n'); "
        "sys.exit(3)"
    )
    container = {"name": "engine", "image": IMAGE, "command": [sys.executable, "-c", script]}
    instance.observe("ADDED", api.add(local_pod("refused", container, restartPolicy="Never")))

    status = wait_for(lambda: (s := api.status_of("refused")).get("phase") == "Failed" and s)
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert terminated["message"] == "pair refused: vocab differs\n"
    assert condition(status, "Ready") == "False"


def test_each_container_run_has_a_temporary_folder_of_its_own_removed_when_it_ends(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    """As a container's /tmp: vLLM's engines leave their IPC sockets in the temporary folder,
    which piled up in the host's /tmp by the hundred in a day of test runs."""
    instance, api, _ = kubelet
    script = (
        "import os, tempfile; "
        "folder = tempfile.gettempdir(); "
        "open(os.path.join(folder, 'left-behind'), 'w').write('x'); "
        "open(os.environ['SPECDEPLOY_TERMINATION_LOG'], 'w').write(folder)"
    )
    command = [sys.executable, "-c", script]
    own = {"name": "engine", "image": IMAGE, "command": command}
    chosen = {**own, "env": [{"name": "TMPDIR", "value": str(instance.pods_dir)}]}
    instance.observe("ADDED", api.add(local_pod("own", own, restartPolicy="Never")))
    instance.observe("ADDED", api.add(local_pod("chosen", chosen, restartPolicy="Never")))

    def folder_of(name: str) -> str | None:
        status = api.status_of(name)
        if status.get("phase") != "Succeeded":
            return None
        message: str = status["containerStatuses"][0]["state"]["terminated"]["message"]
        return message

    folder = Path(wait_for(lambda: folder_of("own")))
    assert folder.name.startswith("pk-"), folder
    assert folder.parent == Path(tempfile.gettempdir())
    assert not folder.exists(), "the folder outlived the container"
    # A TMPDIR the pod's spec sets is the container's to keep.
    assert wait_for(lambda: folder_of("chosen")) == str(instance.pods_dir)
    assert (instance.pods_dir / "left-behind").exists()


def test_crashing_container_enters_crash_loop_back_off(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, _ = kubelet
    container = {"name": "engine", "image": IMAGE, "command": ["false"]}
    instance.observe("ADDED", api.add(local_pod("crash", container)))

    def backing_off() -> dict[str, Any] | None:
        statuses = api.status_of("crash").get("containerStatuses") or []
        waiting = statuses[0]["state"].get("waiting", {}) if statuses else {}
        return statuses[0] if waiting.get("reason") == "CrashLoopBackOff" else None

    engine = wait_for(backing_off)
    assert engine["lastState"]["terminated"]["exitCode"] == 1
    assert api.status_of("crash")["phase"] == "Running"


def test_missing_program_is_a_start_error(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, _ = kubelet
    container = {"name": "engine", "image": IMAGE, "command": ["/nonexistent/engine"]}
    instance.observe("ADDED", api.add(local_pod("missing", container, restartPolicy="Never")))
    status = wait_for(lambda: (s := api.status_of("missing")).get("phase") == "Failed" and s)
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (128, "StartError")


def test_leftovers_of_a_previous_instance_are_killed_and_nothing_else(tmp_path: Path) -> None:
    ledger = PidLedger(tmp_path / "pids")
    ours = spawn_child(
        ["sleep", "300"],
        env=os.environ,
        cwd=tmp_path,
        log_path=tmp_path / "a.log",
        ledger=ledger,
        owner="team-a/x/engine",
    )
    stranger = subprocess.Popen(["sleep", "301"])
    try:
        identity = read_identity(stranger.pid)
        assert identity is not None
        ledger.record(identity, ["sleep", "999"], owner="team-a/y/engine")  # other command line

        killed = PidLedger(tmp_path / "pids").kill_leftovers()
        assert killed == [ours.pid]
        ours.popen.wait(timeout=5)
        assert stranger.poll() is None
        assert not list((tmp_path / "pids").glob("*.json"))
    finally:
        stranger.kill()
        stranger.wait()


def test_children_die_with_the_process_kubelet(tmp_path: Path) -> None:
    # A stand-in process kubelet that starts one child and reports its pid, then is killed.
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import os, sys, time
                from pathlib import Path
                from testbed.process_children import PidLedger, spawn_child
                folder = Path({str(tmp_path)!r})
                child = spawn_child(["sleep", "300"], env=os.environ, cwd=folder,
                                    log_path=folder / "c.log", ledger=PidLedger(folder / "pids"),
                                    owner="x")
                print(child.pid, flush=True)
                time.sleep(300)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    assert read_identity(child_pid) is not None
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    wait_for(lambda: read_identity(child_pid) is None, seconds=5)


def test_target_files_of_a_killed_instance_are_removed_and_nothing_else(tmp_path: Path) -> None:
    stale = tmp_path / "team-a_web-0_0b7c6f5e-2d1a-4c59-9f4e-3a2b1c0d9e8f.json"
    foreign = tmp_path / "node-exporter.json"
    stale.write_text("[]")
    foreign.write_text("[]")
    assert ScrapeTargetFiles(tmp_path).remove_leftovers() == [stale.name]
    assert foreign.exists()


def test_a_restarted_process_kubelet_restarts_containers_it_did_not_adopt(
    tmp_path: Path,
) -> None:
    api = FakePodApi()
    container = {"name": "web", "image": IMAGE, "command": ["sleep", "300"]}
    first = ProcessKubelet(api, tmp_path / "run", tmp_path / "sd")
    first.observe("ADDED", api.add(local_pod("web", container)))
    status = wait_for(lambda: (s := api.status_of("web")).get("phase") == "Running" and s)
    pid = int(status["containerStatuses"][0]["containerID"].removeprefix("process://"))

    first.stop()
    assert read_identity(pid) is None
    stopped = api.status_of("web")["containerStatuses"][0]
    assert stopped["state"]["terminated"]["exitCode"] == 143  # SIGTERM
    assert not stopped["ready"]

    second = ProcessKubelet(api, tmp_path / "run", tmp_path / "sd")
    try:
        second.resync(api.list_pods()[0])
        again = wait_for(
            lambda: (
                (s := api.status_of("web")["containerStatuses"][0])["restartCount"] == 1
                and "running" in s["state"]
                and s
            )
        )
        assert again["lastState"]["terminated"]["exitCode"] == 143
    finally:
        second.stop()


POD_MONITOR: dict[str, Any] = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "PodMonitor",
    "metadata": {"name": "web", "namespace": "team-a", "uid": "uid-pm", "resourceVersion": "2"},
    "spec": {
        "selector": {"matchLabels": {"specdeploy.dev/name": "web"}},
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
        "podTargetLabels": ["specdeploy.dev/revision"],
    },
}


def test_targets_follow_pod_monitors_as_they_come_and_go(tmp_path: Path) -> None:
    api, monitor_api = FakePodApi(), FakePodMonitorApi()
    monitors = PodMonitors(monitor_api)
    sd_dir = tmp_path / "sd"
    instance = ProcessKubelet(api, tmp_path / "run", sd_dir, monitors)
    watcher = threading.Thread(target=monitors.watch_forever, args=(instance.stopping,))
    watcher.start()
    target_file = sd_dir / "team-a_web_uid-web.json"

    def job() -> str | None:
        if not target_file.exists():
            return None
        groups = json.loads(target_file.read_text())
        return "|".join(sorted(g["labels"]["job"] for g in groups))

    try:
        container = {
            "name": "web",
            "image": IMAGE,
            "command": [sys.executable, "-c", SERVER, "$(SPECDEPLOY_HOST)", "$(SPECDEPLOY_PORT)"],
            "ports": [{"name": "http", "containerPort": 8000}],
        }
        instance.observe("ADDED", api.add(local_pod("web", container)))
        # No CRD: the annotations.
        assert wait_for(lambda: job() == "kubernetes-pods")

        # The CRD and a PodMonitor that selects the pod: only the PodMonitor's target.
        monitor_api.monitors = [copy.deepcopy(POD_MONITOR)]
        assert wait_for(lambda: job() == "team-a/web", seconds=10)
        (group,) = json.loads(target_file.read_text())
        assert set(group["labels"]) == {
            "namespace", "pod", "container", "endpoint", "job", "specdeploy_dev_revision",
            "__metrics_path__",
        }  # fmt: skip

        # The PodMonitor now names a port the pod lacks: not scraped at all.
        wrong = copy.deepcopy(POD_MONITOR)
        wrong["spec"]["podMetricsEndpoints"] = [{"port": "metrics"}]
        monitor_api.events.put(("MODIFIED", wrong))
        assert wait_for(lambda: not target_file.exists(), seconds=10)

        # The CRD goes: back to the annotations.
        monitor_api.monitors = None
        assert wait_for(lambda: job() == "kubernetes-pods", seconds=10)
    finally:
        instance.stopping.set()
        instance.stop()
        watcher.join(timeout=10)


def test_the_cpu_allocator_gives_the_least_taken_cpu_and_none_on_one_cpu() -> None:
    cpus = CpuAllocator({0, 1, 2})
    assert [cpus.take(), cpus.take(), cpus.take(), cpus.take()] == [0, 1, 2, 0]
    cpus.give_back(1)
    assert cpus.taken() == {0: 2, 1: 0, 2: 1}
    assert cpus.take() == 1
    cpus.give_back(None)  # an unpinned process ended
    cpus.give_back(7)  # not ours
    assert cpus.taken() == {0: 2, 1: 1, 2: 1}
    # With one CPU there is nothing to spread over: nobody is pinned.
    single = CpuAllocator({0})
    assert single.take() is None
    assert single.taken() == {}


def _allowed_cpus(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(
        line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list")
    )


def test_each_container_runs_on_a_cpu_of_its_own_and_frees_it_when_it_ends(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, _ = kubelet
    machine = sorted(os.sched_getaffinity(0))
    sleeper = {
        "name": "engine",
        "image": IMAGE,
        "command": [sys.executable, "-c", "import time; time.sleep(120)"],
    }

    def started(name: str) -> int:
        status = wait_for(lambda: (s := api.status_of(name)).get("phase") == "Running" and s)
        return int(status["containerStatuses"][0]["containerID"].removeprefix("process://"))

    instance.observe("ADDED", api.add(local_pod("first", dict(sleeper))))
    first = started("first")
    instance.observe("ADDED", api.add(local_pod("second", dict(sleeper))))
    second = started("second")
    if len(machine) < 2:  # nothing to spread over: both run anywhere
        assert _allowed_cpus(first) == _allowed_cpus(second) == _allowed_cpus(os.getpid())
        return
    # Each process, and what it starts, is held to one CPU, a different one each.
    assert {_allowed_cpus(first), _allowed_cpus(second)} == {str(machine[0]), str(machine[1])}
    assert instance.cpus.taken()[machine[0]] == instance.cpus.taken()[machine[1]] == 1

    # The first pod's CPU is free again once it is deleted; the next container gets it.
    deleting = api.read_pod("team-a", "first")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["metadata"]["deletionGracePeriodSeconds"] = 1
    instance.observe("MODIFIED", deleting)
    wait_for(lambda: "first" in api.deleted)
    assert instance.cpus.taken()[machine[0]] == 0
    instance.observe("ADDED", api.add(local_pod("third", dict(sleeper))))
    assert _allowed_cpus(started("third")) == str(machine[0])


def test_a_pod_being_deleted_gives_its_cpu_back_while_its_process_still_drains(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    # A canary's pod started while the last stable's pod drains: it gets the draining pod's CPU,
    # not the serving engine's.
    instance, api, _ = kubelet
    machine = sorted(os.sched_getaffinity(0))
    if len(machine) < 2:
        pytest.skip("one CPU: nothing is pinned")
    sleeper = {
        "name": "engine",
        "image": IMAGE,
        "command": [sys.executable, "-c", "import time; time.sleep(120)"],
    }
    draining = {**sleeper, "lifecycle": {"preStop": {"sleep": {"seconds": 8}}}}

    def started(name: str) -> int:
        status = wait_for(lambda: (s := api.status_of(name)).get("phase") == "Running" and s)
        return int(status["containerStatuses"][0]["containerID"].removeprefix("process://"))

    instance.observe("ADDED", api.add(local_pod("serving", dict(sleeper))))
    serving = started("serving")
    instance.observe("ADDED", api.add(local_pod("old", draining)))
    old = started("old")
    assert (_allowed_cpus(serving), _allowed_cpus(old)) == (str(machine[0]), str(machine[1]))

    deleting = api.read_pod("team-a", "old")
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["metadata"]["deletionGracePeriodSeconds"] = 30
    instance.observe("MODIFIED", deleting)
    wait_for(lambda: instance.cpus.taken()[machine[1]] == 0)
    instance.observe("ADDED", api.add(local_pod("new", dict(sleeper))))
    new = started("new")
    assert read_identity(old) is not None, "the old pod's process still runs (its preStop)"
    assert _allowed_cpus(new) == str(machine[1])
    wait_for(lambda: "old" in api.deleted)
    assert instance.cpus.taken() == {machine[0]: 1, machine[1]: 1, **{c: 0 for c in machine[2:]}}


def _waiting_reason(api: FakePodApi, name: str) -> str | None:
    statuses = api.status_of(name).get("containerStatuses") or []
    return statuses[0]["state"].get("waiting", {}).get("reason") if statuses else None


def test_an_image_the_test_bed_lacks_fails_to_pull_and_backs_off(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, _ = kubelet
    container = {"name": "engine", "image": "registry.invalid/engine:1", "command": ["true"]}
    instance.observe("ADDED", api.add(local_pod("nopull", container)))
    seen = set()

    def both() -> bool:
        seen.add(_waiting_reason(api, "nopull"))
        return {"ErrImagePull", "ImagePullBackOff"} <= seen

    wait_for(both, seconds=10)
    engine = api.status_of("nopull")["containerStatuses"][0]
    assert engine["state"]["waiting"]["message"].startswith(
        'Back-off pulling image "registry.invalid/engine:1": ErrImagePull: failed to pull image'
    )
    assert engine["restartCount"] == 0
    assert "containerID" not in engine
    assert api.status_of("nopull")["phase"] == "Pending"


MEMORY_HOG = "import time; hog = bytearray(256 * 1024 * 1024); time.sleep(60)"


@pytest.mark.parametrize(("limit", "killed"), [("128Mi", True), ("512Mi", False)])
def test_a_container_over_its_memory_limit_is_oom_killed(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path], limit: str, killed: bool
) -> None:
    instance, api, _ = kubelet
    container = {
        "name": "engine",
        "image": IMAGE,
        "command": [sys.executable, "-c", MEMORY_HOG],
        "resources": {"limits": {"memory": limit}},
    }
    instance.observe("ADDED", api.add(local_pod("hog", container, restartPolicy="Never")))
    if killed:
        status = wait_for(lambda: (s := api.status_of("hog")).get("phase") == "Failed" and s)
        terminated = status["containerStatuses"][0]["state"]["terminated"]
        assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)
        return
    wait_for(lambda: api.status_of("hog").get("phase") == "Running")
    time.sleep(3)  # a few ticks of the memory check, with the 256 MiB touched
    assert "running" in api.status_of("hog")["containerStatuses"][0]["state"]


ENV_DUMP = (
    "import json, os, time; json.dump(dict(os.environ), open('env.json', 'w')); time.sleep(60)"
)


@pytest.mark.parametrize("links", [None, True, False])
def test_service_links_reach_the_container_unless_turned_off(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path], links: bool | None
) -> None:
    instance, api, sd_dir = kubelet
    api.services = [
        {
            "metadata": {"namespace": "team-a", "name": "vllm"},
            "spec": {"clusterIP": "10.96.0.7", "ports": [{"name": "http", "port": 8000}]},
        }
    ]
    container = {"name": "engine", "image": IMAGE, "command": [sys.executable, "-c", ENV_DUMP]}
    spec = {} if links is None else {"enableServiceLinks": links}
    pod = api.add(local_pod("links", container, **spec))
    instance.observe("ADDED", pod)
    dump = sd_dir.parent / "run" / "pods" / "team-a_links_uid-links" / "env.json"
    env = wait_for(lambda: dump.exists() and dump.stat().st_size and json.loads(dump.read_text()))
    if links is False:
        assert "VLLM_PORT" not in env
    else:
        assert env["VLLM_PORT"] == "tcp://10.96.0.7:8000"


TERM_LOGGER = textwrap.dedent(
    """
    import signal, sys, time
    def stop(*_):
        open('events', 'a').write(f'term {time.time()}\\n')
        time.sleep(float(sys.argv[1]))
        open('events', 'a').write(f'done {time.time()}\\n')
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open('ready', 'w').write('')
    time.sleep(300)
    """
)


def _run_then_delete(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
    name: str,
    container: dict[str, Any],
    grace: int,
) -> tuple[float, dict[str, float]]:
    """Runs the pod until its process is up, deletes it with `grace`, waits for the deletion to
    finish; returns when it was deleted and the times of what its process logged."""
    instance, api, sd_dir = kubelet
    folder = sd_dir.parent / "run" / "pods" / f"team-a_{name}_uid-{name}"
    instance.observe("ADDED", api.add(local_pod(name, container)))
    wait_for((folder / "ready").exists)
    deleting = api.read_pod("team-a", name)
    deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    deleting["metadata"]["deletionGracePeriodSeconds"] = grace
    deleted_at = time.time()
    instance.observe("MODIFIED", deleting)
    wait_for(lambda: name in api.deleted, seconds=grace + 10)
    lines = (folder / "events").read_text().splitlines()
    return deleted_at, {what: float(when) for what, when in map(str.split, lines)}


def test_pre_stop_runs_before_sigterm_and_the_grace_period_is_honoured(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    container = {
        "name": "engine",
        "image": IMAGE,
        # Takes 11 s to stop after SIGTERM: beyond the 10 s the process kubelet once allowed.
        "command": [sys.executable, "-c", TERM_LOGGER, "11"],
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        sys.executable,
                        "-c",
                        "import time; time.sleep(2); "
                        "open('events', 'a').write(f'preStop {time.time()}\\n')",
                    ]
                }
            }
        },
    }
    deleted_at, events = _run_then_delete(kubelet, "slow", container, grace=30)
    assert deleted_at + 2.0 <= events["preStop"] <= events["term"]
    # It stopped by itself, 11 s after SIGTERM: not killed at 10 s.
    assert events["done"] - events["term"] >= 11.0


def test_a_sleep_pre_stop_delays_sigterm(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    container = {
        "name": "engine",
        "image": IMAGE,
        "command": [sys.executable, "-c", TERM_LOGGER, "0"],
        "lifecycle": {"preStop": {"sleep": {"seconds": 3}}},
    }
    deleted_at, events = _run_then_delete(kubelet, "sleepy", container, grace=30)
    assert events["term"] - deleted_at >= 3.0


def test_a_failing_startup_probe_kills_and_restarts_the_container(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    instance, api, _ = kubelet
    container = {
        "name": "engine",
        "image": IMAGE,
        "command": ["sleep", "300"],
        "ports": [{"name": "http", "containerPort": 8000}],
        # Nothing listens: it fails for 2 x 1 s, then the container is killed.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 2,
        },
    }
    instance.observe(
        "ADDED", api.add(local_pod("nostart", container, terminationGracePeriodSeconds=1))
    )
    engine = wait_for(
        lambda: (
            (s := api.status_of("nostart").get("containerStatuses")) and s[0]["lastState"] and s[0]
        )
    )
    assert engine["lastState"]["terminated"]["exitCode"] == 143
    assert engine["started"] is False


IN_CLUSTER_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def kube_api_access_volume() -> dict[str, Any]:
    """The volume the ServiceAccount admission plugin adds to a pod that automounts a token."""
    return {
        "name": "kube-api-access-x1",
        "projected": {
            "defaultMode": 420,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ],
        },
    }


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces with overlays need root")
def test_an_image_without_command_runs_its_entry_point_with_volumes_at_their_mount_paths(
    tmp_path: Path,
) -> None:
    """The chart's operator pod in small: no command (the image map's entry point), its args,
    a ConfigMap mounted read-only at a path the host does not have, the ServiceAccount token
    where in-cluster clients read it, an emptyDir, and kubelet's KUBERNETES_SERVICE_* env."""
    api = FakePodApi()
    api.objects[("ConfigMap", "team-a", "settings")] = {"config.yaml": "interval: 7\n"}
    api.objects[("ConfigMap", "team-a", "kube-root-ca.crt")] = {"ca.crt": "CA PEM\n"}
    script = textwrap.dedent(
        f"""
        import os, pathlib, sys
        out = pathlib.Path(os.environ["OUT"])
        sa = pathlib.Path("{IN_CLUSTER_PATH}")
        lines = [
            " ".join(sys.argv[1:]),
            pathlib.Path("/etc/specdeploy-test/config.yaml").read_text().strip(),
            (sa / "token").read_text(), (sa / "ca.crt").read_text().strip(),
            (sa / "namespace").read_text(),
            os.environ["KUBERNETES_SERVICE_HOST"] + ":" + os.environ["KUBERNETES_SERVICE_PORT"],
            os.environ["FROM_IMAGE"],
        ]
        try:
            pathlib.Path("/etc/specdeploy-test/x").write_text("x")
            lines.append("config writable")
        except OSError:
            lines.append("config read-only")
        pathlib.Path("/var/cache/specdeploy-test/y").write_text("y")
        out.write_text("\\n".join(lines) + "\\n")
        """
    )
    program = tmp_path / "program.py"
    program.write_text(script)
    images = {
        "example/operator:1": ImageEntry(
            entrypoint=(sys.executable, str(program)), cmd=("default",), env={"FROM_IMAGE": "yes"}
        )
    }
    out = tmp_path / "out.txt"
    container = {
        "name": "operator",
        "image": "example/operator:1",
        "args": ["run", "--config", "/etc/specdeploy-test/config.yaml"],
        "env": [{"name": "OUT", "value": str(out)}],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/specdeploy-test", "readOnly": True},
            {"name": "kube-api-access-x1", "mountPath": IN_CLUSTER_PATH, "readOnly": True},
            {"name": "scratch", "mountPath": "/var/cache/specdeploy-test"},
        ],
    }
    pod = local_pod(
        "operator-0",
        container,
        restartPolicy="Never",
        serviceAccountName="operator",
        volumes=[
            {"name": "config", "configMap": {"name": "settings"}},
            kube_api_access_volume(),
            {"name": "scratch", "emptyDir": {}},
        ],
    )
    kubelet = ProcessKubelet(
        api,
        tmp_path / "run",
        tmp_path / "sd",
        images=images,
        service_env={"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"},
    )
    try:
        kubelet.resync([api.add(pod)])
        wait_for(lambda: api.status_of("operator-0").get("phase") == "Succeeded")
    finally:
        kubelet.stop()
    assert out.read_text().splitlines() == [
        "run --config /etc/specdeploy-test/config.yaml",
        "interval: 7",
        "token-1-for-operator-0",
        "CA PEM",
        "team-a",
        "127.0.0.1:6443",
        "yes",
        "config read-only",
    ]
    assert not Path("/etc/specdeploy-test").exists(), "a mount point was made on the host"
    (folder,) = (tmp_path / "run" / "pods").iterdir()
    assert (folder / "volumes" / "scratch" / "y").read_text() == "y"


@pytest.mark.skipif(os.geteuid() != 0, reason="mount namespaces with overlays need root")
def test_an_empty_dir_over_the_folder_the_pod_and_its_image_live_in_hides_neither(
    tmp_path: Path,
) -> None:
    """The chart's operator pod mounts an emptyDir at /tmp; with the project checked out under
    /tmp (a clone in CI, pytest's tmp_path here) that volume lies over the pod's own volume
    folders and over the folders standing in for the image's files. A runtime resolves its
    mounts' sources before it mounts anything, and a volume never hides an image's files: the
    ConfigMap is still read at its mount path, the program still runs, and what it writes to
    /tmp lands in the emptyDir."""
    assert tmp_path.is_relative_to("/tmp"), tmp_path
    api = FakePodApi()
    api.objects[("ConfigMap", "team-a", "settings")] = {"config.yaml": "interval: 7\n"}
    image_files = tmp_path / "image"
    image_files.mkdir()
    program = image_files / "program.py"
    program.write_text(
        "import pathlib, sys\n"
        "config = pathlib.Path('/etc/specdeploy-test/config.yaml').read_text()\n"
        "pathlib.Path('/tmp/out.txt').write_text(' '.join(sys.argv[1:]) + ': ' + config)\n"
    )
    images = {
        "example/operator:1": ImageEntry(
            # As the operator image's entry in the map: the interpreter's environment is one of
            # the image's files, so a clone under /tmp (sys.prefix inside the emptyDir's path)
            # still runs.
            entrypoint=(sys.executable, str(program)),
            files=(str(image_files), sys.prefix),
        )
    }
    container = {
        "name": "operator",
        "image": "example/operator:1",
        "args": ["run"],
        "volumeMounts": [
            {"name": "config", "mountPath": "/etc/specdeploy-test", "readOnly": True},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod = local_pod(
        "operator-0",
        container,
        restartPolicy="Never",
        volumes=[
            {"name": "config", "configMap": {"name": "settings"}},
            {"name": "tmp", "emptyDir": {}},
        ],
    )
    kubelet = ProcessKubelet(api, tmp_path / "run", tmp_path / "sd", images=images)
    try:
        kubelet.resync([api.add(pod)])
        wait_for(lambda: api.status_of("operator-0").get("phase") in ("Succeeded", "Failed"))
    finally:
        kubelet.stop()
    (folder,) = (tmp_path / "run" / "pods").iterdir()
    log = "".join(p.read_text() for p in folder.glob("*.log"))
    assert api.status_of("operator-0")["phase"] == "Succeeded", log
    assert (folder / "volumes" / "tmp" / "out.txt").read_text() == "run: interval: 7\n"
    assert not Path("/etc/specdeploy-test").exists(), "a mount point was made on the host"


def test_an_image_the_map_does_not_know_cannot_run_without_a_command(tmp_path: Path) -> None:
    api = FakePodApi()
    pod = local_pod("unknown-0", {"name": "app", "image": "specdeploy/engine:1"})
    kubelet = ProcessKubelet(api, tmp_path / "run", tmp_path / "sd")
    try:
        kubelet.resync([api.add(pod)])

        def waiting_reason() -> str | None:
            statuses = api.status_of("unknown-0").get("containerStatuses") or [{}]
            return ((statuses[0].get("state") or {}).get("waiting") or {}).get("message")

        message = wait_for(waiting_reason)
    finally:
        kubelet.stop()
    assert "no entry point for its image 'specdeploy/engine:1'" in message


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_pods_with_a_network_of_their_own_listen_on_one_port_side_by_side_and_reach_a_service(
    tmp_path: Path,
) -> None:
    """Two replicas of an image that listens on a fixed port (as the operator does on 8080)
    both run and get Ready; a third pod reaches them through a Service's name, and reaches a
    host port it was given (as the API server's)."""
    api = FakePodApi()
    host_server = subprocess.Popen(
        [sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert host_server.stdout is not None
        host_port = int(host_server.stdout.readline().split(" port ")[1].split(" ")[0])
        networking = Networking(tmp_path / "hosts", (host_port,))
        web = ImageEntry(
            entrypoint=(sys.executable, "-m", "http.server", "18080", "--bind", "0.0.0.0"),
            own_network=True,
        )
        out = tmp_path / "client.out"
        fetch = textwrap.dedent(
            f"""
            import sys, time, urllib.request
            answers = []
            for url in sys.argv[1:]:
                for _ in range(100):
                    try:
                        answers.append(str(urllib.request.urlopen(url, timeout=2).status))
                        break
                    except OSError:
                        time.sleep(0.1)
                else:
                    answers.append("unreachable")
            open({str(out)!r}, "w").write(" ".join(answers))
            """
        )
        client = ImageEntry(entrypoint=(sys.executable, "-c", fetch), own_network=True)
        kubelet = ProcessKubelet(
            api,
            tmp_path / "run",
            tmp_path / "sd",
            images={"example/web:1": web, "example/client:1": client},
            networking=networking,
        )
        networking.observe_services(
            [
                {
                    "metadata": {"name": "web", "namespace": "team-a"},
                    "spec": {
                        "clusterIP": "10.96.3.7",
                        "selector": {"app": "web"},
                        "ports": [{"port": 80, "targetPort": "http"}],
                    },
                }
            ]
        )
        probe = {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1}
        replicas = []
        for name in ("web-0", "web-1"):
            pod = local_pod(
                name,
                {
                    "name": "web",
                    "image": "example/web:1",
                    "ports": [{"name": "http", "containerPort": 18080}],
                    "readinessProbe": probe,
                },
            )
            pod["metadata"]["labels"]["app"] = "web"
            replicas.append(api.add(pod))
        kubelet.resync(replicas)
        for name in ("web-0", "web-1"):

            def ready(name: str = name) -> bool:
                return condition(api.status_of(name), "Ready") == "True"

            wait_for(ready)
        ports = {
            read_local_ports(tmp_path / "run", pod)["web"]  # type: ignore[index]
            for pod in replicas
        }
        assert len(ports) == 2, "the replicas share a host port"
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as answer:
                assert answer.status == 200
        caller = api.add(
            local_pod(
                "client-0",
                {
                    "name": "client",
                    "image": "example/client:1",
                    "args": ["http://web.team-a.svc/", f"http://127.0.0.1:{host_port}/"],
                },
                restartPolicy="Never",
            )
        )
        kubelet.observe("ADDED", caller)
        wait_for(lambda: api.status_of("client-0").get("phase") == "Succeeded", 30)
        kubelet.stop()
    finally:
        host_server.kill()
        host_server.wait()
    assert out.read_text() == "200 200"
    assert "127.96.3.7\tweb.team-a.svc.cluster.local" in (tmp_path / "hosts").read_text()


FAMILY = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    def stop(*_):
        time.sleep(1)
        alive = child.poll() is None
        open('events', 'a').write(f'child-alive-at-term {int(alive)}\\n')
        sys.exit(0)
    signal.signal(signal.SIGTERM, stop)
    open('child', 'w').write(str(child.pid))
    open('ready', 'w').write('')
    time.sleep(300)
    """
)


def test_sigterm_goes_to_the_main_process_and_the_rest_is_killed_at_the_end(
    kubelet: tuple[ProcessKubelet, FakePodApi, Path],
) -> None:
    """As a container runtime signals PID 1 only: the main process's children keep running
    while it handles SIGTERM (vLLM's workers while its server drains), and are killed once it
    exits."""
    container = {"name": "engine", "image": IMAGE, "command": [sys.executable, "-c", FAMILY]}
    _, events = _run_then_delete(kubelet, "family", container, grace=30)
    assert events["child-alive-at-term"] == 1, "the child got the main process's SIGTERM"
    folder = kubelet[2].parent / "run" / "pods" / "team-a_family_uid-family"
    child = int((folder / "child").read_text())
    wait_for(lambda: read_identity(child) is None, seconds=5)
