"""The process kubelet's decisions: what a pod's processes see and what its status says."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from testbed.images import ImageEntry, build_image_command, image_entry_from_dockerfile
from testbed.pod_volumes import (
    IssuedToken,
    PlannedMount,
    PodVolumes,
    container_mounts,
    volume_files,
)
from testbed.process_plan import (
    ContainerConfigError,
    ContainerRecord,
    Hook,
    Running,
    Terminated,
    Waiting,
    adopt_container,
    build_command_line,
    build_container_env,
    build_pod_status,
    build_scrape_target_groups,
    consecutive_crashes_after,
    expand_kubelet_vars,
    grace_after_pre_stop,
    image_pull_error,
    image_pull_waiting,
    is_local_process_pod,
    memory_limit_bytes,
    merge_pod_status,
    pod_phase,
    pre_stop_hook,
    probe_spec,
    record_exited,
    record_started,
    restart_backoff_seconds,
    sanitize_label_name,
    service_link_env,
    should_restart,
    shutdown_grace_seconds,
    startup_probe_failed,
    status_differs,
    stop_grace_seconds,
    termination_message,
)
from testbed.service_monitors import service_monitor_target_groups

REPO = Path(__file__).resolve().parents[1]


def make_pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "engine-0",
            "namespace": "team-a",
            "uid": "u-1",
            "labels": {"specdeploy.dev/revision": "abc123", "app": "engine"},
            "annotations": {"specdeploy.dev/local-process": "true"},
        },
        "spec": {
            "nodeName": "gpu-node-1",
            "containers": [{"name": "engine", "image": "engine:1", "command": ["run"]}],
            **spec,
        },
        "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]},
    }


def no_objects(kind: str, namespace: str, name: str) -> dict[str, str] | None:
    return None


def no_token(pod: dict[str, Any], audience: str | None, seconds: int) -> IssuedToken:
    raise AssertionError("no token was asked for")


# --- $(VAR) expansion, with the cases of kubelet's own expansion tests ----------------------

ENV = {"VAR_A": "A", "VAR_B": "B", "VAR_C": "C", "VAR_EMPTY": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(VAR_A)", "A"),
        ("___$(VAR_B)___", "___B___"),
        ("$(VAR_A)-$(VAR_B)", "A-B"),
        ("$(VAR_A)$(VAR_B)$(VAR_C)", "ABC"),
        ("$$(VAR_B)", "$(VAR_B)"),  # escaped
        ("$$$(VAR_A)", "$A"),
        ("$$$$(VAR_A)", "$$(VAR_A)"),
        ("$(VAR_DNE)", "$(VAR_DNE)"),  # unknown stays as written
        ("$(VAR_EMPTY)", ""),
        ("$(VAR_A", "$(VAR_A"),  # unclosed
        ("$VAR_A", "$VAR_A"),  # not a reference
        ("foo$", "foo$"),
        ("$", "$"),
        ("$()", "$()"),
        ("f00__(VAR_A)__", "f00__(VAR_A)__"),
        ("--port=$(VAR_A)", "--port=A"),
    ],
)
def test_expansion_matches_kubelet(text: str, expected: str) -> None:
    assert expand_kubelet_vars(text, ENV) == expected


def test_local_overrides_win_and_reach_command_line() -> None:
    pod = make_pod()
    container = {
        "name": "engine",
        "command": ["serve"],
        "args": ["--host", "$(SPECDEPLOY_HOST)", "--port", "$(SPECDEPLOY_PORT)", "$$(KEEP)"],
        "env": [
            {"name": "SPECDEPLOY_HOST", "value": "0.0.0.0"},
            {"name": "SPECDEPLOY_PORT", "value": "8000"},
            {"name": "URL", "value": "http://$(SPECDEPLOY_HOST):$(SPECDEPLOY_PORT)/v1"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {
                "name": "REV",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.labels['specdeploy.dev/revision']"}
                },
            },
            {"name": "LATER", "value": "$(DEFINED_AFTER)"},
            {"name": "DEFINED_AFTER", "value": "x"},
        ],
    }
    overrides = {"SPECDEPLOY_HOST": "127.0.0.1", "SPECDEPLOY_PORT": "41234"}
    env = build_container_env(pod, container, overrides, no_objects)
    assert env["SPECDEPLOY_HOST"] == "127.0.0.1"
    assert env["SPECDEPLOY_PORT"] == "41234"
    assert env["URL"] == "http://127.0.0.1:41234/v1"
    assert (env["POD"], env["NS"], env["IP"], env["REV"]) == (
        "engine-0",
        "team-a",
        "127.0.0.1",
        "abc123",
    )
    assert env["LATER"] == "$(DEFINED_AFTER)"  # like kubelet: only earlier variables
    assert build_command_line(container, env) == [
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "41234",
        "$(KEEP)",
    ]


def test_config_map_and_secret_references() -> None:
    objects = {
        ("ConfigMap", "team-a", "settings"): {"MODE": "fast"},
        ("Secret", "team-a", "token"): {"TOKEN": "s3cret"},
    }

    def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return objects.get((kind, namespace, name))

    container = {
        "name": "engine",
        "command": ["run"],
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "token", "key": "TOKEN"}}},
            {
                "name": "OPT",
                "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k", "optional": True}},
            },
        ],
    }
    env = build_container_env(make_pod(), container, {}, lookup)
    assert env["CFG_MODE"] == "fast"
    assert env["T"] == "s3cret"
    assert "OPT" not in env

    container["env"] = [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}}]
    with pytest.raises(ContainerConfigError, match='secret "nope" not found'):
        build_container_env(make_pod(), container, {}, lookup)


# --- Service links, as kubelet's getServiceEnvVarMap and envvars.FromServices ---------------


def service(namespace: str, name: str, ip: str, *ports: tuple[str, int]) -> dict[str, Any]:
    return {
        "metadata": {"namespace": namespace, "name": name},
        "spec": {
            "clusterIP": ip,
            "ports": [{"name": n, "port": port, "protocol": "TCP"} for n, port in ports],
        },
    }


SERVICES = [
    service("team-a", "vllm", "10.96.0.7", ("http", 8000)),
    service("team-a", "chat-api", "10.96.0.8", ("", 80), ("grpc", 9000)),
    service("team-a", "headless", "None", ("http", 8000)),
    service("team-b", "other", "10.96.0.9", ("http", 8000)),
    service("default", "kubernetes", "10.96.0.1", ("https", 443)),
]


def test_service_links_give_every_service_of_the_namespace_and_the_master_service() -> None:
    env = service_link_env(make_pod(), SERVICES)
    # An SD named vllm: its Service's Docker link variable is what vLLM refuses to start with.
    assert env["VLLM_PORT"] == "tcp://10.96.0.7:8000"
    assert env["VLLM_SERVICE_HOST"] == "10.96.0.7"
    assert env["VLLM_SERVICE_PORT"] == env["VLLM_SERVICE_PORT_HTTP"] == "8000"
    assert env["VLLM_PORT_8000_TCP"] == "tcp://10.96.0.7:8000"
    assert env["VLLM_PORT_8000_TCP_PROTO"] == "tcp"
    assert env["VLLM_PORT_8000_TCP_PORT"] == "8000"
    assert env["VLLM_PORT_8000_TCP_ADDR"] == "10.96.0.7"
    # Dashes become underscores; the first port is the unsuffixed one, named ports get theirs.
    assert env["CHAT_API_SERVICE_PORT"] == "80"
    assert env["CHAT_API_SERVICE_PORT_GRPC"] == "9000"
    assert "CHAT_API_SERVICE_PORT_" not in env
    assert env["CHAT_API_PORT"] == "tcp://10.96.0.8:80"
    assert env["CHAT_API_PORT_9000_TCP"] == "tcp://10.96.0.8:9000"
    assert env["KUBERNETES_SERVICE_HOST"] == "10.96.0.1"
    assert env["KUBERNETES_PORT"] == "tcp://10.96.0.1:443"
    # No cluster IP, or another namespace: nothing.
    assert not [k for k in env if k.startswith(("HEADLESS_", "OTHER_"))]


def test_without_service_links_only_the_master_service_remains() -> None:
    env = service_link_env(make_pod(enableServiceLinks=False), SERVICES)
    assert sorted({k.split("_")[0] for k in env}) == ["KUBERNETES"]
    assert service_link_env(make_pod(enableServiceLinks=True), SERVICES)["VLLM_PORT"]


def test_service_links_expand_and_never_override_the_container_env() -> None:
    container = {
        "name": "engine",
        "command": ["run"],
        "env": [
            {"name": "VLLM_PORT", "value": "8000"},
            {"name": "UPSTREAM", "value": "http://$(CHAT_API_SERVICE_HOST):80"},
        ],
    }
    links = service_link_env(make_pod(), SERVICES)
    env = build_container_env(make_pod(), container, {}, no_objects, links)
    assert env["VLLM_PORT"] == "8000"
    assert env["UPSTREAM"] == "http://10.96.0.8:80"
    assert env["VLLM_SERVICE_HOST"] == "10.96.0.7"


# --- Images ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "specdeploy/engine-cpu:local",
        "specdeploy/engine:0.1.0",
        "localhost/specdeploy/operator:0.1.0",
        "localhost/specdeploy-engine-cpu:dev",
        "specdeploy/engine@sha256:" + "0" * 64,
        "specdeploy/engine",
    ],
)
def test_the_images_make_images_builds_are_held(image: str) -> None:
    assert image_pull_error(image) is None


@pytest.mark.parametrize(
    "image",
    [
        "registry.invalid/engine:test",
        "vllm/vllm-openai:v0.11.0",
        "docker.io/specdeploy/engine:0.1.0",
        "registry.example:5000/specdeploy/engine:0.1.0",
        "localhost:5000/specdeploy/engine:0.1.0",
        "specdeploy/engine-gpu:0.1.0",
        "",
    ],
)
def test_any_other_image_fails_to_pull(image: str) -> None:
    error = image_pull_error(image)
    assert error is not None
    assert error.startswith(f'failed to pull image "{image}"')


def test_a_failed_pull_is_err_image_pull_then_image_pull_back_off() -> None:
    image = "registry.invalid/engine:test"
    error = image_pull_error(image) or ""
    assert image_pull_waiting(image, error, False) == Waiting("ErrImagePull", error)
    backing_off = image_pull_waiting(image, error, True)
    assert backing_off.reason == "ImagePullBackOff"
    assert backing_off.message == f'Back-off pulling image "{image}": ErrImagePull: {error}'


# --- Memory limits, hooks, probes ------------------------------------------------------------


def test_memory_limits_in_bytes() -> None:
    assert memory_limit_bytes({"name": "c"}) is None
    assert memory_limit_bytes({"name": "c", "resources": {"requests": {"memory": "1Gi"}}}) is None
    assert memory_limit_bytes({"name": "c", "resources": {"limits": {"memory": "64Mi"}}}) == (
        64 * 1024 * 1024
    )
    assert memory_limit_bytes({"name": "c", "resources": {"limits": {"memory": "2G"}}}) == 2 * 10**9


def test_pre_stop_hooks() -> None:
    assert pre_stop_hook({"name": "c"}) is None
    sleep = {"name": "c", "lifecycle": {"preStop": {"sleep": {"seconds": 5}}}}
    assert pre_stop_hook(sleep) == Hook(kind="sleep", seconds=5.0)
    command = {"name": "c", "lifecycle": {"preStop": {"exec": {"command": ["drain", "-t", "9"]}}}}
    assert pre_stop_hook(command) == Hook(kind="exec", command=("drain", "-t", "9"))
    http = {"name": "c", "lifecycle": {"preStop": {"httpGet": {"path": "/drain", "port": "http"}}}}
    assert pre_stop_hook(http) == Hook(kind="http", path="/drain", port="http")


def test_a_startup_probe_gives_up_after_its_failures_period_apart() -> None:
    container = {
        "name": "engine",
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "initialDelaySeconds": 5,
            "periodSeconds": 10,
            "failureThreshold": 30,
        },
    }
    spec = probe_spec(container, "startupProbe")
    assert spec is not None
    assert not startup_probe_failed(spec, 304.0)
    assert startup_probe_failed(spec, 305.0)


def test_container_without_command_cannot_run() -> None:
    with pytest.raises(ContainerConfigError, match="no command"):
        build_command_line({"name": "engine", "args": ["x"]}, {})


def test_only_annotated_bound_pods_are_ours() -> None:
    pod = make_pod()
    assert is_local_process_pod(pod)
    unbound = make_pod()
    del unbound["spec"]["nodeName"]
    assert not is_local_process_pod(unbound)
    other = make_pod()
    other["metadata"]["annotations"] = {}
    assert not is_local_process_pod(other)


# --- Prometheus targets ---------------------------------------------------------------------


def test_label_names_are_sanitized_like_the_prometheus_operator() -> None:
    assert sanitize_label_name("specdeploy.dev/revision") == "specdeploy_dev_revision"
    assert sanitize_label_name("app.kubernetes.io/managed-by") == "app_kubernetes_io_managed_by"


def served_pod(**annotations: str) -> dict[str, Any]:
    """A running engine pod as the operator builds it: one port named http, labels of its SD."""
    pod = make_pod()
    pod["metadata"]["labels"] = {
        "specdeploy.dev/name": "chat",
        "specdeploy.dev/revision": "abc123",
        "app": "engine",
    }
    pod["metadata"]["annotations"].update(annotations)
    pod["spec"]["containers"] = [
        {"name": "engine", "ports": [{"name": "http", "containerPort": 8000}]},
        {"name": "helper"},  # no port: never a target
    ]
    return pod


def pod_monitor(name: str = "chat", namespace: str = "team-a", **spec: Any) -> dict[str, Any]:
    """The operator's PodMonitor unless `spec` says otherwise."""
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"specdeploy.dev/name": "chat"}},
        "podMetricsEndpoints": [{"port": "http", "path": "/metrics"}],
        "podTargetLabels": ["specdeploy.dev/name", "specdeploy.dev/revision"],
    }
    body.update(spec)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": name, "namespace": namespace},
        "spec": body,
    }


