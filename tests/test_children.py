"""The Deployment, Service and PodMonitor of a SpeculativeDeployment, as the cluster holds them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import MemoryBreakdown, SizingDecision, SpeculativeDeployment
from specdeploy.plan.children.manifests import (
    build_pod_monitor,
    build_pod_template,
    build_revision_deployment,
    build_service,
    pod_selector,
)
from specdeploy.plan.children.revision import revision_hash
from specdeploy.plan.children.vllm_args import Role, build_vllm_args
from specdeploy.plan.placement.kueue import kueue_labels
from specdeploy.plan.placement.sizing import size_pair

BODY: dict[str, Any] = {
    "apiVersion": "specdeploy.dev/v1alpha1",
    "kind": "SpeculativeDeployment",
    "metadata": {"name": "llama8b", "namespace": "serving", "uid": "uid-1", "generation": 3},
    "spec": {
        "replicas": 2,
        "pair": {
            "version": "3.1",
            "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "revision": "abc"},
            "draft": {
                "method": "eagle3",
                "model": "org/head",
                "revision": "def",
                "numSpeculativeTokens": 3,
            },
        },
        "engine": {
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "INFO"}],
            "resources": {"cpu": 8, "memory": "64Gi"},
        },
        "modelSource": {"hub": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}},
        "placement": {
            "queue": "interactive",
            "priorityClass": "high",
            "nodeSelector": {"pool": "serving"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
        },
    },
}
SIZING = SizingDecision(
    resourceName="nvidia.com/gpu",
    count=2,
    tensorParallelSize=2,
    nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
)


@pytest.fixture
def sd() -> SpeculativeDeployment:
    return SpeculativeDeployment.from_body(BODY)


def _engine(deployment: dict[str, Any]) -> dict[str, Any]:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def test_deployment_is_named_and_selected_by_revision(sd: SpeculativeDeployment) -> None:
    deployment = build_revision_deployment(sd, "0123456789", SIZING, OperatorConfig(), replicas=2)
    assert deployment["metadata"]["name"] == "llama8b-0123456789"
    assert deployment["metadata"]["namespace"] == "serving"
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["selector"] == {
        "matchLabels": {
            "specdeploy.dev/name": "llama8b",
            "specdeploy.dev/revision": "0123456789",
        }
    }
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert template_labels == {
        "app.kubernetes.io/managed-by": "specdeploy",
        "specdeploy.dev/name": "llama8b",
        "specdeploy.dev/revision": "0123456789",
        "specdeploy.dev/pair-version": "3.1",
    }
    labels = deployment["metadata"]["labels"]
    assert labels["kueue.x-k8s.io/queue-name"] == "interactive"
    assert labels["kueue.x-k8s.io/priority-class"] == "high"
    assert "kueue.x-k8s.io/queue-name" not in template_labels
    assert deployment["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "specdeploy.dev/v1alpha1",
            "kind": "SpeculativeDeployment",
            "name": "llama8b",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def test_engine_container_runs_the_pair(sd: SpeculativeDeployment) -> None:
    config = OperatorConfig(engineImage="reg.example/engine:1", engineCommand=["specdeploy-engine"])
    engine = _engine(build_revision_deployment(sd, "0123456789", SIZING, config))
    assert engine["name"] == "engine"
    assert engine["image"] == "reg.example/engine:1"
    assert engine["command"] == ["specdeploy-engine"]
    assert engine["args"] == ["serve", "--", *build_vllm_args(sd.spec, SIZING)]
    assert engine["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert engine["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    env = {item["name"]: item for item in engine["env"]}
    assert env["SPECDEPLOY_HOST"]["value"] == "0.0.0.0"
    assert env["SPECDEPLOY_PORT"]["value"] == "8000"
    assert json.loads(env["SPECDEPLOY_PAIR"]["value"]) == {
        "version": "3.1",
        "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "revision": "abc"},
        "draft": {"method": "eagle3", "model": "org/head", "revision": "def"},
        "revision": "0123456789",
    }
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert env["VLLM_LOGGING_LEVEL"]["value"] == "INFO"
    assert engine["resources"] == {
        "requests": {"cpu": "8", "memory": "64Gi"},
        "limits": {"cpu": "8", "memory": "64Gi", "nvidia.com/gpu": 2},
    }


def test_pod_lands_where_sizing_and_placement_say(sd: SpeculativeDeployment) -> None:
    pod = build_revision_deployment(sd, "0123456789", SIZING, OperatorConfig())["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "pool": "serving",
    }
    assert pod["spec"]["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    # Tensor parallel 2: shared memory for the workers, 2 GiB a GPU.
    dshm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}
    assert dshm in pod["spec"]["volumes"]
    assert "specdeploy.dev/local-process" not in pod["metadata"]["annotations"]


def test_local_process_annotation_follows_the_config(sd: SpeculativeDeployment) -> None:
    config = OperatorConfig(localProcess=True)
    pod = build_revision_deployment(sd, "0123456789", None, config)["spec"]["template"]
    assert pod["metadata"]["annotations"]["specdeploy.dev/local-process"] == "true"
    # No sizing (a CPU engine): no GPU resource at all.
    limits = _engine({"spec": {"template": pod}})["resources"]["limits"]
    assert not [name for name in limits if name.startswith("nvidia.com/")]


def test_pvc_source_is_mounted_read_only() -> None:
    body = {**BODY, "spec": {**BODY["spec"], "modelSource": {"pvc": {"claimName": "models"}}}}
    sd = SpeculativeDeployment.from_body(body)
    pod = build_revision_deployment(sd, "0123456789", None, OperatorConfig())["spec"]["template"]
    assert pod["spec"]["volumes"][0] == {
        "name": "models",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    }
    assert _engine({"spec": {"template": pod}})["volumeMounts"][0] == {
        "name": "models",
        "mountPath": "/models",
        "readOnly": True,
    }


@pytest.mark.parametrize(
    ("sizing", "role", "size"),
    [
        pytest.param(None, "leader", "1Gi", id="cpu-engine"),
        pytest.param(
            SIZING.model_copy(update={"count": 1, "tensor_parallel_size": 1}),
            "leader",
            "2Gi",
            id="one-gpu",
        ),
        pytest.param(SIZING, "leader", "4Gi", id="tensor-parallel"),
        pytest.param(SIZING, "worker", "4Gi", id="worker-of-a-group"),
    ],
)
def test_every_engine_pod_has_shared_memory_beyond_the_runtimes_64_mib(
    sd: SpeculativeDeployment, sizing: SizingDecision | None, role: Role, size: str
) -> None:
    pod = build_pod_template(sd, "abc", sizing, OperatorConfig(), role)
    # Bounded (its pages count against the memory limit); unbounded in a schema-2 revision.
    dshm = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": size}}
    assert dshm in pod["spec"]["volumes"]
    old = build_pod_template(sd, "abc", sizing, OperatorConfig(), role, schema=2)
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in old["spec"]["volumes"]
    (container,) = pod["spec"]["containers"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_service_selects_every_revision(sd: SpeculativeDeployment) -> None:
    service = build_service(sd)
    assert service["metadata"]["name"] == "llama8b"
    assert service["spec"]["selector"] == {"specdeploy.dev/name": "llama8b"}
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    assert pod_selector(sd) == "specdeploy.dev/name=llama8b"


def test_pod_monitor_copies_revision_into_metrics(sd: SpeculativeDeployment) -> None:
    monitor = build_pod_monitor(sd)
    assert monitor["spec"]["podTargetLabels"] == ["specdeploy.dev/name", "specdeploy.dev/revision"]
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics"}]
    assert monitor["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "specdeploy",
        "specdeploy.dev/name": "llama8b",
    }


def test_pod_monitor_carries_the_labels_prometheus_selects_by(sd: SpeculativeDeployment) -> None:
    config = OperatorConfig.from_mapping({"podMonitorLabels": {"release": "kps"}})
    monitor = build_pod_monitor(sd, config.pod_monitor_labels)
    assert monitor["metadata"]["labels"] == {
        "release": "kps",
        "app.kubernetes.io/managed-by": "specdeploy",
        "specdeploy.dev/name": "llama8b",
    }


@pytest.mark.parametrize(
    ("labels", "problem"),
    [
        ({"specdeploy.dev/name": "x"}, "set by the operator itself"),
        ({"app.kubernetes.io/managed-by": "helm"}, "set by the operator itself"),
        ({"bad key!": "x"}, "not a valid label key"),
        ({"release": "-starts-with-a-dash"}, "not a valid label value"),
        ({"release": "x" * 64}, "not a valid label value"),
    ],
)
def test_pod_monitor_labels_are_refused_when_invalid_or_the_operators_own(
    labels: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        OperatorConfig.from_mapping({"podMonitorLabels": labels})


def test_kueue_labels_only_when_set(sd: SpeculativeDeployment) -> None:
    assert kueue_labels(sd.spec) == {
        "kueue.x-k8s.io/queue-name": "interactive",
        "kueue.x-k8s.io/priority-class": "high",
    }
    bare = sd.spec.model_copy(
        update={
            "placement": sd.spec.placement.model_copy(
                update={"queue": None, "priority_class": None}
            )
        }
    )
    assert kueue_labels(bare) == {}


def test_child_of_an_unsaved_resource_is_refused(sd: SpeculativeDeployment) -> None:
    unsaved = sd.model_copy(update={"metadata": sd.metadata.model_copy(update={"uid": None})})
    with pytest.raises(ValueError, match="no uid"):
        build_service(unsaved)


# --- model cache, ephemeral storage, pod options, CPU serving ------------------------------------

WEIGHED = SIZING.model_copy(
    update={
        "memory": MemoryBreakdown(
            targetWeightsGiB=14.96,
            draftWeightsGiB=0.78,
            kvCacheGiB=8.25,
            overheadGiB=2.0,
            requiredGiB=28.25,
            perDeviceGiB=14.1,
        )
    }
)


def _with(**spec: Any) -> SpeculativeDeployment:
    return SpeculativeDeployment.from_body({**BODY, "spec": {**BODY["spec"], **spec}})


def _pod(sd: SpeculativeDeployment, sizing: SizingDecision | None = WEIGHED) -> dict[str, Any]:
    template: dict[str, Any] = build_revision_deployment(
        sd, "0123456789", sizing, OperatorConfig()
    )["spec"]["template"]
    return template


def _env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in _engine({"spec": {"template": pod}})["env"]}


def test_hub_downloads_without_a_cache_request_ephemeral_storage_for_the_weights(
    sd: SpeculativeDeployment,
) -> None:
    pod = _pod(sd)
    requests = _engine({"spec": {"template": pod}})["resources"]["requests"]
    # (14.96 + 0.78) x 1.1 + 1 = 18.3 -> 19Gi; a request only: a limit would evict the pod.
    assert requests["ephemeral-storage"] == "19Gi"
    assert "ephemeral-storage" not in _engine({"spec": {"template": pod}})["resources"]["limits"]
    assert "HF_HOME" not in _env_of(pod)


def test_weights_on_a_volume_need_no_ephemeral_storage() -> None:
    pod = _pod(_with(modelSource={"pvc": {"claimName": "models"}}))
    assert "ephemeral-storage" not in _engine({"spec": {"template": pod}})["resources"]["requests"]


def test_a_cache_claim_is_mounted_as_the_hub_cache() -> None:
    pod = _pod(_with(modelCache={"claimName": "hf-cache"}))
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in pod[
        "spec"
    ]["volumes"]
    engine = _engine({"spec": {"template": pod}})
    assert {"name": "model-cache", "mountPath": "/var/cache/specdeploy/huggingface"} in engine[
        "volumeMounts"
    ]
    env = _env_of(pod)
    assert env["HF_HOME"] == "/var/cache/specdeploy/huggingface"
    assert env["HF_HUB_CACHE"] == "/var/cache/specdeploy/huggingface/hub"
    assert "ephemeral-storage" not in engine["resources"]["requests"]


def test_an_ephemeral_cache_is_a_generic_ephemeral_volume() -> None:
    pod = _pod(_with(modelCache={"ephemeral": {"size": "200Gi", "storageClassName": "fast"}}))
    [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "model-cache"]
    assert volume["ephemeral"] == {
        "volumeClaimTemplate": {
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "200Gi"}},
                "storageClassName": "fast",
            }
        }
    }


def test_pod_options_reach_the_pod_template_beside_the_operators_own() -> None:
    sd = _with(
        pod={
            "labels": {"team": "search"},
            "annotations": {"sidecar.istio.io/inject": "false"},
            "serviceAccountName": "llm",
            "imagePullSecrets": [{"name": "registry"}],
            "priorityClassName": "serving-high",
        }
    )
    pod = _pod(sd)
    assert pod["metadata"]["labels"]["team"] == "search"
    assert pod["metadata"]["labels"]["specdeploy.dev/name"] == "llama8b"
    assert pod["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
    assert pod["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    assert pod["spec"]["serviceAccountName"] == "llm"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["spec"]["priorityClassName"] == "serving-high"
    # Kueue's WorkloadPriorityClass stays a label of the Deployment.
    deployment = build_revision_deployment(sd, "0123456789", WEIGHED, OperatorConfig())
    assert deployment["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"


def test_pod_options_are_in_the_revision_hash() -> None:
    plain = _with()
    labelled = _with(pod={"labels": {"team": "search"}})
    cached = _with(modelCache={"claimName": "hf-cache"})
    hashes = {revision_hash(s.spec, WEIGHED, OperatorConfig()) for s in (plain, labelled, cached)}
    assert len(hashes) == 3


def test_cpu_serving_uses_the_cpu_image_and_host_memory_and_no_gpu() -> None:
    spec = {**BODY["spec"], "placement": {"device": "CPU"}, "engine": {}}
    sd = SpeculativeDeployment.from_body({**BODY, "spec": spec})
    sizing = size_pair(sd.spec, [], OperatorConfig())
    assert isinstance(sizing, SizingDecision)
    config = OperatorConfig(engineCpuImage="specdeploy/engine-cpu:test")
    pod = build_revision_deployment(sd, "0123456789", sizing, config)["spec"]["template"]
    engine = _engine({"spec": {"template": pod}})
    assert engine["image"] == "specdeploy/engine-cpu:test"
    resources = engine["resources"]
    assert not [r for r in {**resources["requests"], **resources["limits"]} if "nvidia" in r]
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == sizing.host_memory
    assert "nodeSelector" not in pod["spec"]
    # The default budget, 16 x 8192 tokens x 132 KiB (target + head) = 16.5 GiB, in whole GiB.
    assert _env_of(pod)["VLLM_CPU_KVCACHE_SPACE"] == "17"
    assert sizing.host_memory == "36Gi"  # 14.96 + 0.78 + 17 + 3 = 35.7


def test_the_engine_pod_passes_pod_security_restricted(sd: SpeculativeDeployment) -> None:
    """The fields Pod Security "restricted" checks (the e2e namespaces enforce it for real)."""
    template = build_pod_template(sd, "abc", None, OperatorConfig())
    pod = template["spec"]["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in template["spec"]["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}


# --- fit for a real cluster: service links, token, start and stop ----------------------------


def test_engine_pods_get_no_service_links_and_no_token(sd: SpeculativeDeployment) -> None:
    spec = _pod(sd)["spec"]
    # An SD named `vllm` would otherwise hand vLLM VLLM_PORT=tcp://<ip>:8000.
    assert spec["enableServiceLinks"] is False
    assert spec["automountServiceAccountToken"] is False
    with_account = _pod(_with(pod={"serviceAccountName": "reader"}))["spec"]
    assert with_account["automountServiceAccountToken"] is False


def _startup(pod: dict[str, Any]) -> dict[str, Any]:
    probe: dict[str, Any] = _engine({"spec": {"template": pod}})["startupProbe"]
    assert probe["httpGet"] == {"path": "/health", "port": "http"}
    return probe


def test_the_startup_probe_allows_for_the_weights_download_and_load(
    sd: SpeculativeDeployment,
) -> None:
    # 600 s + (14.96 + 0.78) GiB x (2 s load + 10 s download) = 789 s -> 79 periods of 10 s.
    probe = _startup(_pod(sd))
    assert (probe["periodSeconds"], probe["failureThreshold"]) == (10, 79)
    # From a volume: no download. 600 + 15.74 x 2 = 632 s -> 64.
    from_volume = _startup(_pod(_with(modelSource={"pvc": {"claimName": "models"}})))
    assert from_volume["failureThreshold"] == 64
    # Weights unknown: the base, 600 s.
    assert _startup(_pod(sd, SIZING))["failureThreshold"] == 60
    # The spec's own budget wins, and is part of the revision.
    pinned = _with(engine={**BODY["spec"]["engine"], "startupTimeoutSeconds": 3600})
    assert _startup(_pod(pinned))["failureThreshold"] == 360
    assert revision_hash(pinned.spec, WEIGHED, OperatorConfig()) != revision_hash(
        SpeculativeDeployment.from_body(BODY).spec, WEIGHED, OperatorConfig()
    )


def test_a_stopping_pod_leaves_the_service_then_vllm_drains_within_the_grace(
    sd: SpeculativeDeployment,
) -> None:
    pod = _pod(sd)
    engine = _engine({"spec": {"template": pod}})
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert engine["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    args = engine["args"]
    assert args[args.index("--shutdown-timeout") + 1] == "110"
    longer = _pod(_with(engine={**BODY["spec"]["engine"], "terminationGracePeriodSeconds": 600}))
    assert longer["spec"]["terminationGracePeriodSeconds"] == 600
    longer_args = _engine({"spec": {"template": longer}})["args"]
    assert longer_args[longer_args.index("--shutdown-timeout") + 1] == "590"
