"""The Kubernetes objects a SpeculativeDeployment owns, as plain dicts (no I/O).

One Deployment per revision, named `<sd>-<revision>`, whose selector includes the revision label,
so pods of two revisions never mix and a Deployment's pod template never changes; one Service
selecting every revision's pods; one PodMonitor so Prometheus labels each pod's metrics with its
revision. Names and labels follow docs/contracts.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.api.contract import PROBE_ENV, PROBE_PROMPTS_ENV, PROBE_READY_PATH
from specdeploy.api.labels import PROBE_GATE
from specdeploy.api.models import API_VERSION, KIND, SizingDecision, SpeculativeDeployment
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.children.lifecycle import (
    PRE_STOP_SECONDS,
    STARTUP_PROBE_PERIOD_SECONDS,
    grace_period_seconds,
    startup_failure_threshold,
)
from specdeploy.plan.children.pod_defaults import default_resources, shm_size_gib
from specdeploy.plan.children.revision import HASH_SCHEMA, UNRECORDED_SCHEMA, engine_image
from specdeploy.plan.children.vllm_args import (
    MODEL_MOUNT_PATH,
    Role,
    build_vllm_args,
    nodes_per_replica,
    probe_of,
)
from specdeploy.plan.placement.kueue import kueue_labels
from specdeploy.plan.placement.sizing import cpu_kv_space_gib, download_storage

CONTAINER_NAME = "engine"
PORT_NAME = "http"
ENGINE_PORT = 8000
HUB_TOKEN_ENV = "HF_TOKEN"
MODELS_VOLUME = "models"
SHM_VOLUME = "dshm"
SHM_PATH = "/dev/shm"
MODEL_CACHE_VOLUME = "model-cache"
# The hub cache inside the engine container: HF_HOME, with the downloads under hub/.
MODEL_CACHE_PATH = "/var/cache/specdeploy/huggingface"
CPU_KV_SPACE_ENV = "VLLM_CPU_KVCACHE_SPACE"
#: Pod Security "restricted" (docs/contracts.md): the engine images run as a non-root user
#: (1001), the container gains no privilege and keeps no capability, under the runtime's default
#: seccomp profile.
POD_SECURITY_CONTEXT: dict[str, Any] = {
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
CONTAINER_SECURITY_CONTEXT: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}


def deployment_name(sd_name: str, revision: str) -> str:
    """Name of the Deployment of one revision: `<sd>-<revision>`."""
    return f"{sd_name}-{revision}"


def owner_reference(sd: SpeculativeDeployment) -> dict[str, Any]:
    """The controller owner reference every child carries (garbage collection, adoption)."""
    if not sd.metadata.uid:
        raise ValueError(f"SpeculativeDeployment {sd.metadata.name} has no uid yet")
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": sd.metadata.name,
        "uid": sd.metadata.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def common_labels(sd: SpeculativeDeployment) -> dict[str, str]:
    """Labels on every child: managed-by and the SpeculativeDeployment's name."""
    return {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.NAME: sd.metadata.name}


def selector_labels(sd: SpeculativeDeployment, revision: str) -> dict[str, str]:
    """The Deployment selector of one revision: SD name and revision."""
    return {labels.NAME: sd.metadata.name, labels.REVISION: revision}


def pod_selector(sd: SpeculativeDeployment) -> str:
    """status.selector for the scale subresource: all pods of this SpeculativeDeployment."""
    return f"{labels.NAME}={sd.metadata.name}"


