"""The revision hash: one value per distinct set of pods.

A revision names everything that reaches the pod template, and nothing else:

- in: the pair as served (after the speculation decision: speculation Off hashes as method
  none), the pair version (it is a pod label), the engine image (the spec's, else the
  operator's), engine command and the local-process flag (operator config: they are in the pod
  template too), the vLLM arguments (which carry model locations, revisions, tensor parallel
  size, limits, speculative config and extra args), the engine env and resources, the model
  source (volumes and token Secret), placement.nodeSelector and tolerations, the sizing
  decision's resource name, count and node selector, and (only when they apply, so older
  revisions keep their names) CPU serving with its host memory and KV space, the model cache,
  the pod options (labels, annotations, ServiceAccount, pull secrets, PriorityClass), the
  ephemeral-storage request of pods that download their weights, and the analysis probe (its
  ConfigMap and settings: the pods run it before they serve); the startup probe's
  failureThreshold (spec.engine.startupTimeoutSeconds, else a budget from the weights the
  sizing estimates: a new estimate that moves it is a new revision); the grace period reaches
  the hash through vLLM's --shutdown-timeout.
- out: replicas, rollout (canary, analysis but its probe, collapse guard), revisionHistoryLimit,
  placement.queue and placement.priorityClass (Kueue labels on the Deployment object, not in
  its pod template: changing queue relabels the existing Deployments), the speculation policy
  itself (only its effect counts), and the sizing decision's memory estimate and message.

So a new operator engine image or command starts a new revision for every SpeculativeDeployment
that does not pin its own image: the new engine is rolled out as a canary like any new pair.

Schemas. A new revision is hashed with HASH_SCHEMA, and its Deployment (or LeaderWorkerSet) and
record say so (labels.HASH_SCHEMA; none means schema 2). A revision keeps the schema, the hash
and the pod template it was made with for as long as it exists: revision_for derives the spec's
hash under each older schema a live revision was made with, and where one matches, that
revision is still the spec's, so an operator whose pods change shape (a new schema) restarts no
pod of a running revision. Schema 3 adds the pod defaults (plan.children.pod_defaults): CPU and
memory of GPU pods, the /dev/shm size limit.

The hash is SHA-256 over canonical JSON (sorted keys, no whitespace, ASCII), which is the same
on every run and Python version; it is cut to 10 hex characters (40 bits: a collision needs
about a million revisions of one SpeculativeDeployment).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from specdeploy.api import labels
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.children.lifecycle import startup_failure_threshold
from specdeploy.plan.children.pod_defaults import default_resources, shm_size_gib
from specdeploy.plan.children.vllm_args import build_vllm_args, probe_of
from specdeploy.plan.placement.sizing import cpu_kv_space_gib, download_storage

REVISION_LENGTH = 10
# Bump when the pod template changes shape for the same inputs (a new operator feature), so
# old and new Deployments never share a name with different templates; keep the older one in
# HASH_SCHEMAS (and its pods in the builders) so its revisions are still found.
HASH_SCHEMA = 3
#: The schemas this operator derives and builds: 2 (before the pod defaults), 3.
HASH_SCHEMAS = (2, 3)
#: The schema of a revision whose child carries no labels.HASH_SCHEMA annotation.
UNRECORDED_SCHEMA = 2


def schema_of(child: Mapping[str, Any]) -> int:
    """The hash schema a revision's Deployment, LeaderWorkerSet or record was made with."""
    annotations = (child.get("metadata") or {}).get("annotations") or {}
    try:
        return int(annotations.get(labels.HASH_SCHEMA, UNRECORDED_SCHEMA))
    except ValueError:
        return UNRECORDED_SCHEMA


def engine_image(spec: Spec, config: OperatorConfig) -> str:
    """The engine image the pods run: the spec's, else the operator's default (its CPU image
    for placement.device CPU)."""
    if spec.engine.image:
        return spec.engine.image
    return config.engine_cpu_image if spec.placement.device == "CPU" else config.engine_image


