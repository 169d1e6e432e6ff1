"""`specdeploy render`: what a SpeculativeDeployment becomes, without a cluster.

Like `helm template`, it prints the objects the operator would apply for a CR it sees for the
first time: the revision Deployment, the Service and the PodMonitor. Nothing here decides
anything of its own: the CR is checked as the API server would check it (the CRD's schema,
defaults and CEL rules, `specdeploy.api.admission`), then `plan.decide.decide` runs on a
snapshot of an empty namespace with the given nodes, exactly as the reconcile runs it.

Two differences with what the operator applies, both because a file has no object on a
cluster behind it: without `metadata.uid` (a CR not yet applied) the children carry no
ownerReferences and no applied-hash annotation (`plan.children.drift`), which both depend on the
uid.
Render the output of `kubectl get sd NAME -o yaml` and they are there too, byte for byte.

The pair's compatibility (plan/status/pair_check.py) is judged by the engine launcher reading the
models' config.json inside the pod, so render cannot tell; nor does it read config.json of a
model outside the shipped catalog: such a model needs `shape` in the spec.
"""

from __future__ import annotations

import copy
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pydantic
import yaml

from specdeploy.api.admission import admission_errors
from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import (
    API_VERSION,
    KIND,
    SizingDecision,
    SpeculationStatus,
    SpeculativeDeployment,
)
from specdeploy.plan.children.drift import APPLIED_HASH_ANNOTATION
from specdeploy.plan.children.vllm_args import build_vllm_args
from specdeploy.plan.decide import Snapshot, decide, serve_pair
from specdeploy.plan.placement.gpu_catalog import (
    COUNT_LABEL,
    MEMORY_LABEL,
    MIG_STRATEGY_LABEL,
    PRODUCT_LABEL,
    WHOLE_GPU_RESOURCE,
    GpuProduct,
    catalog_for_config,
    read_gpu_inventories,
)
from specdeploy.plan.placement.sizing import kv_budget_tokens
from specdeploy.plan.rollout.speculation import decide_speculation

# The uid given to a CR that has none, so the children can be built; its traces are removed.
_PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
# GPUs and slices of each profile every node of the built-in catalog offers.
CATALOG_GPUS_PER_NODE = 8
CATALOG_SLICES_PER_PROFILE = 7


class InvalidSpeculativeDeploymentError(ValueError):
    """The CR would be refused by the API server; `errors` name each field path."""

    def __init__(self, errors: Sequence[str]) -> None:
        self.errors = tuple(errors)
        super().__init__("invalid SpeculativeDeployment:\n" + "\n".join(f"  {e}" for e in errors))


class DoesNotPlaceError(RuntimeError):
    """The pair cannot be sized on these nodes (or the models' shapes are unknown)."""


@dataclass(frozen=True)
class Rendering:
    """What the operator makes of one CR on these nodes, with the figures behind it."""

    sd: SpeculativeDeployment
    speculation: SpeculationStatus
    sizing: SizingDecision
    revision: str
    vllm_args: tuple[str, ...]
    #: Deployment (or LeaderWorkerSet), Service and PodMonitor, in the order the operator
    #: applies them.
    manifests: tuple[dict[str, Any], ...]


def load_speculative_deployment(text: str, source: str = "input") -> dict[str, Any]:
    """The one SpeculativeDeployment in a YAML text (other documents are an error)."""
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as error:
        raise InvalidSpeculativeDeploymentError([f"{source}: not YAML: {error}"]) from error
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise InvalidSpeculativeDeploymentError(
            [f"{source}: expected one SpeculativeDeployment, found {len(documents)} documents"]
        )
    body: dict[str, Any] = documents[0]
    if body.get("apiVersion") != API_VERSION or body.get("kind") != KIND:
        raise InvalidSpeculativeDeploymentError(
            [
                f"{source}: apiVersion/kind is {body.get('apiVersion')}/{body.get('kind')}, "
                f"expected {API_VERSION}/{KIND}"
            ]
        )
    return body