PORTS = {"engine": 41234, "helper": 41235}
ANNOTATED = {
    "prometheus.io/scrape": "true",
    "prometheus.io/port": "8000",
    "prometheus.io/path": "/custom",
}


def test_a_pod_monitor_scrapes_its_port_with_only_its_pod_target_labels() -> None:
    groups = build_scrape_target_groups(served_pod(**ANNOTATED), PORTS, [pod_monitor()])
    assert groups == [
        {
            "targets": ["127.0.0.1:41234"],
            "labels": {
                "namespace": "team-a",
                "pod": "engine-0",
                "container": "engine",
                "endpoint": "http",
                "job": "team-a/chat",
                "specdeploy_dev_name": "chat",
                "specdeploy_dev_revision": "abc123",
                "__metrics_path__": "/metrics",
            },
        }
    ]


def test_a_pod_monitor_on_a_port_the_pod_lacks_leaves_it_unscraped() -> None:
    """The pod is selected, so its annotations do not count, and no port matches."""
    wrong_port = pod_monitor(podMetricsEndpoints=[{"port": "metrics", "path": "/metrics"}])
    assert build_scrape_target_groups(served_pod(**ANNOTATED), PORTS, [wrong_port]) == []


def test_a_pod_monitor_that_does_not_select_the_pod_leaves_the_annotations() -> None:
    other_sd = pod_monitor(selector={"matchLabels": {"specdeploy.dev/name": "other"}})
    other_namespace = pod_monitor(namespace="team-b")
    (group,) = build_scrape_target_groups(
        served_pod(**ANNOTATED), PORTS, [other_sd, other_namespace]
    )
    assert group["labels"]["job"] == "kubernetes-pods"