def pair_env(spec: Spec, revision: str) -> str:
    """SPECDEPLOY_PAIR: the pair the engine launcher must verify, as compact sorted JSON."""
    pair = spec.pair
    return json.dumps(
        {
            "version": pair.version,
            "target": {"model": pair.target.model, "revision": pair.target.revision},
            "draft": {
                "method": pair.draft.method,
                "model": pair.draft.model,
                "revision": pair.draft.revision,
            },
            "revision": revision,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def _env(spec: Spec, revision: str, sizing: SizingDecision | None) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "SPECDEPLOY_HOST", "value": "0.0.0.0"},
        {"name": "SPECDEPLOY_PORT", "value": str(ENGINE_PORT)},
        {"name": "SPECDEPLOY_PAIR", "value": pair_env(spec, revision)},
    ]
    if spec.model_cache is not None:
        # huggingface_hub (the launcher's config reads and vLLM's downloads) caches here.
        env += [
            {"name": "HF_HOME", "value": MODEL_CACHE_PATH},
            {"name": "HF_HUB_CACHE", "value": f"{MODEL_CACHE_PATH}/hub"},
        ]
    kv_space = cpu_kv_space_gib(sizing) if sizing is not None else None
    if kv_space is not None and all(e.name != CPU_KV_SPACE_ENV for e in spec.engine.env):
        # vLLM's CPU backend reserves this many GiB of host memory for KV blocks.
        env.append({"name": CPU_KV_SPACE_ENV, "value": str(kv_space)})
    source = spec.model_source
    if source is not None and source.hub is not None and source.hub.token_secret_ref is not None:
        ref = source.hub.token_secret_ref
        env.append(
            {
                "name": HUB_TOKEN_ENV,
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    probe = probe_of(spec)
    if probe is not None:
        settings = {
            "maxTokens": probe.max_tokens,
            "temperature": probe.temperature,
            "timeoutSeconds": probe.timeout_seconds,
        }
        prompts = probe.config_map_key_ref
        env += [
            {"name": PROBE_ENV, "value": json.dumps(settings, separators=(",", ":"))},
            {
                "name": PROBE_PROMPTS_ENV,
                "valueFrom": {"configMapKeyRef": {"name": prompts.name, "key": prompts.key}},
            },
        ]
    env += [{"name": item.name, "value": item.value} for item in spec.engine.env]
    return env


def _resources(
    spec: Spec, sizing: SizingDecision | None, config: OperatorConfig, schema: int
) -> dict[str, Any]:
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    wanted = spec.engine.resources
    if wanted is not None:
        for name, value in (("cpu", wanted.cpu), ("memory", wanted.memory)):
            if value is not None:
                requests[name] = str(value)
                limits[name] = str(value)
    if schema >= 3:
        # plan.children.pod_defaults: a CPU request (no limit), memory requested and limited.
        for name, value in default_resources(spec, sizing, config).items():
            requests[name] = value
            if name == "memory":
                limits[name] = value
    if sizing is not None and sizing.host_memory is not None:
        # CPU serving: the sized host memory, unless engine.resources.memory says otherwise.
        requests.setdefault("memory", sizing.host_memory)
        limits.setdefault("memory", sizing.host_memory)
    elif sizing is not None:
        # Extended resources are set in limits; the API server copies them to requests.
        limits[sizing.resource_name] = sizing.count
    storage = download_storage(spec, sizing) if sizing is not None else None
    if storage is not None:
        # The downloads land in the container's writable layer: a request (no limit, which
        # would evict the pod) lets the scheduler pick a node with the disk for them.
        requests["ephemeral-storage"] = storage
    result: dict[str, Any] = {}
    if requests:
        result["requests"] = requests
    if limits:
        result["limits"] = limits
    return result


def _volumes(spec: Spec, sizing: SizingDecision | None, schema: int) -> tuple[list[Any], list[Any]]:
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    source = spec.model_source
    if source is not None and source.pvc is not None:
        volumes.append(
            {
                "name": MODELS_VOLUME,
                "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True},
            }
        )
        mounts.append({"name": MODELS_VOLUME, "mountPath": MODEL_MOUNT_PATH, "readOnly": True})
    cache = spec.model_cache
    if cache is not None:
        volume: dict[str, Any] = {"name": MODEL_CACHE_VOLUME}
        if cache.claim_name is not None:
            volume["persistentVolumeClaim"] = {"claimName": cache.claim_name}
        elif cache.ephemeral is not None:
            claim: dict[str, Any] = {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": str(cache.ephemeral.size)}},
            }
            if cache.ephemeral.storage_class_name is not None:
                claim["storageClassName"] = cache.ephemeral.storage_class_name
            volume["ephemeral"] = {"volumeClaimTemplate": {"spec": claim}}
        volumes.append(volume)
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_PATH})
    # Every engine pod, whatever its parallelism: vLLM's processes (its API server, engine
    # core and workers) exchange data through shared memory, and a container runtime gives a
    # container 64 MiB of /dev/shm unless a memory-backed volume is mounted there (vLLM 0.32's
    # CPU engine asks for 160 MiB at start with tensor parallel size 1: docs/images.md). Its
    # pages count against the container's memory limit; from schema 3 it has a size limit.
    shm: dict[str, Any] = {"medium": "Memory"}
    if schema >= 3:
        shm["sizeLimit"] = f"{shm_size_gib(sizing)}Gi"
    volumes.append({"name": SHM_VOLUME, "emptyDir": shm})
    mounts.append({"name": SHM_VOLUME, "mountPath": SHM_PATH})
    return volumes, mounts


