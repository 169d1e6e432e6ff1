"""The process kubelet's decisions, free of side effects.

Everything the process kubelet decides about a pod lives here, so it can be tested without a
cluster or a process: which pods are ours, which images the test bed holds, the environment and
command line of a container (kubelet's `$(VAR)` expansion, service links), the Prometheus file-SD
target groups (from PodMonitors or scrape annotations), the restart policy and back-off, memory
limits, lifecycle hooks and grace periods, and the pod status a kubelet would write (phase,
conditions, container statuses).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Final, Literal

from kubernetes.utils import quantity

from testbed.images import ImageEntry, build_image_command

# The client's parse_quantity is untyped; this is its documented signature.
parse_quantity: Callable[[object], Decimal] = quantity.parse_quantity

Pod = dict[str, Any]
Container = dict[str, Any]

LOCAL_PROCESS_ANNOTATION: Final = "specdeploy.dev/local-process"
METRICS_PATH_ANNOTATION: Final = "prometheus.io/path"
DEFAULT_METRICS_PATH: Final = "/metrics"
LOCAL_HOST: Final = "127.0.0.1"

HOST_ENV: Final = "SPECDEPLOY_HOST"
PORT_ENV: Final = "SPECDEPLOY_PORT"
TERMINATION_LOG_ENV: Final = "SPECDEPLOY_TERMINATION_LOG"

DEFAULT_TERMINATION_MESSAGE_PATH: Final = "/dev/termination-log"
# kubelet reads at most 4 KiB of the termination message file, and with
# FallbackToLogsOnError the last 80 lines / 2 KiB of the log.
TERMINATION_MESSAGE_LIMIT: Final = 4096
FALLBACK_LOG_LINES: Final = 80
FALLBACK_LOG_BYTES: Final = 2048

# kubelet's crash-loop back-off: 10 s doubling to 5 min, forgotten after a run of 10 min.
BACKOFF_INITIAL_SECONDS: Final = 10.0
BACKOFF_MAX_SECONDS: Final = 300.0
BACKOFF_RESET_AFTER_SECONDS: Final = 600.0

DEFAULT_GRACE_SECONDS: Final = 30.0
#: What a container still gets after its preStop hook used up the grace period (kubelet's
#: minimumGracePeriodInSeconds).
MIN_GRACE_AFTER_PRE_STOP_SECONDS: Final = 2.0
#: The grace of containers stopped because the process kubelet itself stops (not a pod
#: deletion): bounded, so a test bed shuts down in seconds.
SHUTDOWN_GRACE_SECONDS: Final = 10.0
#: A container killed for exceeding its memory limit: SIGKILL, as the kernel's OOM killer.
OOM_EXIT_CODE: Final = 137


class PodConditionType:
    """The pod conditions a kubelet owns (PodScheduled belongs to the scheduler)."""

    READY_TO_START_CONTAINERS: Final = "PodReadyToStartContainers"
    INITIALIZED: Final = "Initialized"
    CONTAINERS_READY: Final = "ContainersReady"
    READY: Final = "Ready"


OWNED_CONDITION_TYPES: Final = (
    PodConditionType.READY_TO_START_CONTAINERS,
    PodConditionType.INITIALIZED,
    PodConditionType.READY,
    PodConditionType.CONTAINERS_READY,
)


class ContainerReason:
    """The reasons kubelet uses in container states, and in pod conditions."""

    CONTAINER_CREATING: Final = "ContainerCreating"
    ERR_IMAGE_PULL: Final = "ErrImagePull"
    IMAGE_PULL_BACK_OFF: Final = "ImagePullBackOff"
    OOM_KILLED: Final = "OOMKilled"
    CRASH_LOOP_BACK_OFF: Final = "CrashLoopBackOff"
    CREATE_CONTAINER_CONFIG_ERROR: Final = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR: Final = "CreateContainerError"
    START_ERROR: Final = "StartError"
    COMPLETED: Final = "Completed"
    ERROR: Final = "Error"
    CONTAINERS_NOT_READY: Final = "ContainersNotReady"
    READINESS_GATES_NOT_READY: Final = "ReadinessGatesNotReady"
    POD_COMPLETED: Final = "PodCompleted"


# --- Which pods are ours -------------------------------------------------------------------


def is_local_process_pod(pod: Pod) -> bool:
    """True when the pod asks to be run as local processes and the scheduler has bound it."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    bound = bool((pod.get("spec") or {}).get("nodeName"))
    return annotations.get(LOCAL_PROCESS_ANNOTATION) == "true" and bound


def is_terminal(pod: Pod) -> bool:
    """True when the pod's phase can never change again."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def is_being_deleted(pod: Pod) -> bool:
    """True once the pod has a deletionTimestamp."""
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def pod_key(pod: Pod) -> str:
    """`<namespace>/<name>` for logs."""
    metadata = pod["metadata"]
    return f"{metadata['namespace']}/{metadata['name']}"


def pod_folder_name(pod: Pod) -> str:
    """The pod's folder name in the run folder: unique per pod object, readable by people."""
    metadata = pod["metadata"]
    return f"{metadata['namespace']}_{metadata['name']}_{metadata['uid']}"


