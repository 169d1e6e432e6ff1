"""ServiceMonitors on the test bed: which pods they have Prometheus scrape, with which labels.

The Prometheus Operator turns a ServiceMonitor into a scrape job over the endpoints of the
Services it selects (Kubernetes service discovery, role `endpoints`); each endpoint is a pod
behind the Service. Here the Service's pods are found the way the endpoints controller finds
them (its selector, in its namespace; the test bed's pods have 127.0.0.1 for address, which
Endpoints and EndpointSlices refuse, so those objects stay empty), and the port is the
Service port the endpoint names, followed to its `targetPort` in the pod's containers.

Labels as the Prometheus Operator's relabelling makes them (`pkg/prometheus/promcfg.go` at the
pinned version): `namespace`, `service`, `pod`, `container`, `endpoint` (the endpoint's port
name, or its targetPort), `job` (the Service's name, or the value of its `jobLabel` label),
each `targetLabels` label of the Service and `podTargetLabels` label of the pod that is set
(sanitized), and `__metrics_path__` (the endpoint's `path`, default /metrics).

Pure: `service_monitor_target_groups` takes the monitors, the Services and a lookup of the
local port standing in for a container port.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from testbed.process_plan import (
    DEFAULT_METRICS_PATH,
    LOCAL_HOST,
    Container,
    Pod,
    label_selector_matches,
    sanitize_label_name,
)

ServiceMonitor = dict[str, Any]
Service = dict[str, Any]

LocalPort = Callable[[Container, Mapping[str, Any]], "int | None"]
"""`(container, container port)` → the local port standing in for it, or None."""


def monitor_selects_service(monitor: ServiceMonitor, service: Service) -> bool:
    """The ServiceMonitor's namespaces (its own unless `namespaceSelector` says `any` or
    `matchNames`) and its `selector` over the Service's labels."""
    spec = monitor.get("spec") or {}
    namespaces = spec.get("namespaceSelector") or {}
    if not namespaces.get("any"):
        allowed = namespaces.get("matchNames") or [monitor["metadata"]["namespace"]]
        if service["metadata"]["namespace"] not in allowed:
            return False
    return label_selector_matches(spec.get("selector"), service["metadata"].get("labels") or {})


def service_selects_pod(service: Service, pod: Pod) -> bool:
    """As the endpoints controller: same namespace, and a non-empty selector that matches."""
    selector = (service.get("spec") or {}).get("selector") or {}
    if not selector or service["metadata"]["namespace"] != pod["metadata"]["namespace"]:
        return False
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(key) == value for key, value in selector.items())


def _service_port(service: Service, endpoint: Mapping[str, Any]) -> Mapping[str, Any] | None:
    ports = (service.get("spec") or {}).get("ports") or []
    if endpoint.get("port"):
        return next((p for p in ports if p.get("name") == endpoint["port"]), None)
    target = endpoint.get("targetPort")
    if target not in (None, ""):
        return next((p for p in ports if (p.get("targetPort") or p.get("port")) == target), None)
    return None


def _container_port(pod: Pod, target: Any) -> tuple[Container, Mapping[str, Any]] | None:
    """The container and container port a Service's targetPort (name or number) names."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if target in (port.get("name"), port.get("containerPort")):
                return container, port
    return None


def service_monitor_target_groups(
    pod: Pod,
    monitors: Iterable[ServiceMonitor],
    services: Iterable[Service],
    local_port: LocalPort,
) -> list[dict[str, Any]]:
    """The file-SD target groups the ServiceMonitors make of one running pod."""
    metadata = pod["metadata"]
    pod_labels: Mapping[str, str] = metadata.get("labels") or {}
    backing = [s for s in services if service_selects_pod(s, pod)]
    groups: list[dict[str, Any]] = []
    for monitor in sorted(
        monitors, key=lambda m: (m["metadata"]["namespace"], m["metadata"]["name"])
    ):
        spec = monitor.get("spec") or {}
        for service in backing:
            if not monitor_selects_service(monitor, service):
                continue
            service_labels: Mapping[str, str] = service["metadata"].get("labels") or {}
            for endpoint in spec.get("endpoints") or []:
                port = _service_port(service, endpoint)
                if port is None:
                    continue
                found = _container_port(pod, port.get("targetPort") or port.get("port"))
                if found is None:
                    continue
                container, container_port = found
                local = local_port(container, container_port)
                if local is None:
                    continue
                labels = {
                    "namespace": metadata["namespace"],
                    "service": service["metadata"]["name"],
                    "pod": metadata["name"],
                    "container": container["name"],
                    "endpoint": str(endpoint.get("port") or endpoint.get("targetPort")),
                    "job": service["metadata"]["name"],
                }
                job_label = spec.get("jobLabel")
                if job_label and service_labels.get(job_label):
                    labels["job"] = str(service_labels[job_label])
                for key in spec.get("targetLabels") or []:
                    if service_labels.get(key):
                        labels[sanitize_label_name(key)] = str(service_labels[key])
                for key in spec.get("podTargetLabels") or []:
                    if pod_labels.get(key):
                        labels[sanitize_label_name(key)] = str(pod_labels[key])
                labels["__metrics_path__"] = endpoint.get("path") or DEFAULT_METRICS_PATH
                groups.append({"targets": [f"{LOCAL_HOST}:{local}"], "labels": labels})
    return groups