def validate(body: Mapping[str, Any]) -> SpeculativeDeployment:
    """The CR with the CRD's defaults applied, parsed; raises InvalidSpeculativeDeploymentError with
    every error the API server would give (schema, CEL) or the models refuse."""
    metadata = body.get("metadata") or {}
    errors = [] if metadata.get("name") else ["metadata.name: Required value"]
    schema_errors, cel_errors = admission_errors(copy.deepcopy(dict(body)))
    errors += schema_errors + cel_errors
    if errors:
        raise InvalidSpeculativeDeploymentError(errors)
    try:
        return SpeculativeDeployment.from_body(body)
    except pydantic.ValidationError as error:
        raise InvalidSpeculativeDeploymentError(
            [
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}"
                for e in error.errors(include_url=False)
            ]
        ) from error


def read_nodes(text: str) -> list[dict[str, Any]]:
    """Node objects from `kubectl get nodes -o yaml` (a List), a YAML list, or documents."""
    found: list[dict[str, Any]] = []
    for document in yaml.safe_load_all(text):
        if document is None:
            continue
        if isinstance(document, dict) and isinstance(document.get("items"), list):
            found += document["items"]
        elif isinstance(document, list):
            found += document
        else:
            found.append(document)
    for index, node in enumerate(found):
        if not isinstance(node, dict) or node.get("kind", "Node") != "Node":
            raise ValueError(f"item {index} is not a Node")
    return found


def catalog_nodes(catalog: Iterable[GpuProduct]) -> list[dict[str, Any]]:
    """One Node per GPU product of the catalog, as GPU feature discovery labels it under the
    `mixed` MIG strategy: 8 whole GPUs and 7 slices of each MIG profile the product has."""
    nodes = []
    for product in catalog:
        allocatable: dict[str, str] = {WHOLE_GPU_RESOURCE: str(CATALOG_GPUS_PER_NODE)}
        for profile in product.mig_profiles:
            allocatable[profile.mixed_resource] = str(CATALOG_SLICES_PER_PROFILE)
        nodes.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"catalog-{product.name.lower()}",
                    "labels": {
                        PRODUCT_LABEL: product.name,
                        MEMORY_LABEL: str(round(product.memory_gib * 1024)),
                        COUNT_LABEL: str(CATALOG_GPUS_PER_NODE),
                        MIG_STRATEGY_LABEL: "mixed" if product.mig_profiles else "none",
                    },
                },
                "status": {"allocatable": allocatable, "capacity": allocatable},
            }
        )
    return nodes


def _without_uid_traces(manifest: dict[str, Any]) -> dict[str, Any]:
    metadata = manifest["metadata"]
    metadata.pop("ownerReferences", None)
    annotations = metadata.get("annotations") or {}
    annotations.pop(APPLIED_HASH_ANNOTATION, None)
    if not annotations:
        metadata.pop("annotations", None)
    return manifest


def render(
    body: Mapping[str, Any],
    nodes: Sequence[Mapping[str, Any]] | None,
    config: OperatorConfig,
    *,
    namespace: str | None = None,
    now: datetime | None = None,
) -> Rendering:
    """The children the operator applies for `body` in an empty namespace on `nodes` (None:
    one node of each product in the GPU catalog); raises InvalidSpeculativeDeploymentError or
    DoesNotPlaceError with the reason. `namespace` replaces the CR's; a CR without one is in
    `default`, as kubectl would apply it."""
    # What a CR becomes does not depend on what a cluster once observed of it.
    body = {key: value for key, value in body.items() if key != "status"}
    if namespace is not None:
        body = {**body, "metadata": {**(body.get("metadata") or {}), "namespace": namespace}}
    elif not (body.get("metadata") or {}).get("namespace"):
        body = {**body, "metadata": {**(body.get("metadata") or {}), "namespace": "default"}}
    sd = validate(body)
    catalog = catalog_for_config(config)
    if nodes is None:
        nodes = catalog_nodes(catalog)
    has_uid = bool(sd.metadata.uid)
    if not has_uid:
        body = {**body, "metadata": {**(body.get("metadata") or {}), "uid": _PLACEHOLDER_UID}}
        sd = sd.model_copy(
            update={"metadata": sd.metadata.model_copy(update={"uid": _PLACEHOLDER_UID})}
        )
    speculation = decide_speculation(sd.spec, config)
    served, sized, revision, _ = serve_pair(
        sd,
        speculation,
        read_gpu_inventories(nodes, catalog),
        config,
        catalog=catalog,
        fetched_shapes={},
    )
    if not isinstance(sized, SizingDecision) or revision is None:
        raise DoesNotPlaceError(sized.message)
    snapshot = Snapshot(
        body=body,
        nodes=nodes,
        deployments=(),
        records=(),
        service=None,
        pod_monitor_served=True,
        pod_monitor=None,
        pods=(),
        workloads=(),
        local_queue=None,
    )
    decision = decide(snapshot, config, catalog, now or datetime.now(UTC))
    manifests = tuple(
        m if has_uid else _without_uid_traces(copy.deepcopy(m)) for m in decision.applies
    )
    return Rendering(
        sd=served,
        speculation=speculation,
        sizing=sized,
        revision=revision,
        vllm_args=tuple(build_vllm_args(served.spec, sized)),
        manifests=manifests,
    )


