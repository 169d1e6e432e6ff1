"""The exact `vllm serve` arguments (vLLM 0.33) for a served spec.

The arguments are part of the revision: the same spec and sizing always give the same list,
so `--speculative-config` is compact JSON with sorted keys.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any, Literal

from specdeploy.api.contract import PROBE_MIDDLEWARE
from specdeploy.api.models import METHODS_WITHOUT_MODEL, ProbeSpec, ScheduleStep, SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.children.lifecycle import drain_seconds

# Where a modelSource.pvc claim is mounted in the engine container.
MODEL_MOUNT_PATH = "/models"
# Expanded by the kubelet from the container env ($(VAR) syntax), so the test bed's process
# kubelet can substitute a free local port.
HOST_ARG = "$(SPECDEPLOY_HOST)"
PORT_ARG = "$(SPECDEPLOY_PORT)"
# A replica across nodes is a LeaderWorkerSet group; LWS gives every pod of a group its
# leader's address and its own index (0 for the leader) as environment variables.
LEADER_ADDRESS_ARG = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX_ARG = "$(LWS_WORKER_INDEX)"
# vLLM's default port for the multi-node process group (torch.distributed), set explicitly.
MASTER_PORT = 29501

#: Which pod of a multi-node replica the arguments are for.
Role = Literal["leader", "worker"]


def tensor_parallel_size(spec: Spec, sizing: SizingDecision | None) -> int:
    """The target's tensor parallel size: the sizing decision's, else the spec's, else 1."""
    if sizing is not None:
        return sizing.tensor_parallel_size
    size = spec.engine.tensor_parallel_size
    return size if isinstance(size, int) else 1


def model_location(spec: Spec, model: str) -> str:
    """What vLLM loads for `model`: a path under the PVC mount, else the id as given."""
    source = spec.model_source
    if source is not None and source.pvc is not None:
        return posixpath.normpath(posixpath.join(MODEL_MOUNT_PATH, source.pvc.path, model))
    return model


def _pinned_revision(spec: Spec, revision: str | None) -> str | None:
    # A revision only means something to a hub download; files on a volume are what they are.
    source = spec.model_source
    if source is not None and source.pvc is not None:
        return None
    return revision


def schedule_ranges(schedule: list[ScheduleStep], max_num_seqs: int) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: `[[lo, hi, k], ...]` from 1 to max_num_seqs.

    Each step covers (previous maxBatchSize, maxBatchSize]; above the last step speculation is
    off (k=0) up to max_num_seqs. "k=5 up to batch 8" with 32 seqs gives [[1,8,5],[9,32,0]].
    """
    ranges: list[list[int]] = []
    low = 1
    for step in sorted(schedule, key=lambda s: s.max_batch_size):
        high = min(step.max_batch_size, max_num_seqs)
        if high >= low:
            ranges.append([low, high, step.tokens])
        low = step.max_batch_size + 1
    if low <= max_num_seqs:
        ranges.append([low, max_num_seqs, 0])
    return ranges


def speculative_config(spec: Spec, sizing: SizingDecision | None) -> dict[str, Any] | None:
    """The `--speculative-config` object, or None when the served spec has no draft."""
    draft = spec.pair.draft
    if draft.method == "none":
        return None
    config: dict[str, Any] = {"method": draft.method}
    if draft.num_speculative_tokens is not None:
        config["num_speculative_tokens"] = draft.num_speculative_tokens
    if draft.model is not None:
        config["model"] = model_location(spec, draft.model)
        revision = _pinned_revision(spec, draft.revision)
        if revision is not None:
            config["revision"] = revision
    if draft.method not in METHODS_WITHOUT_MODEL:
        # Explicit, so a vLLM default changing between versions cannot change the pods.
        config["draft_tensor_parallel_size"] = (
            draft.draft_tensor_parallel_size or tensor_parallel_size(spec, sizing)
        )
    if draft.schedule:
        max_num_seqs = spec.engine.max_num_seqs
        if max_num_seqs is None:
            raise ValueError("a speculation schedule needs spec.engine.maxNumSeqs")
        config["num_speculative_tokens_per_batch_size"] = schedule_ranges(
            draft.schedule, max_num_seqs
        )
    return config


def nodes_per_replica(sizing: SizingDecision | None) -> int:
    """Nodes (pods) one replica spans: 1 unless sizing spread it across nodes."""
    if sizing is None or sizing.nodes_per_replica is None:
        return 1
    return sizing.nodes_per_replica


def multi_node_args(sizing: SizingDecision, role: Role) -> list[str]:
    """vLLM's multiprocessing launch across nodes (no Ray): every pod runs `vllm serve` with
    the same model and parallel sizes, `--nnodes`, its `--node-rank` and the leader's address;
    the leader (rank 0) serves the API, the workers run `--headless` (engine ranks only)."""
    rank = "0" if role == "leader" else WORKER_INDEX_ARG
    args = ["--distributed-executor-backend", "mp"]
    args += ["--nnodes", str(nodes_per_replica(sizing)), "--node-rank", rank]
    args += ["--master-addr", LEADER_ADDRESS_ARG, "--master-port", str(MASTER_PORT)]
    return [*args, "--headless"] if role == "worker" else args


def build_vllm_args(spec: Spec, sizing: SizingDecision | None, role: Role = "leader") -> list[str]:
    """The `vllm serve` arguments for the served spec (see plan.rollout.speculation.served_spec).

    Order: the model (positional), `--revision` (hub models only), `--served-model-name`,
    `--host`/`--port` as $(SPECDEPLOY_HOST)/$(SPECDEPLOY_PORT), `--tensor-parallel-size`
    (and `--pipeline-parallel-size` across nodes), the engine limits that are set,
    `--shutdown-timeout` (on SIGTERM vLLM drains its requests for that long rather than abort
    them: plan.children.lifecycle), for a replica across nodes the multi-node launch of `role`
    (multi_node_args), `--speculative-config` when there is a draft, then spec.engine.extraArgs
    unchanged.
    """
    target = spec.pair.target
    engine = spec.engine
    args = [model_location(spec, target.model)]
    revision = _pinned_revision(spec, target.revision)
    if revision is not None:
        args += ["--revision", revision]
    args += ["--served-model-name", target.model, "--host", HOST_ARG, "--port", PORT_ARG]
    args += ["--tensor-parallel-size", str(tensor_parallel_size(spec, sizing))]
    pipeline = sizing.pipeline_parallel_size if sizing is not None else None
    if pipeline is not None and pipeline > 1:
        args += ["--pipeline-parallel-size", str(pipeline)]
    if engine.max_model_len is not None:
        args += ["--max-model-len", str(engine.max_model_len)]
    if engine.max_num_seqs is not None:
        args += ["--max-num-seqs", str(engine.max_num_seqs)]
    if engine.gpu_memory_utilization is not None:
        args += ["--gpu-memory-utilization", repr(engine.gpu_memory_utilization)]
    args += ["--shutdown-timeout", str(drain_seconds(spec))]
    if sizing is not None and nodes_per_replica(sizing) > 1:
        args += multi_node_args(sizing, role)
    config = speculative_config(spec, sizing)
    if config is not None:
        args += ["--speculative-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    if role == "leader" and probe_of(spec) is not None:
        # Runs the probe inside vLLM's API server and gates readiness on it (engine/probe.py).
        args += ["--middleware", PROBE_MIDDLEWARE]
    return [*args, *engine.extra_args]


def probe_of(spec: Spec) -> ProbeSpec | None:
    """The probe every pod of this spec runs before it serves, if any."""
    analysis = spec.rollout.analysis
    return analysis.probe if analysis is not None else None
