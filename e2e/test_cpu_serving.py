"""CPU serving (`placement.device: CPU`): the operator runs the real CPU engine with no GPU at all.

The operator runs in local-process mode with the engine venv's python as the engine command, so
the test bed's process kubelet runs the pod it builds as the real launcher + CPU vLLM. The SD names
no GPU and no MIG: its pod requests host memory sized from the weights and the KV budget, and no
`nvidia.com/*` resource; the operator sets VLLM_CPU_KVCACHE_SPACE itself (the SD's env leaves it
out) and picks its configured CPU engine image. One engine runs.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_cluster import (
    ENGINE_ENV,
    OperatorProcess,
    complete,
    engine_url,
    get_sd,
    operator_config,
    operator_in_namespace,
    ready_pod,
    tiny_sd,
)
from engine_harness import engine_python, tiny_models
from testbed import ClusterEnv, Kubectl, eventually
from testbed.conditions import is_ready

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

__all__ = ["engine_python", "tiny_models"]  # session fixtures used here

CPU_IMAGE = "specdeploy/engine-cpu:e2e"
ENGINE_READY_S = 420


@pytest.fixture
def cpu_bed(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    engine_python: Path,
    tmp_path: Path,
) -> Iterator[tuple[str, OperatorProcess]]:
    namespace = f"e2e-cpu-{uuid.uuid4().hex[:5]}"
    config = {
        **operator_config(str(engine_python), cluster.prometheus_url),
        "engineCpuImage": CPU_IMAGE,
    }
    with operator_in_namespace(
        kubectl, cluster.kubeconfig, namespace, config, tmp_path / "operator"
    ) as running:
        yield namespace, running


def cpu_sd(namespace: str, models: dict[str, str]) -> dict[str, Any]:
    """The tiny pair with its good draft, served on the CPU: no gpu settings, no KV env."""
    body = tiny_sd("cpu", namespace, models, "draft-small", "1-cpu")
    spec = body["spec"]
    spec["placement"] = {"device": "CPU", "speculation": "Enabled"}
    spec["engine"]["env"] = [
        {"name": k, "value": v} for k, v in ENGINE_ENV.items() if k != "VLLM_CPU_KVCACHE_SPACE"
    ]
    return body


def test_a_cpu_sd_runs_the_real_engine_without_any_gpu_resource(
    cluster: ClusterEnv,
    kubectl: Kubectl,
    cpu_bed: tuple[str, OperatorProcess],
    tiny_models: dict[str, str],
) -> None:
    namespace, _ = cpu_bed
    kubectl.apply([cpu_sd(namespace, tiny_models)])

    def ready() -> dict[str, Any] | None:
        sd = get_sd(kubectl, namespace, "cpu")
        return sd if is_ready(sd) else None

    sd = eventually(ready, ENGINE_READY_S, "the CPU SD Ready")
    sizing = sd["status"]["sizing"]
    assert sizing["resourceName"] == "memory"
    assert sizing.get("migProfile") is None
    assert sizing["hostMemory"].endswith("Gi")
    assert sizing["fullLengthSequences"] >= 1
    revision = sd["status"]["stableRevision"]
    pod = ready_pod(kubectl, namespace, "cpu", revision)
    assert pod is not None

    [container] = pod["spec"]["containers"]
    assert container["image"] == CPU_IMAGE
    resources = container["resources"]
    requested = {**resources.get("requests", {}), **resources.get("limits", {})}
    assert not [r for r in requested if r.startswith("nvidia.com/")], requested
    assert resources["requests"]["memory"] == resources["limits"]["memory"] == sizing["hostMemory"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_CPU_KVCACHE_SPACE"] == str(int(sizing["memory"]["kvCacheGiB"]))
    assert "nodeSelector" not in pod["spec"]
    assert sd["status"]["speculation"]["state"] == "Enabled"

    # The real engine answers through the pod: the tiny target, speculating with its draft.
    answer = complete(engine_url(cluster, pod), tiny_models["target"], "The cat sat on the", 8)
    assert answer["choices"][0]["text"]