def stop_grace_seconds(pod: Pod) -> float:
    """The grace period of a stopping pod, as kubelet takes it: the deletion's
    (`deletionGracePeriodSeconds`), else `terminationGracePeriodSeconds`, else 30 s. The preStop
    hooks run within it; what they leave is the time between SIGTERM and SIGKILL."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    grace = metadata.get("deletionGracePeriodSeconds")
    if grace is None:
        grace = spec.get("terminationGracePeriodSeconds")
    if grace is None:
        grace = DEFAULT_GRACE_SECONDS
    return max(0.0, float(grace))


def grace_after_pre_stop(grace: float, pre_stop_seconds: float) -> float:
    """The time between SIGTERM and SIGKILL once the preStop hook took `pre_stop_seconds` of
    the grace period: the rest, but never under kubelet's 2 s minimum."""
    return max(MIN_GRACE_AFTER_PRE_STOP_SECONDS, grace - pre_stop_seconds)


def shutdown_grace_seconds(pod: Pod) -> float:
    """The grace of a container stopped because the process kubelet stops: the pod's own,
    at most 10 s (no preStop hook runs then: the pod is not being deleted)."""
    return min(stop_grace_seconds(pod), SHUTDOWN_GRACE_SECONDS)


# --- Images ----------------------------------------------------------------------------------

#: The images this test bed's nodes hold: the ones `make images` builds, by their local names
#: (no registry, or podman's `localhost/`), any tag or digest. They are all this repository's
#: code, which runs here from the project's and the engine's virtualenvs (a container gives its
#: command; see build_command_line). A container of any other image fails to pull, as on a node
#: that has not got the image and can reach no registry that serves it.
LOCAL_IMAGE_REPOSITORIES: Final = frozenset(
    {
        "specdeploy/operator",
        "specdeploy/engine",
        "specdeploy/engine-cpu",
        "specdeploy-operator",
        "specdeploy-engine",
        "specdeploy-engine-cpu",
    }
)
LOCAL_REGISTRY: Final = "localhost"


def image_registry_and_repository(image: str) -> tuple[str | None, str]:
    """(registry host or None, repository path) of an image reference, without tag or digest.

    As container runtimes read a reference: the first path component is a registry host when
    it holds a `.` or a `:` or is `localhost`."""
    name = image.split("@", 1)[0]
    head, _, rest = name.partition("/")
    registry: str | None = None
    if rest and ("." in head or ":" in head or head == LOCAL_REGISTRY):
        registry, name = head, rest
    last_slash = name.rfind("/")
    colon = name.rfind(":")
    if colon > last_slash:
        name = name[:colon]
    return registry, name


def image_pull_error(image: str) -> str | None:
    """Why a pull of `image` fails on the test bed, or None when its nodes hold the image."""
    registry, repository = image_registry_and_repository(image)
    if image and registry in (None, LOCAL_REGISTRY) and repository in LOCAL_IMAGE_REPOSITORIES:
        return None
    held = ", ".join(sorted(LOCAL_IMAGE_REPOSITORIES))
    return (
        f'failed to pull image "{image}": not found: the test bed\'s nodes hold only the '
        f"images make images builds ({held}) and reach no registry"
    )


def image_pull_waiting(image: str, error: str, backing_off: bool) -> Waiting:
    """The container's waiting state after a failed pull: ErrImagePull right after the
    attempt, ImagePullBackOff while kubelet waits to try again (its back-off, as for crashes:
    10 s doubling to 5 min)."""
    if backing_off:
        return Waiting(
            ContainerReason.IMAGE_PULL_BACK_OFF,
            f'Back-off pulling image "{image}": {ContainerReason.ERR_IMAGE_PULL}: {error}',
        )
    return Waiting(ContainerReason.ERR_IMAGE_PULL, error)


# --- Memory limits ---------------------------------------------------------------------------


def memory_limit_bytes(container: Container) -> int | None:
    """The container's memory limit in bytes (`resources.limits.memory`), or None."""
    raw = ((container.get("resources") or {}).get("limits") or {}).get("memory")
    if raw is None:
        return None
    return int(parse_quantity(raw))


# --- Lifecycle hooks -------------------------------------------------------------------------


@dataclass(frozen=True)
class Hook:
    """A container's preStop handler, reduced to what the process kubelet runs."""

    kind: Literal["exec", "http", "sleep"]
    command: tuple[str, ...] = ()
    path: str = "/"
    port: int | str | None = None
    scheme: str = "HTTP"
    seconds: float = 0.0


def pre_stop_hook(container: Container) -> Hook | None:
    """The container's `lifecycle.preStop` (exec, httpGet or sleep), or None."""
    handler = (container.get("lifecycle") or {}).get("preStop") or {}
    if "exec" in handler:
        return Hook(kind="exec", command=tuple(handler["exec"].get("command") or []))
    if "httpGet" in handler:
        http = handler["httpGet"]
        return Hook(
            kind="http",
            path=http.get("path") or "/",
            port=http.get("port"),
            scheme=(http.get("scheme") or "HTTP").upper(),
        )
    if "sleep" in handler:
        return Hook(kind="sleep", seconds=float(handler["sleep"].get("seconds") or 0))
    return None


# --- Environment and command line ------------------------------------------------------------