def test_scrape_annotations_give_every_pod_label_on_the_annotated_port_and_path() -> None:
    pod = served_pod(**ANNOTATED)
    pod["metadata"]["labels"]["pod"] = "impostor"
    assert build_scrape_target_groups(pod, PORTS) == [
        {
            "targets": ["127.0.0.1:41234"],
            "labels": {
                "specdeploy_dev_name": "chat",
                "specdeploy_dev_revision": "abc123",
                "app": "engine",
                "namespace": "team-a",
                "pod": "engine-0",
                "node": "gpu-node-1",
                "job": "kubernetes-pods",
                "__metrics_path__": "/custom",
            },
        }
    ]


def test_without_scrape_annotation_or_pod_monitor_a_pod_is_not_scraped() -> None:
    assert build_scrape_target_groups(served_pod(), PORTS) == []
    assert build_scrape_target_groups(served_pod(**{"prometheus.io/scrape": "false"}), PORTS) == []
    # An annotated port no container declares has no local stand-in.
    other_port = {**ANNOTATED, "prometheus.io/port": "9090"}
    assert build_scrape_target_groups(served_pod(**other_port), PORTS) == []
    # Without a port annotation, each container's declared port; without a path, /metrics.
    (group,) = build_scrape_target_groups(served_pod(**{"prometheus.io/scrape": "true"}), PORTS)
    assert group["targets"] == ["127.0.0.1:41234"]
    assert group["labels"]["__metrics_path__"] == "/metrics"