def build_pod_template(
    sd: SpeculativeDeployment,
    revision: str,
    sizing: SizingDecision | None,
    config: OperatorConfig,
    role: Role = "leader",
    *,
    schema: int = HASH_SCHEMA,
) -> dict[str, Any]:
    """The pod template of one revision of hash `schema`; sd.spec must be the served spec
    (served_spec).

    A replica on one node is one pod of this template. A replica across nodes is a group of
    a leader (`role` leader: it serves the API and is scraped, as a single pod is) and workers
    (`role` worker: vLLM ranks without an API, no port, no probe, not selected by the Service
    nor scraped); both are built here, so what shapes an engine pod shapes both."""
    spec = sd.spec
    serves_api = role == "leader"
    volumes, mounts = _volumes(spec, sizing, schema)
    probed = serves_api and probe_of(spec) is not None
    container: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": engine_image(spec, config),
        "command": list(config.engine_command),
        "args": ["serve", "--", *build_vllm_args(spec, sizing, role)],
        "ports": [{"name": PORT_NAME, "containerPort": ENGINE_PORT, "protocol": "TCP"}],
        "env": _env(spec, revision, sizing),
        # Until the weights are loaded the port refuses connections: the startup probe allows
        # for that (plan.children.lifecycle), then readiness takes over.
        "startupProbe": {
            "httpGet": {"path": "/health", "port": PORT_NAME},
            "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
            "failureThreshold": startup_failure_threshold(spec, sizing),
        },
        "readinessProbe": {
            # With a probe, the pod is ready once it ran the probe (engine/probe.py).
            "httpGet": {"path": PROBE_READY_PATH if probed else "/health", "port": PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
        },
        # A stopping pod keeps serving while it leaves the Service; then SIGTERM, on which vLLM
        # drains its requests (--shutdown-timeout) within the grace period.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SECONDS}}},
        "resources": _resources(spec, sizing, config, schema),
        "terminationMessagePath": "/dev/termination-log",
        "securityContext": json.loads(json.dumps(CONTAINER_SECURITY_CONTEXT)),
    }
    if not serves_api:
        # A worker serves no request, so it runs no probe (its leader probes for the group).
        del container["ports"], container["startupProbe"], container["readinessProbe"]
        container["env"] = [
            e for e in container["env"] if e["name"] not in (PROBE_ENV, PROBE_PROMPTS_ENV)
        ]
    if mounts:
        container["volumeMounts"] = mounts
    node_selector = {
        **(sizing.node_selector if sizing else {}),
        **(spec.placement.node_selector or {}),
    }
    pod_spec: dict[str, Any] = {
        "securityContext": json.loads(json.dumps(POD_SECURITY_CONTEXT)),
        # No Service variables: a Service named like a vLLM setting (an SD named `vllm` gives
        # VLLM_PORT=tcp://...) would be read by vLLM as that setting.
        "enableServiceLinks": False,
        # The engine never calls the Kubernetes API.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_period_seconds(spec),
        "containers": [container],
    }
    if node_selector:
        pod_spec["nodeSelector"] = dict(sorted(node_selector.items()))
    if spec.placement.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True, mode="json")
            for t in spec.placement.tolerations
        ]
    if volumes:
        pod_spec["volumes"] = volumes
    if probed:
        # Ready only once the operator compared its probe with the stable's (plan/probe.py):
        # until then no user request reaches the pod.
        pod_spec["readinessGates"] = [{"conditionType": PROBE_GATE}]
    options = spec.pod
    if options is not None:
        if options.service_account_name is not None:
            pod_spec["serviceAccountName"] = options.service_account_name
        if options.image_pull_secrets:
            pod_spec["imagePullSecrets"] = [{"name": s.name} for s in options.image_pull_secrets]
        if options.priority_class_name is not None:
            pod_spec["priorityClassName"] = options.priority_class_name
    # The spec's labels and annotations first: the operator's own keys always win (admission
    # refuses them in spec.pod already).
    annotations = {**((options.annotations if options else None) or {})}
    if serves_api:
        annotations.update(
            {
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(ENGINE_PORT),
                "prometheus.io/path": "/metrics",
            }
        )
    if config.local_process:
        annotations[labels.LOCAL_PROCESS] = "true"
    owner = (
        common_labels(sd)
        if serves_api
        else {labels.MANAGED_BY: labels.MANAGED_BY_VALUE, labels.WORKER_OF: sd.metadata.name}
    )
    metadata: dict[str, Any] = {
        "labels": {
            **((options.labels if options else None) or {}),
            **owner,
            labels.REVISION: revision,
            labels.PAIR_VERSION: spec.pair.version,
        },
    }
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def revision_metadata(
    sd: SpeculativeDeployment, revision: str, schema: int = HASH_SCHEMA
) -> dict[str, Any]:
    """Metadata of a revision's child (Deployment or LeaderWorkerSet): `<sd>-<revision>`, the
    SD's and revision's labels, Kueue's labels (read from this object by Kueue), the owner, and
    the hash schema (none for schema 2, as the operators before it wrote)."""
    metadata: dict[str, Any] = {
        "name": deployment_name(sd.metadata.name, revision),
        "namespace": sd.metadata.namespace,
        "labels": {
            **common_labels(sd),
            labels.REVISION: revision,
            labels.PAIR_VERSION: sd.spec.pair.version,
            **kueue_labels(sd.spec),
        },
        "ownerReferences": [owner_reference(sd)],
    }
    if schema != UNRECORDED_SCHEMA:
        metadata["annotations"] = {labels.HASH_SCHEMA: str(schema)}
    return metadata