def expand_kubelet_vars(text: str, env: Mapping[str, str]) -> str:
    """Expand `$(VAR)` references as kubelet does for command, args and env values.

    `$$` is an escaped `$`; a reference to an unknown variable, an unclosed `$(` and a `$`
    followed by anything else stay as written. A port of Kubernetes'
    third_party/forked/golang/expansion.Expand.
    """
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            following = text[cursor + 1]
            if following == "$":
                out.append("$")
                advance = 1
            elif following == "(":
                closer = text.find(")", cursor + 2)
                if closer == -1:
                    out.append("$(")
                    advance = 1
                else:
                    name = text[cursor + 2 : closer]
                    out.append(env.get(name, f"$({name})"))
                    advance = closer - cursor
            else:
                out.append("$" + following)
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    out.append(text[checkpoint:])
    return "".join(out)


class ContainerConfigError(Exception):
    """The container cannot be started as configured (kubelet's CreateContainerConfigError)."""


ObjectDataLookup = Callable[[str, str, str], "dict[str, str] | None"]
"""`(kind, namespace, name)` → the decoded data of a ConfigMap or Secret, None when missing."""


_LABEL_OR_ANNOTATION_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref_value(pod: Pod, field_path: str) -> str:
    """The value of a downward-API `fieldRef`, as seen by a process on this host."""
    metadata = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple: dict[str, str] = {
        "metadata.name": metadata.get("name", ""),
        "metadata.namespace": metadata.get("namespace", ""),
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": LOCAL_HOST,
        "status.podIPs": LOCAL_HOST,
        "status.hostIP": LOCAL_HOST,
        "status.hostIPs": LOCAL_HOST,
    }
    if field_path in simple:
        return simple[field_path]
    match = _LABEL_OR_ANNOTATION_REF.match(field_path)
    if match:
        values = metadata.get(match.group(1)) or {}
        return str(values.get(match.group(2), ""))
    if field_path in ("metadata.labels", "metadata.annotations"):
        values = metadata.get(field_path.split(".")[1]) or {}
        return "\n".join(f'{key}="{value}"' for key, value in sorted(values.items()))
    raise ContainerConfigError(f"unsupported fieldRef {field_path!r}")