def test_pod_monitor_selectors_follow_kubernetes_label_selectors() -> None:
    pod = served_pod()

    def selects(selector: dict[str, Any]) -> bool:
        return bool(build_scrape_target_groups(pod, PORTS, [pod_monitor(selector=selector)]))

    assert selects({})
    assert selects({"matchExpressions": [{"key": "app", "operator": "In", "values": ["engine"]}]})
    assert not selects(
        {"matchExpressions": [{"key": "app", "operator": "In", "values": ["router"]}]}
    )
    assert selects({"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["x"]}]})
    assert not selects(
        {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["engine"]}]}
    )
    assert selects({"matchExpressions": [{"key": "app", "operator": "Exists"}]})
    assert not selects({"matchExpressions": [{"key": "app", "operator": "DoesNotExist"}]})
    assert not selects(
        {
            "matchLabels": {"specdeploy.dev/name": "chat"},
            "matchExpressions": [{"key": "tier", "operator": "Exists"}],
        }
    )


def test_pod_monitor_namespaces_are_its_own_unless_it_names_others() -> None:
    pod = served_pod()
    elsewhere = pod_monitor(namespace="monitoring")
    assert build_scrape_target_groups(pod, PORTS, [elsewhere]) == []
    named = pod_monitor(namespace="monitoring", namespaceSelector={"matchNames": ["team-a"]})
    anywhere = pod_monitor(name="all", namespace="monitoring", namespaceSelector={"any": True})
    groups = build_scrape_target_groups(pod, PORTS, [named, anywhere])
    assert [g["labels"]["job"] for g in groups] == ["monitoring/all", "monitoring/chat"]