def build_revision_deployment(
    sd: SpeculativeDeployment,
    revision: str,
    sizing: SizingDecision | None,
    config: OperatorConfig,
    *,
    replicas: int = 0,
    schema: int = HASH_SCHEMA,
) -> dict[str, Any]:
    """The Deployment of one revision with `replicas` pods.

    sd.spec must be the served spec (plan.rollout.speculation.served_spec) and `revision` its
    revision_hash with the same sizing, config and `schema`. The selector includes the revision
    label, so this Deployment only ever owns pods of this exact pair.
    """
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": revision_metadata(sd, revision, schema),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector_labels(sd, revision)},
            "template": build_pod_template(sd, revision, sizing, config, schema=schema),
        },
    }


LWS_API_VERSION = "leaderworkerset.x-k8s.io/v1"
LWS_KIND = "LeaderWorkerSet"
#: LeaderWorkerSet's annotation: every pod of a group on nodes with one value of this node label,
#: and one group per value.
EXCLUSIVE_TOPOLOGY_ANNOTATION = "leaderworkerset.sigs.k8s.io/exclusive-topology"


def build_revision_leaderworkerset(
    sd: SpeculativeDeployment,
    revision: str,
    sizing: SizingDecision,
    config: OperatorConfig,
    *,
    replicas: int = 0,
    schema: int = HASH_SCHEMA,
) -> dict[str, Any]:
    """The LeaderWorkerSet of one revision whose replicas span nodes: `replicas` groups of a
    leader and nodes - 1 workers (sizing.nodes_per_replica), built from the same pod template
    as a Deployment's (build_pod_template), with the same name, labels and owner.

    A pod of a group that restarts or goes recreates the whole group (vLLM's ranks cannot
    rejoin a running process group); Kueue admits each group whole."""
    spec = sd.spec
    metadata = revision_metadata(sd, revision, schema)
    if spec.placement.topology_key:
        metadata["annotations"] = {
            **metadata.get("annotations", {}),
            EXCLUSIVE_TOPOLOGY_ANNOTATION: spec.placement.topology_key,
        }
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": LWS_KIND,
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": nodes_per_replica(sizing),
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": build_pod_template(
                    sd, revision, sizing, config, "leader", schema=schema
                ),
                "workerTemplate": build_pod_template(
                    sd, revision, sizing, config, "worker", schema=schema
                ),
            },
        },
    }