def resource_field_value(container: Container, ref: Mapping[str, Any]) -> str:
    """The value of a downward-API `resourceFieldRef` (requests/limits of this container).

    A limit the container does not set is reported as 0 rather than the node's allocatable,
    which the process kubelet does not know.
    """
    resource: str = ref["resource"]
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    quantity = parse_quantity(raw) if raw is not None else parse_quantity(0)
    divisor = parse_quantity(ref.get("divisor") or 1)
    value = -(-quantity // divisor)  # kubelet rounds up
    return str(int(value))


def _env_from_source(
    source: Mapping[str, Any], namespace: str, lookup: ObjectDataLookup
) -> dict[str, str]:
    for kind, ref_key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
        ref = source.get(ref_key)
        if ref is None:
            continue
        data = lookup(kind, namespace, ref["name"])
        if data is None:
            if ref.get("optional"):
                return {}
            raise ContainerConfigError(f'{kind.lower()} "{ref["name"]}" not found')
        prefix = source.get("prefix") or ""
        return {prefix + key: value for key, value in data.items()}
    return {}


def _env_value(
    pod: Pod,
    container: Container,
    item: Mapping[str, Any],
    env: Mapping[str, str],
    lookup: ObjectDataLookup,
) -> str | None:
    if "valueFrom" not in item:
        return expand_kubelet_vars(item.get("value") or "", env)
    source = item["valueFrom"]
    if "fieldRef" in source:
        return field_ref_value(pod, source["fieldRef"]["fieldPath"])
    if "resourceFieldRef" in source:
        return resource_field_value(container, source["resourceFieldRef"])
    for kind, ref_key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
        ref = source.get(ref_key)
        if ref is None:
            continue
        data = lookup(kind, pod["metadata"]["namespace"], ref["name"])
        if data is not None and ref["key"] in data:
            return data[ref["key"]]
        if ref.get("optional"):
            return None
        if data is None:
            raise ContainerConfigError(f'{kind.lower()} "{ref["name"]}" not found')
        raise ContainerConfigError(
            f"couldn't find key {ref['key']} in {kind} {pod['metadata']['namespace']}/{ref['name']}"
        )
    raise ContainerConfigError(f"unsupported valueFrom in env {item.get('name')!r}")


def build_container_env(
    pod: Pod,
    container: Container,
    overrides: Mapping[str, str],
    lookup: ObjectDataLookup,
    service_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's environment as kubelet would build it, with the local overrides.

    `envFrom` first, then `env` in order, each value expanded against the variables defined
    before it and the service links (`service_env`, from service_link_env); then every service
    link variable the container did not define itself. The overrides (`SPECDEPLOY_HOST`,
    `SPECDEPLOY_PORT`, ...) are defined first and win over the container's own values, so
    `$(SPECDEPLOY_PORT)` always means the local port. Raises ContainerConfigError when a
    referenced ConfigMap, Secret or key is missing.
    """
    namespace = pod["metadata"]["namespace"]
    services = dict(service_env or {})
    env: dict[str, str] = {"HOSTNAME": pod["metadata"]["name"], **overrides}
    for source in container.get("envFrom") or []:
        for name, value in _env_from_source(source, namespace, lookup).items():
            if name not in overrides:
                env[name] = value
    for item in container.get("env") or []:
        name = item["name"]
        if name in overrides:
            continue
        item_value = _env_value(pod, container, item, {**services, **env}, lookup)
        if item_value is not None:
            env[name] = item_value
    for name, value in services.items():
        env.setdefault(name, value)
    return env


# --- Service links ---------------------------------------------------------------------------

#: The Services whose variables every pod gets, enableServiceLinks or not: (namespace, name).
MASTER_SERVICE: Final = ("default", "kubernetes")


def _service_env_name(name: str) -> str:
    return name.upper().replace("-", "_")


def _has_cluster_ip(service: Mapping[str, Any]) -> bool:
    ip = (service.get("spec") or {}).get("clusterIP")
    return bool(ip) and ip != "None"


def _service_variables(service: Mapping[str, Any]) -> dict[str, str]:
    """One Service's variables, as kubelet's envvars.FromServices makes them."""
    spec = service.get("spec") or {}
    ports = spec.get("ports") or []
    if not ports:
        return {}
    ip = str(spec["clusterIP"])
    prefix = _service_env_name(service["metadata"]["name"])
    out = {f"{prefix}_SERVICE_HOST": ip, f"{prefix}_SERVICE_PORT": str(ports[0]["port"])}
    for port in ports:
        if port.get("name"):
            out[f"{prefix}_SERVICE_PORT_{_service_env_name(port['name'])}"] = str(port["port"])
    for index, port in enumerate(ports):
        protocol = str(port.get("protocol") or "TCP")
        number = int(port["port"])
        host_port = f"[{ip}]:{number}" if ":" in ip else f"{ip}:{number}"
        url = f"{protocol.lower()}://{host_port}"
        if index == 0:
            # Docker's link variables: the first port is also `<NAME>_PORT`.
            out[f"{prefix}_PORT"] = url
        port_prefix = f"{prefix}_PORT_{number}_{protocol.upper()}"
        out[port_prefix] = url
        out[f"{port_prefix}_PROTO"] = protocol.lower()
        out[f"{port_prefix}_PORT"] = str(number)
        out[f"{port_prefix}_ADDR"] = ip
    return out


def service_link_env(pod: Pod, services: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The Service variables kubelet puts into every container of `pod` (`getServiceEnvVarMap`
    and `envvars.FromServices`): the `kubernetes` Service of `default` always, and, while
    `spec.enableServiceLinks` is true or unset, every Service of the pod's namespace that has
    a cluster IP: `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORT NAME>]`, and Docker's link
    variables `<NAME>_PORT=tcp://<ip>:<port>`, `<NAME>_PORT_<port>_TCP[_PROTO|_PORT|_ADDR]`.

    So a Service named `vllm` gives its namespace's pods `VLLM_PORT=tcp://...`, which vLLM reads
    as its own setting.
    """
    namespace = pod["metadata"]["namespace"]
    links = (pod.get("spec") or {}).get("enableServiceLinks")
    by_name: dict[str, Mapping[str, Any]] = {}
    for service in services:
        if not _has_cluster_ip(service):
            continue
        metadata = service.get("metadata") or {}
        key = (metadata.get("namespace"), metadata.get("name"))
        if key == MASTER_SERVICE:
            by_name.setdefault(str(key[1]), service)
        elif key[0] == namespace and links is not False:
            by_name[str(key[1])] = service
    env: dict[str, str] = {}
    for service in by_name.values():
        env.update(_service_variables(service))
    return env


def build_command_line(
    container: Container, env: Mapping[str, str], image: ImageEntry | None = None
) -> list[str]:
    """command + args with `$(VAR)` expanded, the image's ENTRYPOINT and CMD standing in for
    what the container leaves out (`images.build_image_command`). A container without command
    whose image the image map does not know cannot run here."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    argv = build_image_command(command, args, image)
    if not argv:
        raise ContainerConfigError(
            f"container {container['name']!r} has no command and the process kubelet's image "
            f"map has no entry point for its image {container.get('image')!r}"
        )
    return [expand_kubelet_vars(part, env) for part in argv]


# --- Prometheus file service discovery ---------------------------------------------------


_NOT_LABEL_CHARACTER = re.compile(r"[^a-zA-Z0-9_]")


def sanitize_label_name(name: str) -> str:
    """A Kubernetes label key as a Prometheus label name, the way Prometheus' operator does it."""
    return _NOT_LABEL_CHARACTER.sub("_", name)


def scrape_target_file_name(pod: Pod) -> str:
    """The pod's file in the file-SD folder (`*.json`, one per pod)."""
    return pod_folder_name(pod) + ".json"


PodMonitor = dict[str, Any]

SCRAPE_ANNOTATION: Final = "prometheus.io/scrape"
PORT_ANNOTATION: Final = "prometheus.io/port"
#: The job of annotation-discovered pods, as in Prometheus' example Kubernetes configuration.
ANNOTATION_JOB: Final = "kubernetes-pods"


def label_selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels and matchExpressions) selects `labels`.

    An empty selector selects everything; NotIn and DoesNotExist select a missing label.
    """
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        present = key in labels
        if operator == "In" and not (present and labels[key] in values):
            return False
        if operator == "NotIn" and present and labels[key] in values:
            return False
        if operator == "Exists" and not present:
            return False
        if operator == "DoesNotExist" and present:
            return False
    return True


def pod_monitor_selects(monitor: PodMonitor, pod: Pod) -> bool:
    """Whether the PodMonitor discovers the pod: its namespaces (its own unless
    `namespaceSelector` says `any` or `matchNames`) and its `selector`."""
    spec = monitor.get("spec") or {}
    namespaces = spec.get("namespaceSelector") or {}
    pod_namespace = pod["metadata"]["namespace"]
    if not namespaces.get("any"):
        allowed = namespaces.get("matchNames") or [monitor["metadata"]["namespace"]]
        if pod_namespace not in allowed:
            return False
    return label_selector_matches(spec.get("selector"), pod["metadata"].get("labels") or {})


def _local_port(container: Container, container_ports: Mapping[str, int]) -> int | None:
    """The local port standing in for the container's first declared port (the only one the
    process kubelet makes reachable), or None when it declares none or does not run."""
    if not (container.get("ports") or []) or container["name"] not in container_ports:
        return None
    return container_ports[container["name"]]


def _endpoint_port_matches(endpoint: Mapping[str, Any], port: Mapping[str, Any]) -> bool:
    """The Prometheus Operator's port filter: `port` (name), else `portNumber`, else the
    deprecated `targetPort` (name or number); none of them keeps every port."""
    if endpoint.get("port"):
        return bool(port.get("name") == endpoint["port"])
    if endpoint.get("portNumber"):
        return bool(port.get("containerPort") == endpoint["portNumber"])
    target = endpoint.get("targetPort")
    if isinstance(target, str) and target:
        return bool(port.get("name") == target)
    if isinstance(target, int) and target:
        return bool(port.get("containerPort") == target)
    return True


def pod_monitor_target_groups(
    monitor: PodMonitor, pod: Pod, container_ports: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The targets one PodMonitor makes of a pod it selects, labelled as the Prometheus
    Operator's relabelling does: `namespace`, `container`, `pod`, each `podTargetLabels` label
    the pod has (sanitized), `job` = `<namespace>/<name>` (or the pod's `jobLabel` label),
    `endpoint` = the endpoint's port name, and `__metrics_path__` = its `path`."""
    metadata = pod["metadata"]
    pod_labels: Mapping[str, str] = metadata.get("labels") or {}
    spec = monitor.get("spec") or {}
    groups: list[dict[str, Any]] = []
    for endpoint in spec.get("podMetricsEndpoints") or []:
        for container in pod["spec"].get("containers") or []:
            local = _local_port(container, container_ports)
            if local is None or not _endpoint_port_matches(endpoint, container["ports"][0]):
                continue
            labels = {
                "namespace": metadata["namespace"],
                "container": container["name"],
                "pod": metadata["name"],
            }
            for key in spec.get("podTargetLabels") or []:
                if pod_labels.get(key):
                    labels[sanitize_label_name(key)] = str(pod_labels[key])
            labels["job"] = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
            job_label = spec.get("jobLabel")
            if job_label and pod_labels.get(job_label):
                labels["job"] = str(pod_labels[job_label])
            target = endpoint.get("targetPort")
            if endpoint.get("port"):
                labels["endpoint"] = str(endpoint["port"])
            elif target not in (None, ""):
                labels["endpoint"] = str(target)
            labels["__metrics_path__"] = endpoint.get("path") or DEFAULT_METRICS_PATH
            groups.append({"targets": [f"{LOCAL_HOST}:{local}"], "labels": labels})
    return groups