def revision_inputs(
    spec: Spec, sizing: SizingDecision | None, config: OperatorConfig, schema: int = HASH_SCHEMA
) -> dict[str, Any]:
    """Exactly the values the revision hash of `schema` covers (see the module docstring), as
    plain JSON."""
    if schema not in HASH_SCHEMAS:
        raise ValueError(f"hash schema {schema} is not one of {HASH_SCHEMAS}")

    def dump(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, list):
            return [dump(item) for item in value]
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")

    pair = spec.pair
    # Added with CPU serving, the model cache and pod options: present only when they shape
    # the pods, so revisions made before them keep their names.
    later: dict[str, Any] = {}
    if spec.placement.device == "CPU":
        later["device"] = "CPU"
    if spec.model_cache is not None:
        later["modelCache"] = dump(spec.model_cache)
    if spec.pod is not None:
        later["pod"] = dump(spec.pod)
    if (probe := probe_of(spec)) is not None:
        # Its ConfigMap and settings reach the pod template (env, readiness), not its content:
        # prompts edited in the ConfigMap reach pods made afterwards.
        later["probe"] = dump(probe)
    if sizing is not None and (storage := download_storage(spec, sizing)) is not None:
        later["ephemeralStorage"] = storage
    if sizing is not None and sizing.host_memory is not None:
        later["hostMemory"] = sizing.host_memory
        later["cpuKvSpaceGiB"] = cpu_kv_space_gib(sizing)
    if schema >= 3:
        later["podDefaults"] = {
            "resources": default_resources(spec, sizing, config),
            "shmGiB": shm_size_gib(sizing),
        }
    return {
        **later,
        "schema": schema,
        "pairVersion": pair.version,
        "target": {"model": pair.target.model, "revision": pair.target.revision},
        "draft": dump(pair.draft.model_copy(update={"shape": None})),
        "image": engine_image(spec, config),
        "command": list(config.engine_command),
        "localProcess": config.local_process,
        "vllmArgs": build_vllm_args(spec, sizing),
        "startupFailureThreshold": startup_failure_threshold(spec, sizing),
        "env": dump(spec.engine.env),
        "resources": dump(spec.engine.resources),
        "modelSource": dump(spec.model_source),
        "nodeSelector": dict(sorted((spec.placement.node_selector or {}).items())),
        "tolerations": dump(spec.placement.tolerations),
        "sizing": None
        if sizing is None
        else {
            "resourceName": sizing.resource_name,
            "count": sizing.count,
            "tensorParallelSize": sizing.tensor_parallel_size,
            "nodeSelector": dict(sorted(sizing.node_selector.items())),
        },
    }


def revision_hash(
    spec: Spec, sizing: SizingDecision | None, config: OperatorConfig, schema: int = HASH_SCHEMA
) -> str:
    """10 lowercase hex characters naming the pods this served spec and sizing give.

    `spec` is the served spec (plan.rollout.speculation.served_spec), `sizing` the decision the pods
    get (None: no GPU resources, e.g. a CPU engine).
    """
    canonical = json.dumps(
        revision_inputs(spec, sizing, config, schema),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:REVISION_LENGTH]


def revision_for(
    spec: Spec,
    sizing: SizingDecision | None,
    config: OperatorConfig,
    existing: Mapping[str, int],
) -> tuple[str, int]:
    """(the revision, its schema) that serves this spec and sizing: a live revision (`existing`:
    revision -> the schema it was made with) whose hash the spec still gives under its own
    schema, the newest schema first; else a new revision of HASH_SCHEMA."""
    current = revision_hash(spec, sizing, config)
    if current in existing:
        return current, HASH_SCHEMA
    older = sorted({s for s in existing.values() if s in HASH_SCHEMAS and s != HASH_SCHEMA})
    for schema in reversed(older):
        revision = revision_hash(spec, sizing, config, schema)
        if existing.get(revision) == schema:
            return revision, schema
    return current, HASH_SCHEMA