def build_revision_child(
    sd: SpeculativeDeployment,
    revision: str,
    sizing: SizingDecision | None,
    config: OperatorConfig,
    *,
    replicas: int = 0,
    schema: int = HASH_SCHEMA,
) -> dict[str, Any]:
    """The child of one revision of hash `schema`: a Deployment, or a LeaderWorkerSet when a
    replica spans nodes."""
    if sizing is not None and nodes_per_replica(sizing) > 1:
        return build_revision_leaderworkerset(
            sd, revision, sizing, config, replicas=replicas, schema=schema
        )
    return build_revision_deployment(sd, revision, sizing, config, replicas=replicas, schema=schema)


def sd_wide_metadata(sd: SpeculativeDeployment) -> dict[str, Any]:
    """Metadata of a child that serves the whole SD (not one revision): named after the SD."""
    return {
        "name": sd.metadata.name,
        "namespace": sd.metadata.namespace,
        "labels": common_labels(sd),
        "ownerReferences": [owner_reference(sd)],
    }


def build_service(sd: SpeculativeDeployment) -> dict[str, Any]:
    """The Service `<sd>` in front of the ready pods of every revision."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": sd_wide_metadata(sd),
        "spec": {
            "selector": {labels.NAME: sd.metadata.name},
            "ports": [
                {
                    "name": PORT_NAME,
                    "port": ENGINE_PORT,
                    "targetPort": PORT_NAME,
                    "protocol": "TCP",
                }
            ],
        },
    }


def build_pod_monitor(
    sd: SpeculativeDeployment, extra_labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The PodMonitor `<sd>` (Prometheus Operator), copying name and revision into metrics.

    `extra_labels` (the config's podMonitorLabels) are what a Prometheus selects PodMonitors
    by, e.g. `release: kube-prometheus-stack`; the operator's own labels win over them.
    """
    metadata = sd_wide_metadata(sd)
    metadata["labels"] = {**(extra_labels or {}), **metadata["labels"]}
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": metadata,
        "spec": {
            "selector": {"matchLabels": {labels.NAME: sd.metadata.name}},
            "podMetricsEndpoints": [{"port": PORT_NAME, "path": "/metrics"}],
            "podTargetLabels": [labels.NAME, labels.REVISION],
        },
    }


RECORD_API_VERSION = "apps/v1"
RECORD_KIND = "ControllerRevision"


def build_revision_record(deployment: dict[str, Any], sequence: int) -> dict[str, Any]:
    """The ControllerRevision that records one revision's Deployment, as StatefulSets record
    their pod templates: its `data` is immutable, so an older revision's Deployment can be
    rebuilt exactly (to repair it, or to scale it back up) after the spec has moved on.

    `deployment` is the revision's manifest from build_revision_child (a Deployment or a
    LeaderWorkerSet); its replicas are left out (they change; the pods they make never do).
    """
    metadata = deployment["metadata"]
    data = {**deployment, "spec": {k: v for k, v in deployment["spec"].items() if k != "replicas"}}
    return {
        "apiVersion": RECORD_API_VERSION,
        "kind": RECORD_KIND,
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": {
                labels.MANAGED_BY: labels.MANAGED_BY_VALUE,
                labels.NAME: metadata["labels"][labels.NAME],
                labels.REVISION: metadata["labels"][labels.REVISION],
            },
            "ownerReferences": metadata["ownerReferences"],
        },
        "data": data,
        "revision": sequence,
    }


def deployment_from_record(record: dict[str, Any], replicas: int) -> dict[str, Any]:
    """The Deployment a revision record describes, with `replicas` pods."""
    data: dict[str, Any] = record["data"]
    return {**data, "spec": {**data["spec"], "replicas": replicas}}