def test_pod_monitor_ports_by_number_and_job_from_a_pod_label() -> None:
    pod = served_pod()
    by_number = pod_monitor(
        podMetricsEndpoints=[{"portNumber": 8000, "path": "/m"}, {"portNumber": 9000}],
        podTargetLabels=["missing", "app"],
        jobLabel="app",
    )
    (group,) = build_scrape_target_groups(pod, PORTS, [by_number])
    assert group["targets"] == ["127.0.0.1:41234"]
    assert group["labels"] == {
        "namespace": "team-a",
        "container": "engine",
        "pod": "engine-0",
        "app": "engine",
        "job": "engine",
        "__metrics_path__": "/m",
    }
    # No port filter at all: every declared port; the default path.
    (group,) = build_scrape_target_groups(pod, PORTS, [pod_monitor(podMetricsEndpoints=[{}])])
    assert group["labels"]["__metrics_path__"] == "/metrics"
    assert "endpoint" not in group["labels"]


def test_a_container_that_does_not_run_is_no_target() -> None:
    assert build_scrape_target_groups(served_pod(**ANNOTATED), {}, [pod_monitor()]) == []
    assert build_scrape_target_groups(served_pod(**ANNOTATED), {}) == []


# --- Restart policy, messages, grace --------------------------------------------------------


def test_restart_policy_and_backoff_follow_kubelet() -> None:
    assert should_restart("Always", 0)
    assert should_restart("OnFailure", 1)
    assert not should_restart("OnFailure", 0)
    assert not should_restart("Never", 3)
    assert [restart_backoff_seconds(n) for n in (1, 2, 3, 10)] == [10.0, 20.0, 40.0, 300.0]


def test_termination_message_is_the_file_or_the_log_tail_when_asked() -> None:
    container: dict[str, Any] = {"name": "engine"}
    assert termination_message(container, "pair refused\n", 3, "log") == "pair refused\n"
    assert termination_message(container, "", 1, "log") == ""
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    log_text = "".join(f"line {n}\n" for n in range(200))
    message = termination_message(container, "", 1, log_text)
    assert message.endswith("line 199\n")
    assert message.count("\n") == 80
    assert termination_message(container, "", 0, log_text) == ""


def test_stop_grace_is_the_deletions_then_the_pods_then_30_seconds() -> None:
    assert stop_grace_seconds(make_pod()) == 30.0
    assert stop_grace_seconds(make_pod(terminationGracePeriodSeconds=120)) == 120.0
    pod = make_pod(terminationGracePeriodSeconds=120)
    pod["metadata"]["deletionGracePeriodSeconds"] = 0
    assert stop_grace_seconds(pod) == 0.0
    # A preStop hook uses the grace up; SIGTERM still comes 2 s before SIGKILL at least.
    assert grace_after_pre_stop(120.0, 5.0) == 115.0
    assert grace_after_pre_stop(30.0, 29.5) == 2.0
    # When the process kubelet itself stops, containers get at most 10 s.
    assert shutdown_grace_seconds(make_pod(terminationGracePeriodSeconds=120)) == 10.0
    assert shutdown_grace_seconds(make_pod(terminationGracePeriodSeconds=2)) == 2.0