def annotation_target_groups(pod: Pod, container_ports: Mapping[str, int]) -> list[dict[str, Any]]:
    """The targets of a pod annotated `prometheus.io/scrape: "true"`, as Prometheus' example
    `kubernetes-pods` job makes them: on the `prometheus.io/port` annotation (else every
    declared port) and `prometheus.io/path` (else `/metrics`), with every pod label (sanitized)
    and then `namespace`, `pod` and `node`; `job` is `kubernetes-pods`."""
    metadata = pod["metadata"]
    annotations = metadata.get("annotations") or {}
    if annotations.get(SCRAPE_ANNOTATION) != "true":
        return []
    wanted = annotations.get(PORT_ANNOTATION)
    targets: list[str] = []
    for container in pod["spec"].get("containers") or []:
        local = _local_port(container, container_ports)
        if local is None:
            continue
        if wanted and str(container["ports"][0].get("containerPort")) != wanted:
            continue
        target = f"{LOCAL_HOST}:{local}"
        if target not in targets:
            targets.append(target)
    if not targets:
        return []
    labels = {
        sanitize_label_name(key): str(value)
        for key, value in (metadata.get("labels") or {}).items()
    }
    labels.update(
        {
            "namespace": metadata["namespace"],
            "pod": metadata["name"],
            "node": str(pod["spec"].get("nodeName") or ""),
            "job": ANNOTATION_JOB,
            "__metrics_path__": annotations.get(METRICS_PATH_ANNOTATION) or DEFAULT_METRICS_PATH,
        }
    )
    return [{"targets": [target], "labels": dict(labels)} for target in targets]


