"""What an engine pod asks of its node beside its GPUs when the spec does not say (no I/O).

A GPU pod with only `nvidia.com/gpu` limits is QoS BestEffort: the first pod the kubelet evicts
under memory pressure, with no memory ceiling (weights pass through host memory on their way to
the devices) and no CPU reserved for the API server's tokenizer. So every GPU engine pod of a
revision made with hash schema 3 or later (plan.children.revision) asks, where
spec.engine.resources leaves it unset:

- CPU: a request of 2 cores (vLLM's API server and its engine core's busy loop) and 1 per device
  (one worker process each), and no limit (a CPU limit throttles the tokenizer mid-request);
- memory: a request and an equal limit of 8 GiB for the processes, 4 GiB per device (each
  worker's CUDA context and PyTorch), the weights this pod holds (read through the page cache,
  which counts against the limit) and the /dev/shm size, rounded up to 8 GiB (so a new weights
  estimate a few per cent off makes no new revision);

and every engine pod's `/dev/shm` (a memory-backed emptyDir, whose pages count against the
memory limit) gets a size limit: 2 GiB per device, 1 GiB on CPU.

The pod is Burstable (a memory ceiling, CPU reserved, evicted after BestEffort pods); setting
both engine.resources.cpu and memory makes it Guaranteed. CPU serving keeps its sized host memory
(SizingDecision.host_memory). OperatorConfig.pod_resource_defaults false leaves CPU and memory
unset as before (for a Kueue ClusterQueue that does not cover cpu and memory, which would refuse
a Workload asking for them); the /dev/shm size limit stays.
"""

from __future__ import annotations

import math

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec

#: Cores for vLLM's API server and its engine core.
BASE_CPU = 2
#: GiB of host memory for the engine's processes, and for each device's worker.
BASE_MEMORY_GIB = 8
PER_DEVICE_MEMORY_GIB = 4
#: The memory request moves in steps of this many GiB.
MEMORY_STEP_GIB = 8
#: GiB of /dev/shm per device (torch.distributed and vLLM's message queues between workers),
#: and for a CPU engine (vLLM 0.32's CPU engine asks for 160 MiB at tensor parallel size 1).
PER_DEVICE_SHM_GIB = 2
CPU_SHM_GIB = 1


def shm_size_gib(sizing: SizingDecision | None) -> int:
    """The size limit of the pod's /dev/shm, in GiB."""
    if sizing is None or sizing.host_memory is not None:
        return CPU_SHM_GIB
    return PER_DEVICE_SHM_GIB * sizing.count


def weights_per_pod_gib(sizing: SizingDecision) -> float:
    """The weights one pod holds: its share of the target's pipeline stages and the draft (which
    runs on the last stage, the largest share)."""
    if sizing.memory is None:
        return 0.0
    nodes = sizing.nodes_per_replica or 1
    return sizing.memory.target_weights_gib / nodes + sizing.memory.draft_weights_gib


def default_resources(
    spec: Spec, sizing: SizingDecision | None, config: OperatorConfig
) -> dict[str, str]:
    """The CPU request and memory request (and limit) a GPU engine pod gets where
    spec.engine.resources leaves them unset; empty for CPU serving, unsized pods, and with
    config.pod_resource_defaults off."""
    if not config.pod_resource_defaults or sizing is None or sizing.host_memory is not None:
        return {}
    wanted = spec.engine.resources
    result: dict[str, str] = {}
    if wanted is None or wanted.cpu is None:
        result["cpu"] = str(BASE_CPU + sizing.count)
    if wanted is None or wanted.memory is None:
        memory = (
            BASE_MEMORY_GIB
            + PER_DEVICE_MEMORY_GIB * sizing.count
            + weights_per_pod_gib(sizing)
            + shm_size_gib(sizing)
        )
        result["memory"] = f"{math.ceil(memory / MEMORY_STEP_GIB) * MEMORY_STEP_GIB}Gi"
    return result