# --- Pod status ------------------------------------------------------------------------------


def record(state: Any, **kw: Any) -> ContainerRecord:
    return ContainerRecord(name=kw.pop("name", "engine"), image="engine:1", state=state, **kw)


DONE_OK = Terminated(0, "Completed", "", "t0", "t1")
DONE_BAD = Terminated(3, "Error", "pair refused", "t0", "t1")


@pytest.mark.parametrize(
    ("policy", "records", "phase"),
    [
        ("Always", [record(Waiting("ContainerCreating"))], "Pending"),
        ("Always", [record(Running("t0"))], "Running"),
        ("Always", [record(Waiting("CrashLoopBackOff"), last_state=DONE_BAD)], "Running"),
        ("Never", [record(DONE_BAD)], "Failed"),
        ("Never", [record(DONE_OK)], "Succeeded"),
        ("OnFailure", [record(DONE_OK)], "Succeeded"),
        ("Never", [record(DONE_OK), record(Running("t0"), name="b")], "Running"),
    ],
)
def test_pod_phase_follows_kubelet(policy: str, records: list[ContainerRecord], phase: str) -> None:
    assert pod_phase(policy, records) == phase


def test_running_ready_pod_status() -> None:
    pod = make_pod()
    status = build_pod_status(pod, [record(Running("t0"), ready=True, started=True)], "t0")
    assert status["phase"] == "Running"
    assert status["podIP"] == "127.0.0.1"
    assert status["podIPs"] == [{"ip": "127.0.0.1"}]
    (container,) = status["containerStatuses"]
    assert container["ready"] is True
    assert container["started"] is True
    assert container["state"] == {"running": {"startedAt": "t0"}}
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions == {
        "PodReadyToStartContainers": "True",
        "Initialized": "True",
        "Ready": "True",
        "ContainersReady": "True",
    }


def test_readiness_gates_hold_ready_back() -> None:
    pod = make_pod(readinessGates=[{"conditionType": "example.com/gate"}])
    status = build_pod_status(pod, [record(Running("t0"), ready=True)], "t0")
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ReadinessGatesNotReady")


def test_failed_pod_shows_exit_code_and_message() -> None:
    pod = make_pod(restartPolicy="Never")
    status = build_pod_status(pod, [record(DONE_BAD)], "t0")
    assert status["phase"] == "Failed"
    terminated = status["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"], terminated["message"]) == (
        3,
        "Error",
        "pair refused",
    )


def test_merge_keeps_foreign_conditions_and_transition_times() -> None:
    current = {
        "phase": "Running",
        "qosClass": "BestEffort",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "t-sched"},
            {"type": "Ready", "status": "True", "lastTransitionTime": "t-ready"},
            {"type": "ContainersReady", "status": "False", "lastTransitionTime": "t-old"},
        ],
    }
    owned = {
        "phase": "Running",
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "ContainersReady", "status": "True"},
        ],
    }
    merged = merge_pod_status(current, owned, "t-now")
    times = {c["type"]: c["lastTransitionTime"] for c in merged["conditions"]}
    assert times == {"PodScheduled": "t-sched", "Ready": "t-ready", "ContainersReady": "t-now"}
    assert merged["qosClass"] == "BestEffort"
    assert status_differs(current, merged)
    stored = {**merged, "conditions": [dict(c) for c in merged["conditions"]]}
    for condition in stored["conditions"]:
        condition.pop("lastProbeTime", None)  # the API server drops nulls
    assert not status_differs(stored, merge_pod_status(stored, owned, "t-later"))


def test_adoption_never_adopts_a_process() -> None:
    container = {"name": "engine", "image": "engine:1", "command": ["run"]}
    pod = make_pod()
    pod["status"]["containerStatuses"] = [
        {"name": "engine", "restartCount": 2, "state": {"running": {"startedAt": "t0"}}}
    ]
    restarted = adopt_container(pod, container, "Always", "t9")
    assert restarted.run
    assert restarted.record.restart_count == 2
    assert restarted.record.last_state is not None
    assert restarted.record.last_state.exit_code == 137

    never = adopt_container(pod, container, "Never", "t9")
    assert not never.run
    assert isinstance(never.record.state, Terminated)

    pod["status"]["containerStatuses"] = []
    fresh = adopt_container(pod, container, "Never", "t9")
    assert fresh.run
    assert fresh.record.last_state is None


