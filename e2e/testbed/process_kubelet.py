"""The process kubelet: runs pods annotated `specdeploy.dev/local-process: "true"` as local
processes, writes their real status, and registers them with Prometheus (file service discovery)
where a cluster's Prometheus would find them: through the PodMonitors that select them, or their
`prometheus.io/*` annotations.

    python -m testbed.process_kubelet --kubeconfig KUBECONFIG --run-dir DIR --sd-dir DIR

One thread watches pods in all namespaces, another the PodMonitors (while their CRD is served);
each pod it runs gets a worker thread that pulls (or refuses) its images, starts its containers
with kubelet's environment (service links included), probes them, holds them to their memory
limits, applies the restart policy, writes the status and its scrape targets and, when the pod
is deleted, runs the preStop hooks, stops the processes within the grace period and finishes the
deletion. The decisions are in process_plan; the child processes are
handled by process_children. The contract is in docs/contracts.md.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import http.client
import json
import logging
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.watch import watch as kube_watch

from testbed.images import ImageEntry, read_image_map
from testbed.pod_network import (
    Networking,
    PodNetwork,
    Route,
    socket_in_namespace,
    unconnected_socket,
)
from testbed.pod_volumes import IssuedToken, PlannedMount, PodVolumes, container_mounts
from testbed.ports import free_port
from testbed.process_children import (
    Child,
    CpuAllocator,
    PidLedger,
    has_exited,
    reap_child,
    session_memory_bytes,
    signal_group,
    spawn_child,
    stop_children,
)
from testbed.process_plan import (
    HOST_ENV,
    LOCAL_HOST,
    OOM_EXIT_CODE,
    PORT_ENV,
    TERMINATION_LOG_ENV,
    Container,
    ContainerConfigError,
    ContainerReason,
    ContainerRecord,
    Hook,
    Pod,
    PodMonitor,
    ProbeSpec,
    ProbeTracker,
    Running,
    Terminated,
    Waiting,
    adopt_container,
    build_command_line,
    build_container_env,
    build_pod_status,
    build_scrape_target_groups,
    consecutive_crashes_after,
    exit_reason,
    grace_after_pre_stop,
    image_pull_error,
    image_pull_waiting,
    is_being_deleted,
    is_local_process_pod,
    is_terminal,
    memory_limit_bytes,
    merge_pod_status,
    pod_folder_name,
    pod_key,
    pod_monitor_selects,
    pre_stop_hook,
    probe_spec,
    record_exited,
    record_started,
    restart_backoff_seconds,
    scrape_target_file_name,
    service_link_env,
    should_restart,
    shutdown_grace_seconds,
    startup_probe_failed,
    status_differs,
    stop_grace_seconds,
    termination_message,
)
from testbed.service_monitors import service_monitor_target_groups

log = logging.getLogger("process-kubelet")

# Untyped in the client; these are their documented signatures.
iter_resp_lines: Callable[[Any], Iterator[str]] = kube_watch.iter_resp_lines
new_client_from_config: Callable[..., client.ApiClient] = config.new_client_from_config

# `<namespace>_<pod>_<uid>.json`, as scrape_target_file_name makes them.
POD_TARGET_FILE = re.compile(r"^[a-z0-9-]+_[a-z0-9.-]+_[0-9a-f-]{36}\.json$")

CONTAINER_INIT = Path(__file__).with_name("container_init.py")

# In each pod's folder: {container name: local port}.
LOCAL_PORTS_FILE = "ports.json"

TICK_SECONDS = 1.0
#: How long a failed pull shows as ErrImagePull before ImagePullBackOff (a kubelet shows it until
#: its next sync of the pod).
PULL_ERROR_SHOWN_SECONDS = 2.0
# How often to look again for the PodMonitor CRD while it is not served.
POD_MONITOR_CRD_RETRY_SECONDS = 2.0
POD_MONITOR_GROUP, POD_MONITOR_VERSION, POD_MONITOR_PLURAL = (
    "monitoring.coreos.com",
    "v1",
    "podmonitors",
)
CONFIG_RETRY_SECONDS = 5.0
WATCH_TIMEOUT_SECONDS = 60
SHUTDOWN_JOIN_SECONDS = 15.0


def utc_now() -> str:
    """A Kubernetes timestamp (RFC 3339, seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --- The API server, as raw JSON objects ---------------------------------------------------


class PodGoneError(Exception):
    """The pod no longer exists (or is a different object than the one we run)."""


class StatusConflictError(Exception):
    """The pod changed since we read it; read it again."""


class PodApi(Protocol):
    """What the process kubelet needs from the API server."""

    def list_pods(self) -> tuple[list[Pod], str]: ...

    def watch_pods(self, resource_version: str) -> Iterator[tuple[str, Pod]]: ...

    def read_pod(self, namespace: str, name: str) -> Pod: ...

    def patch_pod_status(self, pod: Pod, status: Mapping[str, Any]) -> Pod: ...

    def delete_pod_now(self, pod: Pod) -> None: ...

    def read_object_data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None: ...

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        """The Services of `namespace` and the `kubernetes` Service of `default` (for the
        service link variables)."""
        ...

    def request_token(self, pod: Pod, audience: str | None, seconds: int) -> IssuedToken: ...


class PodMonitorApi(Protocol):
    """How the process kubelet reads PodMonitors."""

    def list_pod_monitors(self) -> tuple[list[PodMonitor], str] | None:
        """Every PodMonitor and the list's resourceVersion; None while the CRD is not served."""
        ...

    def watch_pod_monitors(self, resource_version: str) -> Iterator[tuple[str, PodMonitor]]: ...


def _watch_options(resource_version: str) -> dict[str, Any]:
    """The arguments of a watch from `resource_version` that ends by itself after a while."""
    return {
        "watch": True,
        "allow_watch_bookmarks": True,
        "resource_version": resource_version,
        "timeout_seconds": WATCH_TIMEOUT_SECONDS,
        "_request_timeout": (10, WATCH_TIMEOUT_SECONDS + 30),
        "_preload_content": False,
    }


def _watch_events(response: Any) -> Iterator[tuple[str, dict[str, Any]]]:
    """(type, object) of each event of a watch response; an ERROR event raises ApiException."""
    try:
        for line in iter_resp_lines(response):
            if not line:
                continue
            event = json.loads(line)
            if event["type"] == "ERROR":
                status = event["object"]
                raise ApiException(status=status.get("code"), reason=status.get("message"))
            yield event["type"], event["object"]
    finally:
        response.release_conn()


class KubePodApi:
    """PodApi over the `kubernetes` client, with plain dicts in camelCase as on the wire."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    @staticmethod
    def _json(response: Any) -> Any:
        return json.loads(response.data)

    def list_pods(self) -> tuple[list[Pod], str]:
        body = self._json(self.core.list_pod_for_all_namespaces(_preload_content=False))
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch_pods(self, resource_version: str) -> Iterator[tuple[str, Pod]]:
        """Pod events from `resource_version` on; ends after a while (then watch again).

        Raises ApiException(410) when the version is too old (then list again).
        """
        response: Any = self.core.list_pod_for_all_namespaces(**_watch_options(resource_version))
        yield from _watch_events(response)

    def list_pod_monitors(self) -> tuple[list[PodMonitor], str] | None:
        try:
            response: Any = self.custom.list_cluster_custom_object(
                POD_MONITOR_GROUP, POD_MONITOR_VERSION, POD_MONITOR_PLURAL, _preload_content=False
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        body = self._json(response)
        return list(body.get("items") or []), str(body["metadata"]["resourceVersion"])

    def watch_pod_monitors(self, resource_version: str) -> Iterator[tuple[str, PodMonitor]]:
        """PodMonitor events from `resource_version` on; ends after a while, or with an
        exception when the CRD goes (then list again)."""
        response: Any = self.custom.list_cluster_custom_object(
            POD_MONITOR_GROUP,
            POD_MONITOR_VERSION,
            POD_MONITOR_PLURAL,
            **_watch_options(resource_version),
        )
        yield from _watch_events(response)

    def read_pod(self, namespace: str, name: str) -> Pod:
        try:
            pod: Pod = self._json(
                self.core.read_namespaced_pod(name, namespace, _preload_content=False)
            )
        except ApiException as error:
            if error.status == 404:
                raise PodGoneError(f"{namespace}/{name}") from error
            raise
        return pod

    def patch_pod_status(self, pod: Pod, status: Mapping[str, Any]) -> Pod:
        metadata = pod["metadata"]
        body = {
            "metadata": {"uid": metadata["uid"], "resourceVersion": metadata["resourceVersion"]},
            "status": status,
        }
        try:
            patched: Pod = self._json(
                self.core.patch_namespaced_pod_status(
                    metadata["name"],
                    metadata["namespace"],
                    body,
                    _content_type="application/merge-patch+json",
                    _preload_content=False,
                )
            )
        except ApiException as error:
            if error.status == 404:
                raise PodGoneError(pod_key(pod)) from error
            if error.status == 409:
                raise StatusConflictError(pod_key(pod)) from error
            raise
        return patched

    def delete_pod_now(self, pod: Pod) -> None:
        metadata = pod["metadata"]
        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=metadata["uid"])
        )
        try:
            self.core.delete_namespaced_pod(
                metadata["name"], metadata["namespace"], grace_period_seconds=0, body=options
            )
        except ApiException as error:
            if error.status not in (404, 409):  # gone, or a new pod with the same name
                raise

    def read_object_data(self, kind: str, namespace: str, name: str) -> dict[str, str] | None:
        read = (
            self.core.read_namespaced_secret
            if kind == "Secret"
            else self.core.read_namespaced_config_map
        )
        try:
            body = self._json(read(name, namespace, _preload_content=False))
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        data: dict[str, str] = {}
        for key, value in (body.get("data") or {}).items():
            data[key] = base64.b64decode(value).decode() if kind == "Secret" else value
        if kind == "Secret":
            data.update(body.get("stringData") or {})
        else:
            for key, value in (body.get("binaryData") or {}).items():
                data[key] = base64.b64decode(value).decode(errors="replace")
        return data

    def list_services(self, namespace: str) -> list[dict[str, Any]]:
        found = self._json(self.core.list_namespaced_service(namespace, _preload_content=False))
        services: list[dict[str, Any]] = list(found.get("items") or [])
        if namespace != "default":
            try:
                services.append(
                    self._json(
                        self.core.read_namespaced_service(
                            "kubernetes", "default", _preload_content=False
                        )
                    )
                )
            except ApiException as error:
                if error.status != 404:
                    raise
        return services

    def list_service_monitors(self) -> list[dict[str, Any]] | None:
        """Every ServiceMonitor; None while their CRD is not served."""
        try:
            response: Any = self.custom.list_cluster_custom_object(
                POD_MONITOR_GROUP,
                POD_MONITOR_VERSION,
                SERVICE_MONITOR_PLURAL,
                _preload_content=False,
            )
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return list(self._json(response).get("items") or [])

    def list_all_services(self) -> list[dict[str, Any]]:
        """Every Service of every namespace (the Services of pods with a network of their own)."""
        body = self._json(self.core.list_service_for_all_namespaces(_preload_content=False))
        return list(body.get("items") or [])

    def request_token(self, pod: Pod, audience: str | None, seconds: int) -> IssuedToken:
        """A token of the pod's ServiceAccount bound to the pod (TokenRequest), as kubelet
        asks for a projected serviceAccountToken."""
        metadata = pod["metadata"]
        spec = client.V1TokenRequestSpec(
            audiences=[audience] if audience else [],
            expiration_seconds=seconds,
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=metadata["name"], uid=metadata["uid"]
            ),
        )
        answer: Any = self.core.create_namespaced_service_account_token(
            pod["spec"].get("serviceAccountName") or "default",
            metadata["namespace"],
            client.AuthenticationV1TokenRequest(spec=spec),
        )
        expires = answer.status.expiration_timestamp
        lifetime = (expires - datetime.now(UTC)).total_seconds() if expires else float(seconds)
        return IssuedToken(str(answer.status.token), max(1.0, lifetime))


# --- PodMonitors ------------------------------------------------------------------------------


class PodMonitors:
    """The PodMonitors of the cluster, kept current by `watch_forever` (list, then watch).

    Empty while the PodMonitor CRD is not served; without an API (tests) always empty.
    """

    def __init__(self, api: PodMonitorApi | None = None) -> None:
        self.api = api
        self._lock = threading.Lock()
        self._by_uid: dict[str, PodMonitor] = {}

    def current(self) -> list[PodMonitor]:
        with self._lock:
            return list(self._by_uid.values())

    def _replace(self, monitors: list[PodMonitor]) -> None:
        with self._lock:
            self._by_uid = {m["metadata"]["uid"]: m for m in monitors}

    def _observe(self, event_type: str, monitor: PodMonitor) -> None:
        uid = monitor["metadata"]["uid"]
        with self._lock:
            if event_type == "DELETED":
                self._by_uid.pop(uid, None)
            else:
                self._by_uid[uid] = monitor

    def watch_forever(self, stopping: threading.Event) -> None:
        """List, then watch from there; list again after any watch error or end of the CRD."""
        if self.api is None:
            return
        served = False
        while not stopping.is_set():
            try:
                listed = self.api.list_pod_monitors()
                if listed is None:
                    if served:
                        log.info("the PodMonitor CRD is gone: scrape annotations only")
                    served = False
                    self._replace([])
                    stopping.wait(POD_MONITOR_CRD_RETRY_SECONDS)
                    continue
                monitors, version = listed
                if not served:
                    log.info("the PodMonitor CRD is served: %d PodMonitor(s)", len(monitors))
                served = True
                self._replace(monitors)
                while not stopping.is_set():
                    for event_type, monitor in self.api.watch_pod_monitors(version):
                        version = (monitor.get("metadata") or {}).get("resourceVersion") or version
                        if event_type != "BOOKMARK":
                            log.info(
                                "PodMonitor %s/%s %s",
                                monitor["metadata"].get("namespace"),
                                monitor["metadata"].get("name"),
                                event_type.lower(),
                            )
                            self._observe(event_type, monitor)
            except Exception as error:
                if not stopping.is_set():
                    log.warning("PodMonitor watch failed (%s); listing again", error)
                    stopping.wait(POD_MONITOR_CRD_RETRY_SECONDS)


# --- Services and ServiceMonitors -----------------------------------------------------------


SERVICE_MONITOR_PLURAL = "servicemonitors"
SERVICES_REFRESH_SECONDS = 2.0


class ServiceDirectory:
    """The Services and ServiceMonitors of the cluster, listed every 2 s (both change seldom);
    no ServiceMonitors while their CRD is not served. Pods with a network of their own reach
    the Services (`Networking`); ServiceMonitors make scrape targets of the pods behind them."""

    def __init__(self, api: KubePodApi | None = None, networking: Networking | None = None) -> None:
        self.api = api
        self.networking = networking
        self._lock = threading.Lock()
        self._services: list[dict[str, Any]] = []
        self._monitors: list[dict[str, Any]] = []

    def current(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(Services, ServiceMonitors)."""
        with self._lock:
            return list(self._services), list(self._monitors)

    def observe(self, services: list[dict[str, Any]], monitors: list[dict[str, Any]]) -> None:
        with self._lock:
            self._services, self._monitors = services, monitors
        if self.networking is not None:
            self.networking.observe_services(services)

    def watch_forever(self, stopping: threading.Event) -> None:
        if self.api is None:
            return
        served = False
        while not stopping.is_set():
            try:
                monitors = self.api.list_service_monitors()
                if (monitors is not None) != served:
                    served = monitors is not None
                    log.info("the ServiceMonitor CRD is %s", "served" if served else "not served")
                self.observe(self.api.list_all_services(), monitors or [])
            except Exception as error:  # the API server may be briefly away
                log.warning("listing Services and ServiceMonitors failed: %s", error)
            stopping.wait(SERVICES_REFRESH_SECONDS)


# --- Local resources: ports and scrape target files ----------------------------------------


class PortAllocator:
    """Free ports on 127.0.0.1 (outside the range outgoing connections take theirs from), never
    handed out twice while in use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: set[int] = set()

    def take(self) -> int:
        with self._lock:
            while True:
                port = free_port()
                if port not in self._taken:
                    self._taken.add(port)
                    return port

    def give_back(self, port: int) -> None:
        with self._lock:
            self._taken.discard(port)


class ScrapeTargetFiles:
    """Prometheus file-SD files, one `<namespace>_<pod>_<uid>.json` per running pod."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    def remove_leftovers(self) -> list[str]:
        """Remove pod target files a previous instance left (it was killed); running pods get
        theirs again from their workers. Files of other writers do not match the pattern."""
        removed = []
        for path in self.folder.glob("*.json"):
            if POD_TARGET_FILE.match(path.name):
                path.unlink(missing_ok=True)
                removed.append(path.name)
        return removed

    def write(self, pod: Pod, groups: list[dict[str, Any]]) -> None:
        path = self.folder / scrape_target_file_name(pod)
        text = json.dumps(groups, indent=2, sort_keys=True) + "\n"
        with contextlib.suppress(FileNotFoundError):
            if path.read_text() == text:
                return
        # Prometheus reads *.json; the temporary name does not match, the rename is atomic.
        tmp = self.folder / f".{path.name}.tmp"
        tmp.write_text(text)
        tmp.replace(path)

    def remove(self, pod: Pod) -> None:
        (self.folder / scrape_target_file_name(pod)).unlink(missing_ok=True)


# --- Probes ----------------------------------------------------------------------------------


def run_probe(spec: ProbeSpec, port: int, env: Mapping[str, str], cwd: Path) -> bool:
    """One probe against the container's local port (or in its environment, for exec)."""
    try:
        if spec.kind == "http":
            connection: http.client.HTTPConnection
            if spec.scheme == "HTTPS":
                insecure = ssl.create_default_context()
                insecure.check_hostname = False
                insecure.verify_mode = ssl.CERT_NONE
                connection = http.client.HTTPSConnection(
                    LOCAL_HOST, port, timeout=spec.timeout_seconds, context=insecure
                )
            else:
                connection = http.client.HTTPConnection(
                    LOCAL_HOST, port, timeout=spec.timeout_seconds
                )
            try:
                connection.request("GET", spec.path, headers=dict(spec.headers))
                status = connection.getresponse().status
            finally:
                connection.close()
            return 200 <= status < 400
        if spec.kind == "tcp":
            with socket.create_connection((LOCAL_HOST, port), timeout=spec.timeout_seconds):
                return True
        if spec.kind == "exec":
            result = subprocess.run(
                list(spec.command),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=spec.timeout_seconds,
                check=False,
            )
            return result.returncode == 0
    except (OSError, http.client.HTTPException, subprocess.SubprocessError):
        return False
    return True  # gRPC probes are not run here; they count as passing (docs/testbed.md)


# --- One pod --------------------------------------------------------------------------------


@dataclass
class ContainerRun:
    """The worker's state for one container: its record and its current process, if any."""

    spec: Container
    record: ContainerRecord
    port: int
    wants_run: bool
    consecutive_crashes: int = 0
    start_at: float = 0.0
    child: Child | None = None
    env: dict[str, str] = field(default_factory=dict)
    log_offset: int = 0
    readiness: ProbeTracker | None = None
    startup: ProbeTracker | None = None
    #: Failed pulls of its image in a row (kubelet's image back-off), and when the last failed.
    pull_failures: int = 0
    pull_failed_at: float = 0.0
    mounts: list[PlannedMount] = field(default_factory=list)
    #: Its network namespace's forwarding, for a container with a network of its own.
    net: PodNetwork | None = None
    #: containerPort → host port on 127.0.0.1, for a container with a network of its own.
    host_ports: dict[int, int] = field(default_factory=dict)
    #: The running container's own temporary folder (its TMPDIR), removed when it ends.
    tmp: Path | None = None


class PodWorker(threading.Thread):
    """Runs one pod's containers until the pod is deleted or the process kubelet stops.

    The thread outlives its children (it stops them before it ends), which PR_SET_PDEATHSIG
    needs: the signal follows the thread that forked.
    """

    def __init__(
        self,
        pod: Pod,
        *,
        api: PodApi,
        pods_dir: Path,
        targets: ScrapeTargetFiles,
        ledger: PidLedger,
        ports: PortAllocator,
        monitors: PodMonitors,
        cpus: CpuAllocator | None = None,
        images: Mapping[str, ImageEntry] | None = None,
        service_env: Mapping[str, str] | None = None,
        networking: Networking | None = None,
        directory: ServiceDirectory | None = None,
    ) -> None:
        super().__init__(name=f"pod {pod_key(pod)}", daemon=True)
        self.api = api
        self.targets = targets
        self.monitors = monitors
        self.ledger = ledger
        self.ports = ports
        self.cpus = cpus or CpuAllocator(())
        self.images = images or {}
        self.service_env = dict(service_env or {})
        self.networking = networking
        self.directory = directory or ServiceDirectory()
        self.folder = pods_dir / pod_folder_name(pod)
        self.volumes = PodVolumes(self.folder)
        self._pod = pod
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._gone = False
        self._shutdown = False
        self._runs: list[ContainerRun] = []
        self._start_time = ""
        # A pod already Succeeded or Failed is never run, and its status never written again.
        self._frozen = is_terminal(pod)

    # Called from other threads.

    @property
    def pod(self) -> Pod:
        with self._lock:
            return self._pod

    def observe(self, pod: Pod) -> None:
        """A newer version of the pod from the watch."""
        with self._lock:
            self._pod = pod
        self._wake.set()

    def gone(self) -> None:
        """The pod was deleted from the API server."""
        self._gone = True
        self._wake.set()

    def shutdown(self) -> None:
        """The process kubelet stops: stop the processes, leave the pod as it is."""
        self._shutdown = True
        self._wake.set()

    # The worker thread.

    def run(self) -> None:
        try:
            self._run()
        except Exception:
            log.exception("worker for %s failed", pod_key(self.pod))
        finally:
            # Stopped without a deletion to honour (the process kubelet stops, or the pod
            # vanished): a bounded grace and no preStop hook.
            self._stop_all(grace=shutdown_grace_seconds(self.pod))
            self.targets.remove(self.pod)
            if self._shutdown and not self._gone:
                # The processes really ended: say so, so that nobody trusts a Ready pod that
                # is not running. The next instance restarts them as the restart policy says.
                try:
                    if not self._frozen:
                        self._write_status(self._owned_status())
                except Exception as error:
                    log.warning("final status of %s not written: %s", pod_key(self.pod), error)
            for run in self._runs:
                self.ports.give_back(run.port)

    def _run(self) -> None:
        pod = self.pod
        self.folder.mkdir(parents=True, exist_ok=True)
        now = utc_now()
        self._start_time = (pod.get("status") or {}).get("startTime") or now
        policy = pod["spec"].get("restartPolicy") or "Always"
        for container in pod["spec"]["containers"]:
            adopted = adopt_container(pod, container, policy, now)
            self._runs.append(
                ContainerRun(
                    spec=container,
                    record=adopted.record,
                    port=self.ports.take(),
                    wants_run=adopted.run and not self._frozen,
                    consecutive_crashes=adopted.consecutive_crashes,
                )
            )
        if pod["spec"].get("initContainers"):
            for run in self._runs:
                run.wants_run = False
                run.record = replace(
                    run.record,
                    state=Waiting(
                        ContainerReason.CREATE_CONTAINER_CONFIG_ERROR,
                        "init containers are not supported by the process kubelet",
                    ),
                )
        # Who talks to a container (a test, the demo) finds its local port here, whether or not
        # Prometheus scrapes it.
        ports = {run.spec["name"]: run.port for run in self._runs}
        (self.folder / LOCAL_PORTS_FILE).write_text(json.dumps(ports, sort_keys=True) + "\n")
        log.info("running pod %s in %s", pod_key(pod), self.folder)
        while not (self._gone or self._shutdown or is_being_deleted(self.pod)):
            self._wake.clear()
            for run in self._runs:
                self._tend(run)
            self._refresh_tokens()
            try:
                self._publish()
            except Exception as error:  # the API server may be briefly away; keep running
                log.warning("could not publish the status of %s: %s", pod_key(self.pod), error)
            self._wake.wait(TICK_SECONDS)
        if self._gone or self._shutdown:
            return
        self._finish_deletion()

    def _tend(self, run: ContainerRun) -> None:
        """One step of one container: notice its exit, (re)start it, hold it to its memory
        limit, probe it."""
        if run.child is not None and has_exited(run.child):
            self._record_exit(run, reap_child(run.child, self.ledger))
        if run.child is None and run.wants_run and time.monotonic() >= run.start_at:
            self._start(run)
        elif run.child is None and run.pull_failures:
            state = run.record.state
            if (
                isinstance(state, Waiting)
                and state.reason == ContainerReason.ERR_IMAGE_PULL
                and time.monotonic() - run.pull_failed_at >= PULL_ERROR_SHOWN_SECONDS
            ):
                # Between pulls kubelet shows the back-off (after a sync or two of the error).
                image = run.spec.get("image") or ""
                error = image_pull_error(image) or state.message
                run.record = replace(run.record, state=image_pull_waiting(image, error, True))
        if run.child is not None and self._over_memory_limit(run):
            return
        if run.child is not None:
            if run.net is not None and self.networking is not None:
                self.networking.reach_services(run.net)
            self._probe(run)
        if run.child is not None and self._startup_failed(run):
            log.info(
                "%s/%s failed its startup probe; killing it", pod_key(self.pod), run.spec["name"]
            )
            grace = stop_grace_seconds(self.pod)
            (exit_code,) = stop_children([run.child], grace, self.ledger)
            self._record_exit(run, exit_code)

    def _over_memory_limit(self, run: ContainerRun) -> bool:
        """Kills the container, as the kernel's OOM killer would, when its processes use more
        memory than its limit (their summed proportional set size, read every tick)."""
        assert run.child is not None
        limit = memory_limit_bytes(run.spec)
        if limit is None or session_memory_bytes(run.child.pid) <= limit:
            return False
        log.info("%s/%s is over its memory limit: OOM-killed", pod_key(self.pod), run.spec["name"])
        reap_child(run.child, self.ledger)
        self._record_exit(run, OOM_EXIT_CODE, reason=ContainerReason.OOM_KILLED)
        return True

    def _startup_failed(self, run: ContainerRun) -> bool:
        assert run.child is not None
        startup = run.startup
        if startup is None or run.record.started:
            return False
        return startup_probe_failed(startup.spec, time.monotonic() - run.child.started_monotonic)

    def backends(self, selector: Mapping[str, str], target_port: int | str) -> list[Route]:
        """Where a Service with `selector` sends a connection for `target_port` in this pod:
        none unless the pod is Ready and in the selector."""
        pod = self.pod
        labels = pod["metadata"].get("labels") or {}
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            return []
        if not all(run.record.ready for run in self._runs):
            return []
        routes = []
        for run in self._runs:
            child = run.child
            if child is None:
                continue
            for index, port in enumerate(run.spec.get("ports") or []):
                number = int(port["containerPort"])
                if target_port not in (number, port.get("name")):
                    continue
                if run.net is not None:
                    routes.append(Route(_socket_maker(child.pid), (LOCAL_HOST, number)))
                elif index == 0:  # only a container's first port has a local stand-in
                    routes.append(Route(unconnected_socket, (LOCAL_HOST, run.port)))
        return routes

    def _start(self, run: ContainerRun) -> None:
        pod = self.pod
        name = run.spec["name"]
        image = run.spec.get("image") or ""
        # An image the image map runs is one the nodes hold, whatever its name.
        pull_error = None if image in self.images else image_pull_error(image)
        if pull_error is not None:
            # As kubelet: ErrImagePull, then ImagePullBackOff until the next try.
            run.pull_failures += 1
            run.pull_failed_at = time.monotonic()
            run.record = replace(run.record, state=image_pull_waiting(image, pull_error, False))
            run.start_at = time.monotonic() + restart_backoff_seconds(run.pull_failures)
            log.info("%s/%s: %s", pod_key(pod), name, pull_error)
            return
        run.pull_failures = 0
        termination_log = self.folder / f"{name}.termination-log"
        overrides = {
            HOST_ENV: LOCAL_HOST,
            PORT_ENV: str(run.port),
            TERMINATION_LOG_ENV: str(termination_log),
        }
        image = self.images.get(run.spec.get("image") or "")
        try:
            # The service links as kubelet makes them, but the `kubernetes` Service's variables
            # name the API server's own address: there is no Service network here.
            services = {
                **service_link_env(pod, self.api.list_services(pod["metadata"]["namespace"])),
                **self.service_env,
            }
            container_env = build_container_env(
                pod, run.spec, overrides, self.api.read_object_data, services
            )
            argv = build_command_line(run.spec, container_env, image)
            run.mounts = container_mounts(pod, run.spec)
            self.volumes.fill(
                pod, run.spec, run.mounts, self.api.read_object_data, self.api.request_token
            )
        except (ContainerConfigError, ApiException) as error:
            message = error.reason if isinstance(error, ApiException) else str(error)
            run.record = replace(
                run.record,
                state=Waiting(ContainerReason.CREATE_CONTAINER_CONFIG_ERROR, str(message)),
            )
            run.start_at = time.monotonic() + CONFIG_RETRY_SECONDS
            return
        # The host's environment stands in for the image's (PATH, HOME, a venv's PYTHONPATH),
        # with what the image map says of the image's own on top. Each container run has a
        # temporary folder of its own, as a container's /tmp is, gone when it ends: vLLM's
        # engines leave their IPC sockets there.
        run.tmp = Path(tempfile.mkdtemp(prefix="pk-"))
        run.env = {
            **os.environ,
            "TMPDIR": str(run.tmp),
            **(image.env if image else {}),
            **container_env,
        }
        termination_log.write_text("")
        log_path = self.folder / f"{name}.log"
        run.log_offset = log_path.stat().st_size if log_path.exists() else 0
        run.readiness = self._tracker(run.spec, "readinessProbe")
        run.startup = self._tracker(run.spec, "startupProbe")
        started_at = utc_now()
        own_network = bool(image and image.own_network and self.networking is not None)
        cpu = self.cpus.take()
        try:
            run.child = spawn_child(
                self._in_mount_namespace(run, argv, own_network, image),
                record_argv=argv,
                env=run.env,
                cwd=self.folder,
                log_path=log_path,
                ledger=self.ledger,
                owner=f"{pod_key(pod)}/{name}",
                cpu=cpu,
            )
        except (OSError, subprocess.SubprocessError) as error:
            self.cpus.give_back(cpu)
            # Like a container that was created but could not start: it counts as a run.
            run.record = record_started(
                run.record, started_at, "", has_readiness_probe=False, has_startup_probe=False
            )
            self._record_exit(run, 128, start_error=str(error))
            return
        if own_network:
            try:
                self._join_network(run)
            except OSError as error:
                log.warning("%s/%s: network not set up: %s", pod_key(pod), name, error)
                signal_group(run.child.pid, signal.SIGKILL)
        log.info(
            "%s/%s started as pid %d on CPU %s: %s", pod_key(pod), name, run.child.pid, cpu, argv
        )
        run.record = record_started(
            run.record,
            started_at,
            f"process://{run.child.pid}",
            has_readiness_probe=run.readiness is not None,
            has_startup_probe=run.startup is not None,
        )

    def _in_mount_namespace(
        self,
        run: ContainerRun,
        argv: list[str],
        own_network: bool = False,
        image: ImageEntry | None = None,
    ) -> list[str]:
        """argv, started through container_init so that the container's volumes are at its
        mount paths (not hiding the folders that stand in for its image's files) and, with
        `own_network`, in a network namespace of its own (unchanged for a container with
        neither)."""
        if not run.mounts and not own_network:
            return argv
        name = run.spec["name"]
        scratch = self.folder / "overlays" / name
        shutil.rmtree(scratch, ignore_errors=True)
        mounts = [
            {
                "source": str(self.volumes.path(mount.volume)),
                "target": mount.target,
                "readOnly": mount.read_only,
            }
            for mount in run.mounts
        ]
        ready = self.folder / f"{name}.network-ready"
        ready.unlink(missing_ok=True)
        if own_network and self.networking is not None:
            hosts = self.networking.hosts_file
            mounts.append({"source": str(hosts), "target": "/etc/hosts", "readOnly": True})
        spec = {
            "mounts": mounts,
            "scratch": str(scratch),
            "network": own_network,
            "ready": str(ready),
            "keep": list(image.files) if image else [],
        }
        spec_path = self.folder / f"{name}.mounts.json"
        spec_path.write_text(json.dumps(spec, indent=2) + "\n")
        return [sys.executable, "-I", str(CONTAINER_INIT), str(spec_path), "--", *argv]

    def _join_network(self, run: ContainerRun) -> None:
        """Once the container's process is in its own network namespace: its ports on the
        host, the host's API server and Prometheus in it, the Services; then let it go on."""
        assert run.child is not None
        assert self.networking is not None
        pid = run.child.pid
        own = os.stat("/proc/self/ns/net").st_ino
        deadline = time.monotonic() + 20
        while os.stat(f"/proc/{pid}/ns/net").st_ino == own:
            if time.monotonic() > deadline or has_exited(run.child):
                raise OSError("the container did not enter a network namespace of its own")
            time.sleep(0.02)
        declared = frozenset(
            int(port["containerPort"])
            for other in self._runs
            for port in other.spec.get("ports") or []
        )
        net = PodNetwork(
            self.networking.forwarder, pid, f"{pod_key(self.pod)}/{run.spec['name']}", declared
        )
        run.host_ports = {}
        for port in run.spec.get("ports") or []:
            number = int(port["containerPort"])
            run.host_ports[number] = net.expose(number)
        for host_port in self.networking.host_ports:
            net.reach_host(host_port)
        self.networking.reach_services(net)
        run.net = net
        if run.host_ports:
            first = int((run.spec.get("ports") or [])[0]["containerPort"])
            run.port = run.host_ports[first]
        ports = {other.spec["name"]: other.port for other in self._runs}
        (self.folder / LOCAL_PORTS_FILE).write_text(json.dumps(ports, sort_keys=True) + "\n")
        (self.folder / f"{run.spec['name']}.network-ready").touch()

    def _refresh_tokens(self) -> None:
        """Renew the tokens of projected volumes once 80 % of their life has passed."""
        due = set(self.volumes.refresh_due())
        if not due:
            return
        for run in self._runs:
            mounts = [mount for mount in run.mounts if mount.volume in due]
            if not mounts:
                continue
            try:
                self.volumes.fill(
                    self.pod, run.spec, mounts, self.api.read_object_data, self.api.request_token
                )
                log.info("%s: renewed the token(s) in %s", pod_key(self.pod), sorted(due))
            except (ContainerConfigError, ApiException) as error:
                log.warning("%s: token not renewed: %s", pod_key(self.pod), error)
            due -= {mount.volume for mount in mounts}

    @staticmethod
    def _tracker(container: Container, which: str) -> ProbeTracker | None:
        spec = probe_spec(container, which)
        return ProbeTracker(spec) if spec is not None else None

    def _probe(self, run: ContainerRun) -> None:
        assert run.child is not None
        alive_for = time.monotonic() - run.child.started_monotonic
        started = run.record.started
        startup = run.startup
        if startup is not None and not started and alive_for >= startup.spec.initial_delay_seconds:
            started = startup.record(run_probe(startup.spec, run.port, run.env, self.folder))
        ready = run.record.ready
        if started and run.readiness is not None:
            if alive_for >= run.readiness.spec.initial_delay_seconds:
                ready = run.readiness.record(
                    run_probe(run.readiness.spec, run.port, run.env, self.folder)
                )
        elif started:
            ready = True
        run.record = replace(run.record, started=started, ready=ready)

    def _record_exit(
        self,
        run: ContainerRun,
        exit_code: int,
        start_error: str = "",
        may_restart: bool = True,
        reason: str = "",
    ) -> None:
        pod = self.pod
        name = run.spec["name"]
        ran_for = 0.0
        if run.tmp is not None:
            shutil.rmtree(run.tmp, ignore_errors=True)
            run.tmp = None
        if run.net is not None:
            run.net.close()
            run.net = None
        if run.child is not None:
            ran_for = time.monotonic() - run.child.started_monotonic
            log.info("%s/%s (pid %d) exited with %d", pod_key(pod), name, run.child.pid, exit_code)
            self.cpus.give_back(run.child.cpu)
            run.child = None
        if start_error:
            reason, message = ContainerReason.START_ERROR, start_error
        else:
            reason = reason or exit_reason(exit_code)
            message = termination_message(
                run.spec,
                _read_text(self.folder / f"{name}.termination-log"),
                exit_code,
                _read_text(self.folder / f"{name}.log", run.log_offset),
            )
        state = run.record.state
        ended = Terminated(
            exit_code=exit_code,
            reason=reason,
            message=message,
            started_at=state.started_at if isinstance(state, Running) else "",
            finished_at=utc_now(),
            container_id=run.record.container_id,
        )
        policy = pod["spec"].get("restartPolicy") or "Always"
        run.wants_run = may_restart and should_restart(policy, exit_code)
        delay: float | None = None
        if run.wants_run:
            run.consecutive_crashes = consecutive_crashes_after(run.consecutive_crashes, ran_for)
            delay = restart_backoff_seconds(run.consecutive_crashes)
            run.start_at = time.monotonic() + delay
        run.record = record_exited(pod, run.record, ended, delay)

    def _publish(self) -> None:
        """Write the status when it changed, and the scrape targets while the pod runs."""
        if self._frozen:
            return
        pod = self.pod
        owned = self._owned_status()
        groups: list[dict[str, Any]] = []
        if owned["phase"] == "Running":
            services, service_monitors = self.directory.current()
            by_services = service_monitor_target_groups(
                pod, service_monitors, services, self._local_port
            )
            pod_monitors = self.monitors.current()
            by_pod = build_scrape_target_groups(
                pod, {run.spec["name"]: run.port for run in self._runs}, pod_monitors
            )
            # Scrape annotations count only where no monitor selects the pod.
            if by_services and not any(pod_monitor_selects(m, pod) for m in pod_monitors):
                by_pod = []
            groups = by_pod + by_services
        if groups:
            self.targets.write(pod, groups)
        else:
            self.targets.remove(pod)
        self._write_status(owned)

    def _local_port(self, container: Container, port: Mapping[str, Any]) -> int | None:
        """The local port standing in for a container port: any declared port of a container
        with a network of its own, only the first of one on the host's network."""
        for run in self._runs:
            if run.spec["name"] != container["name"]:
                continue
            if run.host_ports:
                return run.host_ports.get(int(port["containerPort"]))
            first = (run.spec.get("ports") or [{}])[0]
            return run.port if first.get("containerPort") == port.get("containerPort") else None
        return None

    def _owned_status(self) -> dict[str, Any]:
        records = [run.record for run in self._runs]
        return build_pod_status(self.pod, records, self._start_time)

    def _write_status(self, owned: Mapping[str, Any]) -> None:
        for _ in range(5):
            pod = self.pod
            current = pod.get("status") or {}
            merged = merge_pod_status(current, owned, utc_now())
            if not status_differs(current, merged):
                return
            try:
                try:
                    patched = self.api.patch_pod_status(pod, merged)
                except StatusConflictError:
                    fresh = self.api.read_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
                    if fresh["metadata"]["uid"] != pod["metadata"]["uid"]:
                        raise PodGoneError(pod_key(pod)) from None
                    self.observe(fresh)
                    continue
            except PodGoneError:
                self._gone = True
                return
            self.observe(patched)
            return
        log.warning("status of %s kept conflicting; trying again later", pod_key(self.pod))

    def _stop_all(self, grace: float) -> None:
        """Stop every running container together, as kubelet does, and record their ends."""
        running = [run for run in self._runs if run.child is not None]
        children = [run.child for run in running if run.child is not None]
        if not children:
            return
        log.info(
            "stopping %s (pids %s), grace %.0fs",
            pod_key(self.pod),
            ", ".join(str(child.pid) for child in children),
            grace,
        )
        for run, exit_code in zip(
            running, stop_children(children, grace, self.ledger), strict=True
        ):
            self._record_exit(run, exit_code, may_restart=False)

    def _give_back_cpus(self) -> None:
        """A pod being deleted gives its CPUs back at once, while its processes still drain: it
        serves nothing more, and the next engine started meanwhile (a new revision's, beside the
        one serving) gets a CPU of its own, not the serving engine's because the draining one
        still held the other until it ended (a pin is for a process's life)."""
        for run in self._runs:
            if run.child is not None and run.child.cpu is not None:
                self.cpus.give_back(run.child.cpu)
                run.child.cpu = None

    def _finish_deletion(self) -> None:
        """The pod has a deletionTimestamp: run the preStop hooks of its running containers,
        stop its processes with what is left of the grace period, then delete it for good.

        No final status is written: the pod disappears at once, as KWOK's own pods do.
        """
        pod = self.pod
        grace = stop_grace_seconds(pod)
        began = time.monotonic()
        self._give_back_cpus()
        self._run_pre_stop_hooks(grace)
        self._stop_all(grace=grace_after_pre_stop(grace, time.monotonic() - began))
        self.targets.remove(pod)
        self.volumes.remove()
        log.info("deleting pod %s (grace 0)", pod_key(pod))
        for attempt in range(30):
            try:
                self.api.delete_pod_now(pod)
                return
            except Exception as error:
                log.warning("deleting %s failed (%s), attempt %d", pod_key(pod), error, attempt)
                time.sleep(2.0)

    def _run_pre_stop_hooks(self, grace: float) -> None:
        """Each running container's preStop hook, all at once, as kubelet runs them before it
        signals the containers; a hook still running when the grace period ends is left."""
        hooks = [
            (run, hook)
            for run in self._runs
            if run.child is not None and (hook := pre_stop_hook(run.spec)) is not None
        ]
        if not hooks:
            return
        threads = [
            threading.Thread(
                target=self._run_hook, args=(run, hook, grace), name=f"preStop {run.spec['name']}"
            )
            for run, hook in hooks
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + grace
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def _run_hook(self, run: ContainerRun, hook: Hook, grace: float) -> None:
        name = f"{pod_key(self.pod)}/{run.spec['name']}"
        log.info("%s: preStop %s", name, hook.kind)
        try:
            if hook.kind == "sleep":
                time.sleep(min(hook.seconds, grace))
            elif hook.kind == "exec":
                subprocess.run(
                    list(hook.command),
                    env=run.env,
                    cwd=self.folder,
                    stdin=subprocess.DEVNULL,
                    capture_output=True,
                    timeout=grace,
                    check=True,
                )
            else:
                probe = ProbeSpec(
                    kind="http", path=hook.path, scheme=hook.scheme, timeout_seconds=grace
                )
                if not run_probe(probe, run.port, run.env, self.folder):
                    raise RuntimeError(f"GET {hook.path} failed")
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            # kubelet records FailedPreStopHook and stops the container all the same.
            log.warning("%s: preStop hook failed: %s", name, error)
        else:
            log.info("%s: preStop %s done", name, hook.kind)


def _socket_maker(pid: int) -> Callable[[], socket.socket]:
    """Makes unconnected sockets inside the network namespace of process `pid`."""
    return lambda: socket_in_namespace(pid, unconnected_socket)


def kubernetes_service_env(api_server: str) -> dict[str, str]:
    """The variables kubelet gives every container for the `kubernetes` Service, which
    in-cluster clients read (`load_incluster_config`). There is no Service network here: they
    name the API server's own address, as a node reaches it."""
    address = urllib.parse.urlsplit(api_server)
    host, port = str(address.hostname), str(address.port or 443)
    return {
        "KUBERNETES_SERVICE_HOST": host,
        "KUBERNETES_SERVICE_PORT": port,
        "KUBERNETES_SERVICE_PORT_HTTPS": port,
        "KUBERNETES_PORT": f"tcp://{host}:{port}",
        f"KUBERNETES_PORT_{port}_TCP": f"tcp://{host}:{port}",
        f"KUBERNETES_PORT_{port}_TCP_PROTO": "tcp",
        f"KUBERNETES_PORT_{port}_TCP_PORT": port,
        f"KUBERNETES_PORT_{port}_TCP_ADDR": host,
    }


def read_local_ports(run_dir: Path, pod: Pod) -> dict[str, int] | None:
    """{container name: local port} of a pod this process kubelet (run folder `run_dir`) runs;
    None until it has started the pod."""
    try:
        ports: dict[str, int] = json.loads(
            (run_dir / "pods" / pod_folder_name(pod) / LOCAL_PORTS_FILE).read_text()
        )
    except (OSError, ValueError):
        return None
    return ports


def _read_text(path: Path, offset: int = 0) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


# --- All pods -------------------------------------------------------------------------------


class ProcessKubelet:
    """Watches pods and keeps one PodWorker per local-process pod."""

    def __init__(
        self,
        api: PodApi,
        run_dir: Path,
        sd_dir: Path,
        monitors: PodMonitors | None = None,
        *,
        images: Mapping[str, ImageEntry] | None = None,
        service_env: Mapping[str, str] | None = None,
        networking: Networking | None = None,
        directory: ServiceDirectory | None = None,
    ) -> None:
        self.api = api
        self.directory = directory or ServiceDirectory()
        self.images = dict(images or {})
        self.service_env = dict(service_env or {})
        self.networking = networking
        if networking is not None:
            networking.find_backends = self.backends
        self.monitors = monitors or PodMonitors()
        self.pods_dir = run_dir / "pods"
        self.pods_dir.mkdir(parents=True, exist_ok=True)
        self.targets = ScrapeTargetFiles(sd_dir)
        self.ledger = PidLedger(run_dir / "pids")
        self.ports = PortAllocator()
        self.cpus = CpuAllocator()
        self.workers: dict[str, PodWorker] = {}
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def observe(self, event_type: str, pod: Pod) -> None:
        """Act on one watch event (or one listed pod, as ADDED)."""
        uid = (pod.get("metadata") or {}).get("uid")
        if not uid:
            return
        with self._lock:
            worker = self.workers.get(uid)
            if event_type == "DELETED":
                if worker is not None:
                    worker.gone()
                    del self.workers[uid]
                return
            if worker is not None:
                worker.observe(pod)
            elif is_local_process_pod(pod) and not self.stopping.is_set():
                worker = PodWorker(
                    pod,
                    api=self.api,
                    pods_dir=self.pods_dir,
                    targets=self.targets,
                    ledger=self.ledger,
                    ports=self.ports,
                    monitors=self.monitors,
                    cpus=self.cpus,
                    images=self.images,
                    service_env=self.service_env,
                    networking=self.networking,
                    directory=self.directory,
                )
                self.workers[uid] = worker
                worker.start()

    def backends(self, namespace: str, selector: Mapping[str, str], port: int | str) -> list[Route]:
        """Every ready pod's route for a Service of `namespace` with `selector`."""
        with self._lock:
            workers = [
                worker
                for worker in self.workers.values()
                if worker.pod["metadata"]["namespace"] == namespace
            ]
        return [route for worker in workers for route in worker.backends(selector, port)]

    def resync(self, pods: list[Pod]) -> None:
        """After a (re)list: forget workers whose pods are gone, observe the rest."""
        present = {pod["metadata"]["uid"] for pod in pods}
        with self._lock:
            for uid in [uid for uid in self.workers if uid not in present]:
                self.workers.pop(uid).gone()
        for pod in pods:
            self.observe("ADDED", pod)

    def watch_forever(self) -> None:
        """List, then watch from there; list again after any watch error."""
        while not self.stopping.is_set():
            try:
                pods, version = self.api.list_pods()
                self.resync(pods)
                while not self.stopping.is_set():
                    for event_type, pod in self.api.watch_pods(version):
                        version = (pod.get("metadata") or {}).get("resourceVersion") or version
                        if event_type != "BOOKMARK":
                            self.observe(event_type, pod)
            except Exception as error:
                if not self.stopping.is_set():
                    log.warning("pod watch failed (%s); listing again", error)
                    self.stopping.wait(2.0)

    def stop(self) -> None:
        """Stop every pod's processes (pods stay as they are) and wait for the workers."""
        self.stopping.set()
        with self._lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.shutdown()
        deadline = time.monotonic() + SHUTDOWN_JOIN_SECONDS
        for worker in workers:
            worker.join(timeout=max(0.0, deadline - time.monotonic()))


# --- Command line --------------------------------------------------------------------------


def _hold_run_dir(run_dir: Path) -> int:
    """Lock the run folder so two process kubelets never share (and clean up) one."""
    run_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(run_dir / "process-kubelet.lock", os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit(f"process kubelet: another instance is using {run_dir}")
    return descriptor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.process_kubelet", description=__doc__)
    parser.add_argument("--kubeconfig", required=True, type=Path)
    parser.add_argument("--run-dir", required=True, type=Path, help="pod folders, pid records")
    parser.add_argument("--sd-dir", required=True, type=Path, help="Prometheus file-SD folder")
    parser.add_argument(
        "--image-map", type=Path, help="JSON {image: entry point} (testbed.images)", default=None
    )
    parser.add_argument(
        "--reach-host-port",
        type=int,
        action="append",
        default=[],
        help="a host port on 127.0.0.1 that pods with a network of their own reach (repeat)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(threadName)s: %(message)s"
    )
    logging.getLogger("urllib3").setLevel(logging.ERROR)

    _hold_run_dir(args.run_dir)
    leftovers = PidLedger(args.run_dir / "pids").kill_leftovers()
    if leftovers:
        log.info("killed %d children left by a previous instance: %s", len(leftovers), leftovers)
    stale_targets = ScrapeTargetFiles(args.sd_dir).remove_leftovers()
    if stale_targets:
        log.info("removed scrape target files left by a previous instance: %s", stale_targets)

    api_client = new_client_from_config(config_file=str(args.kubeconfig))
    api = KubePodApi(api_client)
    api_port = urllib.parse.urlsplit(str(api_client.configuration.host)).port or 443
    networking = Networking(args.run_dir / "hosts", (api_port, *args.reach_host_port))
    kubelet = ProcessKubelet(
        api,
        args.run_dir,
        args.sd_dir,
        PodMonitors(api),
        images=read_image_map(args.image_map),
        service_env=kubernetes_service_env(str(api_client.configuration.host)),
        networking=networking,
        directory=ServiceDirectory(api, networking),
    )

    def request_stop(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        kubelet.stopping.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    watcher = threading.Thread(target=kubelet.watch_forever, name="pod watch", daemon=True)
    watcher.start()
    monitor_watcher = threading.Thread(
        target=kubelet.monitors.watch_forever,
        args=(kubelet.stopping,),
        name="PodMonitor watch",
        daemon=True,
    )
    monitor_watcher.start()
    service_watcher = threading.Thread(
        target=kubelet.directory.watch_forever,
        args=(kubelet.stopping,),
        name="Service list",
        daemon=True,
    )
    service_watcher.start()
    log.info("process kubelet up (pid %d), run dir %s", os.getpid(), args.run_dir)
    while not kubelet.stopping.wait(3600):
        pass
    kubelet.stop()
    log.info("process kubelet stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
