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

The hash is SHA-256 over canonical JSON (sorted keys, no whitespace, ASCII), which is the same
on every run and Python version; it is cut to 10 hex characters (40 bits: a collision needs
about a million revisions of one SpeculativeDeployment).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.children.lifecycle import startup_failure_threshold
from specdeploy.plan.children.vllm_args import build_vllm_args, probe_of
from specdeploy.plan.placement.sizing import cpu_kv_space_gib, download_storage

REVISION_LENGTH = 10
# Bump when the pod template changes shape for the same inputs (a new operator feature), so
# old and new Deployments never share a name with different templates.
HASH_SCHEMA = 2


def engine_image(spec: Spec, config: OperatorConfig) -> str:
    """The engine image the pods run: the spec's, else the operator's default (its CPU image
    for placement.device CPU)."""
    if spec.engine.image:
        return spec.engine.image
    return config.engine_cpu_image if spec.placement.device == "CPU" else config.engine_image


def revision_inputs(
    spec: Spec, sizing: SizingDecision | None, config: OperatorConfig
) -> dict[str, Any]:
    """Exactly the values the revision hash covers (see the module docstring), as plain JSON."""

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
    return {
        **later,
        "schema": HASH_SCHEMA,
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


def revision_hash(spec: Spec, sizing: SizingDecision | None, config: OperatorConfig) -> str:
    """10 lowercase hex characters naming the pods this served spec and sizing give.

    `spec` is the served spec (plan.rollout.speculation.served_spec), `sizing` the decision the pods
    get (None: no GPU resources, e.g. a CPU engine).
    """
    canonical = json.dumps(
        revision_inputs(spec, sizing, config),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=True,
        allow_nan=False,
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:REVISION_LENGTH]