def test_restart_count_counts_every_start_after_the_first() -> None:
    pod = make_pod()
    fresh = record(Waiting("ContainerCreating"))
    first = record_started(
        fresh, "t0", "process://1", has_readiness_probe=True, has_startup_probe=False
    )
    assert (first.restart_count, first.ready, first.started) == (0, False, True)

    crashed = record_exited(pod, first, DONE_BAD, restart_in=10.0)
    assert isinstance(crashed.state, Waiting)
    assert crashed.state.reason == "CrashLoopBackOff"
    assert "back-off 10s restarting failed container=engine pod=engine-0_team-a(u-1)" in (
        crashed.state.message
    )
    assert crashed.last_state == DONE_BAD
    assert not crashed.ready

    second = record_started(
        crashed, "t2", "process://2", has_readiness_probe=False, has_startup_probe=False
    )
    assert (second.restart_count, second.ready, second.last_state) == (1, True, DONE_BAD)

    final = record_exited(pod, second, DONE_OK, restart_in=None)
    assert final.state == DONE_OK
    assert final.restart_count == 1


def test_back_off_is_forgotten_after_a_long_run() -> None:
    assert consecutive_crashes_after(3, ran_for_seconds=5) == 4
    assert consecutive_crashes_after(3, ran_for_seconds=3600) == 1


# --- images and volumes -----------------------------------------------------------------------


def test_command_and_args_combine_with_the_images_entry_point_as_kubernetes_says() -> None:
    image = ImageEntry(entrypoint=("/venv/bin/specdeploy",), cmd=("operator", "run"))
    assert build_image_command([], [], image) == ["/venv/bin/specdeploy", "operator", "run"]
    assert build_image_command([], ["operator", "run", "--config", "c"], image) == [
        "/venv/bin/specdeploy",
        "operator",
        "run",
        "--config",
        "c",
    ]
    assert build_image_command(["sh", "-c"], ["true"], image) == ["sh", "-c", "true"]
    assert build_image_command(["sh"], [], image) == ["sh"]
    assert build_image_command([], ["x"], None) == []


def test_the_operator_images_entry_comes_from_its_dockerfile() -> None:
    dockerfile = (REPO / "images" / "operator" / "Dockerfile").read_text()
    entry = image_entry_from_dockerfile(dockerfile, {"specdeploy": "/venv/bin/specdeploy"})
    assert entry.entrypoint == ("/venv/bin/specdeploy",)
    assert entry.cmd == ("operator", "run")
    assert entry.env == {"PYTHONUNBUFFERED": "1"}
    with pytest.raises(ValueError, match="no local stand-in"):
        image_entry_from_dockerfile(dockerfile, {})
    with pytest.raises(ValueError, match="exec form"):
        image_entry_from_dockerfile('ENTRYPOINT specdeploy "x"\n', {"specdeploy": "s"})


