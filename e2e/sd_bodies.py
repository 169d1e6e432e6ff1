"""SpeculativeDeployments of real model pairs, as the e2e suites and the contract test use them.

On the test bed their pods are KWOK-run (no engine runs); the sizing is real, from the shipped
model catalog and the KWOK nodes' GPUs (docs/sizing.md).
"""

from __future__ import annotations

from typing import Any

H100 = "NVIDIA-H100-80GB-HBM3"


def llama_8b(
    name: str, namespace: str, draft_revision: str = "eagle3-r1", **spec: Any
) -> dict[str, Any]:
    """Llama 3.1 8B with its EAGLE-3 head: sized onto a MIG 3g.40gb slice (docs/sizing.md)."""
    body: dict[str, Any] = {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "pair": {
                "version": "3.1",
                "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "revision": "main"},
                "draft": {
                    "method": "eagle3",
                    "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                    "revision": draft_revision,
                    "numSpeculativeTokens": 3,
                },
            },
            "engine": {"maxModelLen": 8192, "maxNumSeqs": 8, "gpuMemoryUtilization": 0.92},
            "placement": {"queue": "interactive", "speculation": "Auto"},
        },
    }
    body["spec"].update(spec)
    return body


def hub_sd(namespace: str, name: str = "hub") -> dict[str, Any]:
    """A pair outside the model catalog whose config.json is read with the hub token (Secret
    `hub-token`, key `token`)."""
    return llama_8b(
        name,
        namespace,
        pair={
            "version": "1",
            "target": {"model": "example-org/unlisted-8b", "revision": "0123abcd"},
            "draft": {"method": "ngram", "numSpeculativeTokens": 3},
        },
        modelSource={"hub": {"tokenSecretRef": {"name": "hub-token", "key": "token"}}},
    )


def llama_405b_across_nodes(name: str, namespace: str, version: str = "3.1") -> dict[str, Any]:
    """Llama 3.1 405B alone on H100s, spread over nodes: two of eight GPUs each, a
    LeaderWorkerSet group per replica (docs/sizing.md); one group takes the whole H100 quota of
    the test bed's queues (16)."""
    return llama_8b(
        name,
        namespace,
        pair={
            "version": version,
            "target": {"model": "meta-llama/Llama-3.1-405B-Instruct", "revision": "main"},
            "draft": {"method": "none"},
        },
        engine={"maxModelLen": 8192, "maxNumSeqs": 16},
        placement={
            "queue": "interactive",
            "gpu": {"product": "NVIDIA-H100-80GB-HBM3"},
            "nodesPerReplica": "auto",
        },
        revisionHistoryLimit=1,
    )


#: The simulator's 70B target (docs/simulator.md): its shape, as sizing reads it.
SIM_70B = "sim/llama-3.1-70b-h100"
SIM_70B_SHAPE = {
    "parametersBillion": 70.6,
    "layers": 80,
    "hiddenSize": 8192,
    "attentionHeads": 64,
    "kvHeads": 8,
    "vocabSize": 128256,
    "dtype": "bfloat16",
}


def sim_70b(
    name: str,
    namespace: str,
    draft: str | None,
    version: str,
    *,
    tokens: int = 2,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The simulator's 70B on four whole H100s (tensor parallel 4), with the named simulator
    draft profile (None: the target alone); its pods run the simulator through the launcher."""
    spec_draft: dict[str, Any] = {"method": "none"}
    if draft is not None:
        method = "draft_model" if "draft-" in draft else "eagle3"
        spec_draft = {"method": method, "model": draft, "numSpeculativeTokens": tokens}
        if method == "draft_model":
            spec_draft["shape"] = {**SIM_70B_SHAPE, "parametersBillion": 1.0, "layers": 16}
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "pair": {
                "version": version,
                "target": {"model": SIM_70B, "shape": SIM_70B_SHAPE},
                "draft": spec_draft,
            },
            "engine": {
                "tensorParallelSize": 4,
                "maxModelLen": 8192,
                "maxNumSeqs": 32,
                "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
            },
            "placement": {
                "queue": "interactive",
                "speculation": "Auto",
                "gpu": {"product": H100, "mig": "Never"},
            },
        },
    }