def build_scrape_target_groups(
    pod: Pod, container_ports: Mapping[str, int], pod_monitors: Iterable[PodMonitor] = ()
) -> list[dict[str, Any]]:
    """File-SD target groups for a running pod, found the way a cluster's Prometheus finds them.

    Every PodMonitor that selects the pod contributes its endpoints' targets
    (pod_monitor_target_groups). Only when none selects it do the `prometheus.io/*` annotations
    count (annotation_target_groups). A pod that no PodMonitor selects and no annotation asks
    for is not scraped, nor is a pod that PodMonitors select on ports it does not declare. Container
    ports map to the local ports in `container_ports` (container name → port).
    """
    selecting = sorted(
        (m for m in pod_monitors if pod_monitor_selects(m, pod)),
        key=lambda m: (m["metadata"]["namespace"], m["metadata"]["name"]),
    )
    if not selecting:
        return annotation_target_groups(pod, container_ports)
    groups: list[dict[str, Any]] = []
    for monitor in selecting:
        groups.extend(pod_monitor_target_groups(monitor, pod, container_ports))
    return groups


# --- Probes --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeSpec:
    """One probe of a container, reduced to what the process kubelet runs."""

    kind: Literal["http", "tcp", "exec", "unsupported"]
    path: str = "/"
    scheme: str = "HTTP"
    headers: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] = ()
    initial_delay_seconds: float = 0.0
    timeout_seconds: float = 1.0
    success_threshold: int = 1
    failure_threshold: int = 3
    period_seconds: float = 10.0


def probe_spec(container: Container, which: str) -> ProbeSpec | None:
    """The container's `readinessProbe` / `startupProbe`, or None when it has none."""
    probe = container.get(which)
    if not probe:
        return None
    common: dict[str, Any] = {
        "initial_delay_seconds": float(probe.get("initialDelaySeconds") or 0),
        "period_seconds": float(probe.get("periodSeconds") or 10),
        "timeout_seconds": float(probe.get("timeoutSeconds") or 1),
        "success_threshold": int(probe.get("successThreshold") or 1),
        "failure_threshold": int(probe.get("failureThreshold") or 3),
    }
    if "httpGet" in probe:
        http = probe["httpGet"]
        headers = tuple((h["name"], h["value"]) for h in http.get("httpHeaders") or [])
        return ProbeSpec(
            kind="http",
            path=http.get("path") or "/",
            scheme=(http.get("scheme") or "HTTP").upper(),
            headers=headers,
            **common,
        )
    if "tcpSocket" in probe:
        return ProbeSpec(kind="tcp", **common)
    if "exec" in probe:
        return ProbeSpec(kind="exec", command=tuple(probe["exec"].get("command") or []), **common)
    return ProbeSpec(kind="unsupported", **common)


def startup_probe_failed(spec: ProbeSpec, alive_for: float) -> bool:
    """Whether a startup probe that has not passed once gives up on a container that has run
    `alive_for` seconds: kubelet kills it after `failureThreshold` failures `periodSeconds`
    apart from `initialDelaySeconds` on. (The process kubelet probes every second; what counts
    is the time the spec allows for the start, which is what a startup probe is sized for.)"""
    return alive_for >= spec.initial_delay_seconds + spec.period_seconds * spec.failure_threshold


@dataclass
class ProbeTracker:
    """Turns a stream of probe results into kubelet's verdict, with its thresholds."""

    spec: ProbeSpec
    passing: bool = False
    successes: int = 0
    failures: int = 0

    def record(self, success: bool) -> bool:
        """Record one result; returns the verdict after it."""
        if success:
            self.successes += 1
            self.failures = 0
            if self.successes >= self.spec.success_threshold:
                self.passing = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= self.spec.failure_threshold:
                self.passing = False
        return self.passing


# --- Container and pod status ------------------------------------------------------------


@dataclass(frozen=True)
class Waiting:
    reason: str
    message: str = ""


@dataclass(frozen=True)
class Running:
    started_at: str


@dataclass(frozen=True)
class Terminated:
    exit_code: int
    reason: str
    message: str
    started_at: str
    finished_at: str
    container_id: str = ""


ContainerState = Waiting | Running | Terminated


@dataclass(frozen=True)
class ContainerRecord:
    """What the process kubelet knows about one container now."""

    name: str
    image: str
    state: ContainerState
    last_state: Terminated | None = None
    restart_count: int = 0
    ready: bool = False
    started: bool = False
    container_id: str = ""


def exit_reason(exit_code: int) -> str:
    """kubelet's reason for a terminated container."""
    return ContainerReason.COMPLETED if exit_code == 0 else ContainerReason.ERROR


def should_restart(restart_policy: str, exit_code: int) -> bool:
    """Whether kubelet restarts a container that exited with this code under this policy."""
    if restart_policy == "Never":
        return False
    if restart_policy == "OnFailure":
        return exit_code != 0
    return True


def restart_backoff_seconds(consecutive_crashes: int) -> float:
    """kubelet's crash-loop delay before the next start after `consecutive_crashes` (>= 1)."""
    exponent = max(0, consecutive_crashes - 1)
    return min(BACKOFF_MAX_SECONDS, BACKOFF_INITIAL_SECONDS * 2.0**exponent)