def test_volume_files_as_kubelet_writes_them() -> None:
    objects = {
        ("ConfigMap", "team-a", "settings"): {"config.yaml": "a: 1\n", "other": "x"},
        ("ConfigMap", "team-a", "kube-root-ca.crt"): {"ca.crt": "PEM"},
        ("Secret", "team-a", "creds"): {"token": "s3cret"},
    }

    def lookup(kind: str, namespace: str, name: str) -> dict[str, str] | None:
        return objects.get((kind, namespace, name))

    asked: list[tuple[str | None, int]] = []

    def token(pod: dict[str, Any], audience: str | None, seconds: int) -> IssuedToken:
        asked.append((audience, seconds))
        return IssuedToken("jwt", 1000.0)

    pod = make_pod()
    container = {"name": "engine"}
    config = volume_files(
        pod,
        container,
        {
            "name": "c",
            "configMap": {
                "name": "settings",
                "items": [{"key": "config.yaml", "path": "d/c.yaml"}],
            },
        },
        lookup,
        token,
    )
    assert {k: v.content for k, v in config.files.items()} == {"d/c.yaml": b"a: 1\n"}
    secret = volume_files(
        pod,
        container,
        {"name": "s", "secret": {"secretName": "creds", "defaultMode": 0o400}},
        lookup,
        token,
    )
    assert secret.files["token"].mode == 0o400
    projected = volume_files(
        pod,
        container,
        {
            "name": "p",
            "projected": {
                "sources": [
                    {
                        "serviceAccountToken": {
                            "path": "token",
                            "audience": "vault",
                            "expirationSeconds": 600,
                        }
                    },
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
                                    "fieldRef": {"fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ]
            },
        },
        lookup,
        token,
    )
    assert {k: v.content for k, v in projected.files.items()} == {
        "token": b"jwt",
        "ca.crt": b"PEM",
        "namespace": b"team-a",
    }
    assert asked == [("vault", 600)]
    assert projected.refresh_after == pytest.approx(800.0)  # 80 % of the token's life
    with pytest.raises(ContainerConfigError, match='configmap "gone" not found'):
        volume_files(pod, container, {"name": "g", "configMap": {"name": "gone"}}, lookup, token)
    optional = {"name": "g", "configMap": {"name": "gone", "optional": True}}
    assert volume_files(pod, container, optional, lookup, token).files == {}


def test_only_supported_volumes_are_mounted_and_subpaths_are_refused() -> None:
    pod = make_pod()
    pod["spec"]["volumes"] = [
        {"name": "config", "configMap": {"name": "c"}},
        {"name": "models", "persistentVolumeClaim": {"claimName": "m"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": "/etc/c", "readOnly": True},
        {"name": "models", "mountPath": "/models"},
    ]
    container = {"name": "engine", "volumeMounts": mounts}
    assert container_mounts(pod, container) == [PlannedMount("config", "/etc/c", True)]
    mounts[0]["subPath"] = "x"
    with pytest.raises(ContainerConfigError, match="subPath"):
        container_mounts(pod, container)


def test_a_memory_backed_empty_dir_is_a_folder_on_the_hosts_tmpfs(tmp_path: Path) -> None:
    pod = make_pod()
    pod["spec"]["volumes"] = [
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "scratch", "emptyDir": {}},
    ]
    mounts = [PlannedMount("dshm", "/dev/shm", False), PlannedMount("scratch", "/tmp", False)]
    pod_folder, memory = tmp_path / "pods" / "team-a_engine-0_u-1", tmp_path / "shm"
    volumes = PodVolumes(pod_folder, memory_root=memory)
    volumes.fill(pod, pod["spec"]["containers"][0], mounts, no_objects, no_token)
    assert volumes.path("dshm") == memory / "specdeploy-pod-volumes.team-a_engine-0_u-1" / "dshm"
    assert volumes.path("scratch") == pod_folder / "volumes" / "scratch"
    assert volumes.path("dshm").is_dir()
    assert volumes.path("scratch").is_dir()
    volumes.remove()
    assert not (memory / "specdeploy-pod-volumes.team-a_engine-0_u-1").exists()
    assert not (pod_folder / "volumes").exists()


def test_a_service_monitor_scrapes_the_pods_behind_the_services_it_selects() -> None:
    pod = make_pod()
    pod["metadata"]["labels"] = {"app": "op", "tier": "x"}
    pod["spec"]["containers"] = [
        {
            "name": "operator",
            "ports": [
                {"name": "probes", "containerPort": 8080},
                {"name": "metrics", "containerPort": 8081},
            ],
        }
    ]
    service: dict[str, Any] = {
        "metadata": {"name": "op", "namespace": "team-a", "labels": {"app": "op", "team": "t"}},
        "spec": {
            "selector": {"app": "op"},
            "ports": [{"name": "metrics", "port": 9000, "targetPort": "metrics"}],
        },
    }
    monitor: dict[str, Any] = {
        "metadata": {"name": "op", "namespace": "team-a"},
        "spec": {
            "selector": {"matchLabels": {"app": "op"}},
            "endpoints": [{"port": "metrics", "path": "/m"}],
            "targetLabels": ["team"],
            "podTargetLabels": ["tier"],
        },
    }

    def local(container: dict[str, Any], port: Mapping[str, Any]) -> int | None:
        return {8080: 41000, 8081: 41001}.get(port["containerPort"])

    groups = service_monitor_target_groups(pod, [monitor], [service], local)
    assert groups == [
        {
            "targets": ["127.0.0.1:41001"],
            "labels": {
                "namespace": "team-a",
                "service": "op",
                "pod": pod["metadata"]["name"],
                "container": "operator",
                "endpoint": "metrics",
                "job": "op",
                "team": "t",
                "tier": "x",
                "__metrics_path__": "/m",
            },
        }
    ]
    other_namespace = {**monitor, "metadata": {"name": "op", "namespace": "elsewhere"}}
    assert service_monitor_target_groups(pod, [other_namespace], [service], local) == []
    unselected = {**service, "spec": {**service["spec"], "selector": {"app": "other"}}}
    assert service_monitor_target_groups(pod, [monitor], [unselected], local) == []
