"""The revision hash is stable, moves with every pod-changing input and ignores the rest."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from specdeploy.api.config import OperatorConfig
from specdeploy.api.models import SizingDecision, SpeculativeDeploymentSpec
from specdeploy.plan.children.revision import HASH_SCHEMAS, revision_hash
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec

SPEC: dict[str, Any] = {
    "replicas": 2,
    "pair": {
        "version": "3.1",
        "target": {"model": "meta-llama/Llama-3.1-8B-Instruct", "revision": "abc123"},
        "draft": {
            "method": "eagle3",
            "model": "org/eagle3-head",
            "revision": "def456",
            "numSpeculativeTokens": 3,
            "schedule": [{"maxBatchSize": 8, "tokens": 3}],
        },
    },
    "engine": {"maxModelLen": 8192, "maxNumSeqs": 16, "gpuMemoryUtilization": 0.9},
    "modelSource": {"hub": {"tokenSecretRef": {"name": "hf-token", "key": "token"}}},
    "placement": {"queue": "interactive", "priorityClass": "high", "speculation": "Auto"},
    "rollout": {"canary": {"replicas": 1}, "analysis": {"minDraftTokens": 100}},
}
SIZING: dict[str, Any] = {
    "resourceName": "nvidia.com/mig-3g.40gb",
    "count": 1,
    "tensorParallelSize": 1,
    "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
    "message": "fits a 3g.40gb slice",
}
CONFIG: dict[str, Any] = {"engineImage": "specdeploy/engine:0.1.0", "batchQueues": ["batch"]}

# Hand-frozen: a revision keeps the hash of the schema it was made with (revision_for derives
# the older ones), so the hash of a schema never changes: a new pod shape is a new HASH_SCHEMA,
# with a hash of its own frozen here beside the older ones.
EXPECTED_HASH = "c0c514a953"
EXPECTED_HASHES = {2: "04140c8996", 3: EXPECTED_HASH}


def _hash(
    spec: dict[str, Any], sizing: dict[str, Any] | None = SIZING, config: dict[str, Any] = CONFIG
) -> str:
    parsed = SpeculativeDeploymentSpec.model_validate(spec)
    operator = OperatorConfig.from_mapping(config)
    served = served_spec(parsed, decide_speculation(parsed, operator))
    decision = None if sizing is None else SizingDecision.model_validate(sizing)
    return revision_hash(served, decision, operator)


def _changed(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC)
    *parents, leaf = path.split(".")
    node = spec
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return spec


def test_hash_is_ten_hex_chars_and_frozen() -> None:
    value = _hash(SPEC)
    assert len(value) == 10
    assert int(value, 16) >= 0
    assert value == EXPECTED_HASH
    parsed = SpeculativeDeploymentSpec.model_validate(SPEC)
    operator = OperatorConfig.from_mapping(CONFIG)
    served = served_spec(parsed, decide_speculation(parsed, operator))
    decision = SizingDecision.model_validate(SIZING)
    assert {
        schema: revision_hash(served, decision, operator, schema) for schema in HASH_SCHEMAS
    } == EXPECTED_HASHES


def test_hash_is_stable_across_key_order() -> None:
    reordered = dict(reversed(list(copy.deepcopy(SPEC).items())))
    assert _hash(reordered) == _hash(SPEC)


POD_CHANGES: list[tuple[str, Any]] = [
    ("pair.version", "3.2"),
    ("pair.target.model", "meta-llama/Llama-3.1-8B"),
    ("pair.target.revision", "abc124"),
    ("pair.draft.model", "org/other-head"),
    ("pair.draft.revision", "def457"),
    ("pair.draft.numSpeculativeTokens", 4),
    ("pair.draft.schedule", [{"maxBatchSize": 4, "tokens": 3}]),
    ("pair.draft.draftTensorParallelSize", 1),
    ("engine.image", "specdeploy/engine:0.2.0"),
    ("engine.maxModelLen", 4096),
    ("engine.maxNumSeqs", 32),
    ("engine.gpuMemoryUtilization", 0.85),
    ("engine.extraArgs", ["--enable-prefix-caching"]),
    ("engine.env", [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]),
    ("engine.resources", {"cpu": 8, "memory": "64Gi"}),
    ("modelSource", {"pvc": {"claimName": "models"}}),
    ("placement.nodeSelector", {"pool": "gpu"}),
    ("placement.tolerations", [{"key": "gpu", "operator": "Exists"}]),
    # Effective speculation: Off serves the target alone, which is other pods.
    ("placement.speculation", "Disabled"),
    ("placement.queue", "batch"),
    ("placement.device", "CPU"),
    ("modelCache", {"claimName": "hf-cache"}),
    ("pod", {"labels": {"team": "search"}}),
    ("pod", {"annotations": {"example.com/owner": "search"}}),
    ("pod", {"serviceAccountName": "llm"}),
    ("pod", {"imagePullSecrets": [{"name": "registry"}]}),
    ("pod", {"priorityClassName": "serving-high"}),
]


@pytest.mark.parametrize(("path", "value"), POD_CHANGES, ids=[p for p, _ in POD_CHANGES])
def test_pod_changing_field_changes_hash(path: str, value: Any) -> None:
    assert _hash(_changed(path, value)) != _hash(SPEC)


NOT_POD_CHANGES: list[tuple[str, Any]] = [
    ("replicas", 7),
    ("rollout.canary", {"replicas": 2}),
    ("rollout.analysis", {"minDraftTokens": 5000, "failureLimit": 5}),
    ("rollout.collapseGuard", {"floor": 0.3, "for": "1h", "action": "AlertOnly"}),
    ("revisionHistoryLimit", 9),
    ("placement.queue", "interactive-2"),
    ("placement.priorityClass", "low"),
    ("placement.speculation", "Enabled"),
    ("placement.gpu", {"product": "NVIDIA-A100-SXM4-80GB", "mig": "Required"}),
    # The KV budget and a pin reach the pods only through the sizing decision they give.
    ("engine.kvCacheTokens", 100000),
    ("placement.gpu", {"migProfile": "3g.40gb"}),
    (
        "pair.target.shape",
        {
            "parametersBillion": 8.03,
            "layers": 32,
            "hiddenSize": 4096,
            "attentionHeads": 32,
            "kvHeads": 8,
            "vocabSize": 128256,
            "dtype": "bfloat16",
        },
    ),
]


@pytest.mark.parametrize(("path", "value"), NOT_POD_CHANGES, ids=[p for p, _ in NOT_POD_CHANGES])
def test_rollout_and_placement_labels_leave_hash(path: str, value: Any) -> None:
    assert _hash(_changed(path, value)) == _hash(SPEC)


SIZING_CHANGES: list[Callable[[dict[str, Any]], None]] = [
    lambda s: s.update(resourceName="nvidia.com/gpu"),
    lambda s: s.update(count=2, tensorParallelSize=2),
    lambda s: s.update(nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}),
]


@pytest.mark.parametrize("change", SIZING_CHANGES)
def test_sizing_that_reaches_the_pod_changes_hash(change: Callable[[dict[str, Any]], None]) -> None:
    sizing = copy.deepcopy(SIZING)
    change(sizing)
    assert _hash(SPEC, sizing) != _hash(SPEC)


def test_sizing_explanation_leaves_hash() -> None:
    sizing = {**SIZING, "message": "another explanation", "gpuProduct": "A100", "migProfile": "3g"}
    assert _hash(SPEC, sizing) == _hash(SPEC)


def test_operator_engine_settings_change_hash() -> None:
    assert _hash(SPEC, config={**CONFIG, "engineImage": "specdeploy/engine:0.2.0"}) != _hash(SPEC)
    assert _hash(SPEC, config={**CONFIG, "engineCommand": ["python", "-m", "x"]}) != _hash(SPEC)
    assert _hash(SPEC, config={**CONFIG, "localProcess": True}) != _hash(SPEC)


def test_spec_image_wins_over_operator_default() -> None:
    pinned = _changed("engine.image", "specdeploy/engine:0.1.0")
    assert _hash(pinned) == _hash(pinned, config={**CONFIG, "engineImage": "other:1"})


def test_the_ephemeral_storage_of_downloaded_weights_is_in_the_hash() -> None:
    weighed = {
        **SIZING,
        "memory": {
            "targetWeightsGiB": 14.96,
            "draftWeightsGiB": 0.78,
            "kvCacheGiB": 8.25,
            "overheadGiB": 2.0,
            "requiredGiB": 28.2,
            "perDeviceGiB": 28.2,
        },
    }
    # A hub download requests ephemeral storage sized from the weights: other pods.
    assert _hash(SPEC, weighed) != _hash(SPEC)
    # Weights read from a volume are not downloaded: no storage request, only their load time
    # in the startup probe's budget (600 s + 2 s/GiB) and the memory request (8 GiB steps);
    # weights that leave both where they were leave the pods (and the hash) as before.
    on_volume = _changed("modelSource", {"pvc": {"claimName": "models"}})
    heavier = copy.deepcopy(weighed)
    heavier["memory"]["targetWeightsGiB"] = 15.5
    assert _hash(on_volume, heavier) == _hash(on_volume, weighed)
    assert _hash(SPEC, heavier) != _hash(SPEC, weighed)