def describe(rendering: Rendering, nodes_source: str, config_source: str) -> list[str]:
    """The human-readable decision: revision, speculation, sizing arithmetic, vllm command."""
    sd, sizing, memory = rendering.sd, rendering.sizing, rendering.sizing.memory
    speculation = rendering.speculation
    child = next(m for m in rendering.manifests if m["kind"] in ("Deployment", "LeaderWorkerSet"))
    engine = sd.spec.engine
    nodes = sizing.nodes_per_replica or 1
    groups = (
        f", each a group of {nodes} pods: a leader and {nodes - 1} worker{'s' if nodes > 2 else ''}"
        if nodes > 1
        else ""
    )
    lines = [
        f"specdeploy render of SpeculativeDeployment {sd.metadata.namespace}/{sd.metadata.name}",
        f"nodes: {nodes_source}; operator config: {config_source}",
        f"revision: {rendering.revision} ({child['kind']} {child['metadata']['name']}, "
        f"{child['spec']['replicas']} replicas{groups})",
        f"speculation: {speculation.state} ({speculation.reason}: {speculation.message})",
        f"sizing: {sizing.message}",
    ]
    if memory is not None:
        budget = f"{kv_budget_tokens(sd.spec):,} tokens: " + (
            "engine.kvCacheTokens"
            if engine.kv_cache_tokens is not None
            else "maxModelLen x min(maxNumSeqs, 16)"
        )
        lines += [
            f"  target weights      {memory.target_weights_gib:8.2f} GiB",
            f"  draft weights       {memory.draft_weights_gib:8.2f} GiB",
            f"  KV cache            {memory.kv_cache_gib:8.2f} GiB  ({budget}; docs/sizing.md)",
            f"  engine overhead     {memory.overhead_gib:8.2f} GiB  (per device)",
            f"  / gpuMemoryUtilization = {memory.required_gib:.2f} GiB per replica, "
            f"{memory.per_device_gib:.2f} GiB per device"
            + (" (the most loaded GPU: docs/sizing.md, across nodes)" if nodes > 1 else ""),
        ]
    selector = ", ".join(f"{k}={v}" for k, v in sorted(sizing.node_selector.items()))
    per_pod = " per pod" if nodes > 1 else ""
    layout = f", tensor parallel {sizing.tensor_parallel_size}"
    if nodes > 1:
        layout = (
            f", {nodes} pods per replica, pipeline parallel {sizing.pipeline_parallel_size} x "
            f"tensor parallel {sizing.tensor_parallel_size}, draft {sizing.draft_placement}"
        )
    lines += [
        f"resources: {sizing.resource_name}: {sizing.count}{per_pod}{layout}"
        + (f", node selector {selector}" if selector else ""),
    ]
    if nodes > 1:
        worker = build_vllm_args(sd.spec, sizing, "worker")
        lines += [
            "leader: vllm serve " + shlex.join(rendering.vllm_args),
            "workers: vllm serve " + shlex.join(worker),
        ]
    else:
        lines.append("vllm serve " + shlex.join(rendering.vllm_args))
    return lines


def render_yaml(rendering: Rendering, nodes_source: str, config_source: str) -> str:
    """Multi-document YAML of the manifests, preceded by the description as comments."""
    header = "".join(f"# {line}\n" for line in describe(rendering, nodes_source, config_source))
    documents = [
        yaml.safe_dump(m, sort_keys=False, default_flow_style=False) for m in rendering.manifests
    ]
    return header + "".join(f"---\n{d}" for d in documents)
