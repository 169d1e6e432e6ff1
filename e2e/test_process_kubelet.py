"""The process kubelet on the real test-bed cluster: a local-process pod runs, becomes Ready,
is scraped by Prometheus through its scrape annotations or the PodMonitor that selects it (the
Prometheus Operator's real CRD), reports its exit, and stops when deleted."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from testbed import (
    RESTRICTED_CONTAINER_SECURITY,
    RESTRICTED_POD_SECURITY,
    ClusterEnv,
    Kubectl,
    eventually,
)
from testbed.conditions import condition, is_ready
from testbed.process_children import read_identity
from testbed.prometheus_operator import served_pod_monitor_crd
from testbed.sample_server import SAMPLE_SERVER as SERVER

pytestmark = pytest.mark.e2e

T = TypeVar("T")

REVISION = "e2e0000001"
LOCAL_PROCESS = {"specdeploy.dev/local-process": "true"}
SCRAPE = {"prometheus.io/scrape": "true", "prometheus.io/port": "8000"}
WEB = {
    "name": "web",
    "command": ["python3", "-c", SERVER, "$(SPECDEPLOY_HOST)", "$(SPECDEPLOY_PORT)"],
    # What the operator writes; the process kubelet's local values win.
    "env": [
        {"name": "SPECDEPLOY_HOST", "value": "0.0.0.0"},
        {"name": "SPECDEPLOY_PORT", "value": "8000"},
    ],
    "ports": [{"name": "http", "containerPort": 8000}],
    "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
}


REFUSE = (
    "import os, sys; "
    "open(os.environ['SPECDEPLOY_TERMINATION_LOG'], 'w').write('pair refused: e2e\\n'); "
    "sys.exit(3)"
)


def wait_for(what: str, check: Callable[[], T | None], seconds: float = 90.0) -> T:
    """Poll `check` until it returns something truthy, API and socket errors meaning "not yet"."""
    return eventually(check, seconds, what, retry_on=(ApiException, OSError))


@pytest.fixture
def core(cluster: ClusterEnv, k8s_api: client.ApiClient) -> client.CoreV1Api:
    """The core API, on the local test bed only: elsewhere a real kubelet runs the pods."""
    if not cluster.run_dir:
        pytest.skip("the process kubelet runs only in the local test bed")
    return client.CoreV1Api(k8s_api)


def local_pod(
    name: str, container: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod for the process kubelet: annotated, tolerating the fake nodes' taints."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"specdeploy.dev/name": "pk-demo", "specdeploy.dev/revision": REVISION},
            "annotations": {**LOCAL_PROCESS, **(annotations or {})},
        },
        "spec": {
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 5,
            "securityContext": RESTRICTED_POD_SECURITY,
            "containers": [
                {
                    "image": "specdeploy/engine:e2e",
                    "securityContext": RESTRICTED_CONTAINER_SECURITY,
                    **container,
                }
            ],
            **spec,
        },
    }


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    response: Any = core.read_namespaced_pod(name, namespace, _preload_content=False)
    pod: dict[str, Any] = json.loads(response.data)
    return pod


def pod_when(
    core: client.CoreV1Api, namespace: str, name: str, predicate: Callable[[dict[str, Any]], bool]
) -> Callable[[], dict[str, Any] | None]:
    """A check for wait_for: the pod once `predicate` holds for it."""

    def check() -> dict[str, Any] | None:
        pod = read_pod(core, namespace, name)
        return pod if predicate(pod) else None

    return check


def prometheus_series(url: str, query: str) -> list[dict[str, Any]]:
    address = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    with urllib.request.urlopen(address, timeout=5) as response:
        body = json.loads(response.read())
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def test_server_pod_is_ready_scraped_with_pod_labels_and_stopped_on_delete(
    core: client.CoreV1Api, namespace: str, prometheus_url: str
) -> None:
    pod_manifest = local_pod("web", WEB, SCRAPE)
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod_manifest))

    pod = wait_for("pod web Ready", pod_when(core, namespace, "web", is_ready))
    assert pod["status"]["phase"] == "Running"
    assert pod["status"]["podIP"] == "127.0.0.1"
    (web,) = pod["status"]["containerStatuses"]
    assert web["ready"] is True
    assert web["started"] is True
    assert "startedAt" in web["state"]["running"]
    pid = int(web["containerID"].removeprefix("process://"))
    process = read_identity(pid)
    assert process is not None, "the container's process runs on this host"

    # No PodMonitor selects it: its annotations, with every pod label.
    query = (
        f'demo_requests_total{{namespace="{namespace}",pod="web",job="kubernetes-pods",'
        f'specdeploy_dev_revision="{REVISION}",specdeploy_dev_name="pk-demo"}}'
    )
    (series,) = wait_for(
        "Prometheus to scrape the pod", lambda: prometheus_series(prometheus_url, query)
    )
    assert float(series["value"][1]) >= 1

    core.delete_namespaced_pod("web", namespace)

    def pod_gone() -> bool:
        try:
            read_pod(core, namespace, "web")
        except ApiException as error:
            return bool(error.status == 404)
        return False

    wait_for("pod web to be deleted", pod_gone, seconds=60)
    after = read_identity(pid)
    assert after is None or after.start_ticks != process.start_ticks, "the process was stopped"
    wait_for(
        "the scrape target to go",
        lambda: (
            not any(
                t["labels"].get("pod") == "web" and t["labels"].get("namespace") == namespace
                for t in _active_targets(prometheus_url)
            )
        ),
        seconds=30,
    )


def test_a_pod_monitor_of_the_real_crd_decides_where_and_how_the_pod_is_scraped(
    core: client.CoreV1Api, kubectl: Kubectl, namespace: str, prometheus_url: str
) -> None:
    monitor: dict[str, Any] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": "pk-monitor", "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"specdeploy.dev/name": "pk-demo"}},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
            "podTargetLabels": ["specdeploy.dev/revision"],
        },
    }
    job = f"{namespace}/pk-monitor"

    def pod_targets() -> list[dict[str, Any]]:
        return [
            t
            for t in _active_targets(prometheus_url)
            if t["labels"].get("pod") == "web" and t["labels"].get("namespace") == namespace
        ]

    with served_pod_monitor_crd(kubectl):
        kubectl.apply([monitor])
        # Annotated too: a PodMonitor that selects a pod wins over its annotations. The process
        # kubelet sees the new CRD and its PodMonitor through a watch, as the Prometheus
        # Operator does, so a pod that starts first can be scraped through its annotations
        # for a moment: what is checked is where it settles, the PodMonitor's target alone.
        pod_manifest = local_pod("web", WEB, SCRAPE)
        core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod_manifest))
        wait_for(
            "the PodMonitor's target to be the pod's only one",
            lambda: [t["labels"].get("job") for t in pod_targets()] == [job],
        )
        query = f'demo_requests_total{{namespace="{namespace}",pod="web"}}'

        def scraped_through_the_monitor_only() -> list[dict[str, Any]] | None:
            found = prometheus_series(prometheus_url, query)
            return found if found and all(s["metric"].get("job") == job for s in found) else None

        (series,) = wait_for(
            "Prometheus to scrape the pod through the PodMonitor, and only through it",
            scraped_through_the_monitor_only,
        )
        assert series["metric"] == {
            "__name__": "demo_requests_total",
            "instance": series["metric"]["instance"],
            "namespace": namespace,
            "pod": "web",
            "container": "web",
            "endpoint": "http",
            "job": job,
            "specdeploy_dev_revision": REVISION,
        }

        # A PodMonitor on a port the pod does not declare: no target left at all.
        monitor["spec"]["podMetricsEndpoints"] = [{"port": "metrics", "path": "/metrics"}]
        kubectl.apply([monitor])
        wait_for("the pod's scrape target to go", lambda: not pod_targets(), seconds=30)
    # The CRD and its PodMonitors are gone: the annotations again.
    wait_for(
        "the annotation target back",
        lambda: any(t["labels"].get("job") == "kubernetes-pods" for t in pod_targets()),
        seconds=60,
    )


def _active_targets(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=active", timeout=5) as response:
        targets: list[dict[str, Any]] = json.loads(response.read())["data"]["activeTargets"]
    return targets


def test_exit_code_and_termination_message_reach_the_container_status(
    core: client.CoreV1Api, namespace: str
) -> None:
    container = {"name": "engine", "command": ["python3", "-c", REFUSE]}
    pod_manifest = local_pod("refused", container, restartPolicy="Never")
    core.create_namespaced_pod(namespace, client.V1Pod.model_validate(pod_manifest))

    pod = wait_for(
        "pod refused to fail",
        pod_when(core, namespace, "refused", lambda p: p["status"].get("phase") == "Failed"),
    )
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 3
    assert terminated["reason"] == "Error"
    assert terminated["message"].strip() == "pair refused: e2e"
    assert condition(pod, "Ready").get("status") == "False"


def test_deployment_scale_down_stops_the_removed_pod(
    core: client.CoreV1Api, k8s_api: client.ApiClient, namespace: str
) -> None:
    apps = client.AppsV1Api(k8s_api)
    container = {
        "name": "web",
        "command": ["python3", "-c", SERVER],
        "args": ["$(SPECDEPLOY_HOST)", "$(SPECDEPLOY_PORT)"],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}},
    }
    labels = {"app": "pk-web", "specdeploy.dev/revision": REVISION}
    deployment = client.V1Deployment.model_validate(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "pk-web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "pk-web"}},
                "template": {
                    "metadata": {"labels": labels, "annotations": LOCAL_PROCESS},
                    "spec": local_pod("unused", container)["spec"],
                },
            },
        }
    )
    apps.create_namespaced_deployment(namespace, deployment)

    def ready_pods() -> list[dict[str, Any]] | None:
        response: Any = core.list_namespaced_pod(
            namespace, label_selector="app=pk-web", _preload_content=False
        )
        pods: list[dict[str, Any]] = json.loads(response.data)["items"]
        ready = [p for p in pods if is_ready(p)]
        return pods if len(ready) == len(pods) == 2 else None

    pods = wait_for("two Ready replicas", ready_pods)
    processes = {
        p["metadata"]["name"]: read_identity(
            int(p["status"]["containerStatuses"][0]["containerID"].removeprefix("process://"))
        )
        for p in pods
    }
    assert all(processes.values())

    apps.patch_namespaced_deployment_scale("pk-web", namespace, {"spec": {"replicas": 1}})

    def one_pod_left() -> list[str] | None:
        response: Any = core.list_namespaced_pod(
            namespace, label_selector="app=pk-web", _preload_content=False
        )
        names = [p["metadata"]["name"] for p in json.loads(response.data)["items"]]
        return names if len(names) == 1 else None

    (kept,) = wait_for("the Deployment to scale down to one pod", one_pod_left, seconds=60)
    (removed,) = set(processes) - {kept}
    gone = processes[removed]
    assert gone is not None
    after = read_identity(gone.pid)
    assert after is None or after.start_ticks != gone.start_ticks
    assert read_identity(processes[kept].pid) == processes[kept]  # type: ignore[union-attr]