def termination_message(container: Container, file_text: str, exit_code: int, log_tail: str) -> str:
    """The container status message: the termination file, or the log tail when asked for."""
    message = file_text[:TERMINATION_MESSAGE_LIMIT]
    policy = container.get("terminationMessagePolicy") or "File"
    if not message and exit_code != 0 and policy == "FallbackToLogsOnError":
        lines = log_tail.splitlines(keepends=True)[-FALLBACK_LOG_LINES:]
        message = "".join(lines)[-FALLBACK_LOG_BYTES:]
    return message


def record_started(
    record: ContainerRecord,
    started_at: str,
    container_id: str,
    *,
    has_readiness_probe: bool,
    has_startup_probe: bool,
) -> ContainerRecord:
    """The record once a container (re)starts. Every start after the first counts as a restart;
    without probes a running container is started and ready at once."""
    has_run_before = record.last_state is not None or isinstance(record.state, Terminated)
    return replace(
        record,
        state=Running(started_at),
        last_state=record.state if isinstance(record.state, Terminated) else record.last_state,
        restart_count=record.restart_count + (1 if has_run_before else 0),
        ready=not (has_readiness_probe or has_startup_probe),
        started=not has_startup_probe,
        container_id=container_id,
    )


def record_exited(
    pod: Pod, record: ContainerRecord, ended: Terminated, restart_in: float | None
) -> ContainerRecord:
    """The record after an exit: terminated, or, when it restarts in `restart_in` seconds,
    waiting in CrashLoopBackOff with the exit as its last state."""
    if restart_in is None:
        return replace(record, state=ended, ready=False, started=False)
    waiting = Waiting(
        ContainerReason.CRASH_LOOP_BACK_OFF, crash_loop_message(pod, record.name, restart_in)
    )
    return replace(record, state=waiting, last_state=ended, ready=False, started=False)


def consecutive_crashes_after(previous: int, ran_for_seconds: float) -> int:
    """kubelet forgets earlier crashes once a container ran long enough."""
    return 1 if ran_for_seconds > BACKOFF_RESET_AFTER_SECONDS else previous + 1


def crash_loop_message(pod: Pod, container_name: str, delay: float) -> str:
    metadata = pod["metadata"]
    return (
        f"back-off {int(delay)}s restarting failed container={container_name} "
        f"pod={metadata['name']}_{metadata['namespace']}({metadata['uid']})"
    )


def _state_dict(state: ContainerState) -> dict[str, Any]:
    if isinstance(state, Waiting):
        waiting: dict[str, Any] = {"reason": state.reason}
        if state.message:
            waiting["message"] = state.message
        return {"waiting": waiting}
    if isinstance(state, Running):
        return {"running": {"startedAt": state.started_at}}
    terminated: dict[str, Any] = {
        "exitCode": state.exit_code,
        "reason": state.reason,
        "startedAt": state.started_at,
        "finishedAt": state.finished_at,
    }
    if state.message:
        terminated["message"] = state.message
    if state.container_id:
        terminated["containerID"] = state.container_id
    return {"terminated": terminated}


def container_status(record: ContainerRecord) -> dict[str, Any]:
    """One entry of status.containerStatuses."""
    status: dict[str, Any] = {
        "name": record.name,
        "image": record.image,
        "imageID": "",
        "ready": record.ready,
        "started": record.started,
        "restartCount": record.restart_count,
        "state": _state_dict(record.state),
        "lastState": _state_dict(record.last_state) if record.last_state else {},
    }
    if record.container_id:
        status["containerID"] = record.container_id
    return status


def pod_phase(restart_policy: str, records: Iterable[ContainerRecord]) -> str:
    """The pod phase from its containers, following kubelet's getPhase."""
    running = stopped = succeeded = waiting = 0
    for record in records:
        state = record.state
        if isinstance(state, Running):
            running += 1
        elif isinstance(state, Terminated):
            stopped += 1
            if state.exit_code == 0:
                succeeded += 1
        elif record.last_state is not None:
            stopped += 1
        else:
            waiting += 1
    if waiting > 0:
        return "Pending"
    if running > 0:
        return "Running"
    if stopped > 0:
        if restart_policy == "Always":
            return "Running"
        if stopped == succeeded:
            return "Succeeded"
        if restart_policy == "Never":
            return "Failed"
        return "Running"
    return "Pending"


def _condition(type_: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    condition: dict[str, Any] = {"type": type_, "status": "True" if ok else "False"}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def build_conditions(pod: Pod, records: list[ContainerRecord], phase: str) -> list[dict[str, Any]]:
    """The kubelet-owned pod conditions, without timestamps (merge_pod_status adds them)."""
    terminal = phase in ("Succeeded", "Failed")
    unready = [record.name for record in records if not record.ready]
    if terminal:
        containers_ready = _condition(
            PodConditionType.CONTAINERS_READY, False, ContainerReason.POD_COMPLETED
        )
    elif unready:
        containers_ready = _condition(
            PodConditionType.CONTAINERS_READY,
            False,
            ContainerReason.CONTAINERS_NOT_READY,
            f"containers with unready status: [{' '.join(unready)}]",
        )
    else:
        containers_ready = _condition(PodConditionType.CONTAINERS_READY, True)

    gates = [gate["conditionType"] for gate in (pod.get("spec") or {}).get("readinessGates") or []]
    current = {
        c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []
    }
    closed_gates = [gate for gate in gates if current.get(gate) != "True"]
    if containers_ready["status"] != "True":
        ready = {**containers_ready, "type": PodConditionType.READY}
    elif closed_gates:
        ready = _condition(
            PodConditionType.READY,
            False,
            ContainerReason.READINESS_GATES_NOT_READY,
            f"corresponding condition of pod readiness gate {closed_gates[0]!r} does not exist or "
            "is not True",
        )
    else:
        ready = _condition(PodConditionType.READY, True)

    return [
        _condition(PodConditionType.READY_TO_START_CONTAINERS, not terminal),
        _condition(
            PodConditionType.INITIALIZED, True, ContainerReason.POD_COMPLETED if terminal else ""
        ),
        ready,
        containers_ready,
    ]


def build_pod_status(pod: Pod, records: list[ContainerRecord], start_time: str) -> dict[str, Any]:
    """The part of status.* the process kubelet owns, computed from its container records."""
    phase = pod_phase((pod.get("spec") or {}).get("restartPolicy") or "Always", records)
    return {
        "phase": phase,
        "conditions": build_conditions(pod, records, phase),
        "hostIP": LOCAL_HOST,
        "hostIPs": [{"ip": LOCAL_HOST}],
        "podIP": LOCAL_HOST,
        "podIPs": [{"ip": LOCAL_HOST}],
        "startTime": start_time,
        "containerStatuses": [container_status(record) for record in records],
    }


def merge_pod_status(
    current: Mapping[str, Any], owned: Mapping[str, Any], now: str
) -> dict[str, Any]:
    """The whole new status: `owned` over `current`, keeping conditions others own.

    A condition keeps its lastTransitionTime while its status does not change.
    """
    previous = {c.get("type"): c for c in current.get("conditions") or []}
    owned_types = {c["type"] for c in owned.get("conditions") or []}
    conditions: list[dict[str, Any]] = [
        c for c in current.get("conditions") or [] if c.get("type") not in owned_types
    ]
    for condition in owned.get("conditions") or []:
        before = previous.get(condition["type"])
        if before is not None and before.get("status") == condition["status"]:
            since = before.get("lastTransitionTime") or now
        else:
            since = now
        conditions.append({**condition, "lastProbeTime": None, "lastTransitionTime": since})
    return {**current, **owned, "conditions": conditions}


def status_differs(current: Mapping[str, Any], merged: Mapping[str, Any]) -> bool:
    """Whether writing `merged` would change anything (ignoring keys the server drops)."""

    def normal(status: Mapping[str, Any]) -> dict[str, Any]:
        conditions = [
            {k: v for k, v in c.items() if v is not None and k != "lastProbeTime"}
            for c in status.get("conditions") or []
        ]
        return {
            **{k: v for k, v in status.items() if v is not None},
            "conditions": sorted(conditions, key=lambda c: str(c.get("type"))),
        }

    return normal(current) != normal(merged)


# --- Adopting a pod that a previous process kubelet ran ------------------------------------


@dataclass
class AdoptedContainer:
    """Where a container starts when the process kubelet (re)takes a pod."""

    record: ContainerRecord
    run: bool
    consecutive_crashes: int = field(default=0)


def _terminated_from(raw: Mapping[str, Any]) -> Terminated:
    return Terminated(
        exit_code=int(raw.get("exitCode") or 0),
        reason=raw.get("reason") or "",
        message=raw.get("message") or "",
        started_at=raw.get("startedAt") or "",
        finished_at=raw.get("finishedAt") or "",
        container_id=raw.get("containerID") or "",
    )


def adopt_container(
    pod: Pod, container: Container, restart_policy: str, now: str
) -> AdoptedContainer:
    """Starting point for a container given what its status already says.

    Processes are never adopted: a container the status shows running belonged to a previous
    process kubelet whose children are gone, so it counts as killed (exit 137). Whether it
    runs again then follows the restart policy, as after any exit.
    """
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    image = container.get("image") or ""
    raw = statuses.get(container["name"])
    fresh = ContainerRecord(
        name=container["name"], image=image, state=Waiting(ContainerReason.CONTAINER_CREATING)
    )
    if raw is None:
        return AdoptedContainer(fresh, run=True)
    state = raw.get("state") or {}
    last_raw = (raw.get("lastState") or {}).get("terminated")
    last = _terminated_from(last_raw) if last_raw else None
    restart_count = int(raw.get("restartCount") or 0)
    if "running" in state:
        ended: Terminated | None = Terminated(
            exit_code=137,
            reason=ContainerReason.ERROR,
            message="the process kubelet restarted; the previous process is gone",
            started_at=state["running"].get("startedAt") or now,
            finished_at=now,
            container_id=raw.get("containerID") or "",
        )
    elif "terminated" in state:
        ended = _terminated_from(state["terminated"])
    else:
        ended = last
    if ended is None:
        return AdoptedContainer(replace(fresh, restart_count=restart_count), run=True)
    if should_restart(restart_policy, ended.exit_code):
        record = replace(fresh, last_state=ended, restart_count=restart_count)
        return AdoptedContainer(record, run=True, consecutive_crashes=1)
    record = ContainerRecord(
        name=container["name"],
        image=image,
        state=ended,
        last_state=last,
        restart_count=restart_count,
        container_id=ended.container_id,
    )
    return AdoptedContainer(record, run=False)
