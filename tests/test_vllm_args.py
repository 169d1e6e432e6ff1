"""`vllm serve` arguments for each example, checked by hand against vLLM 0.33's flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specdeploy.api.config import OperatorConfig
from specdeploy.api.contract import OPERATOR_OWNED_FLAGS
from specdeploy.api.models import ScheduleStep, SizingDecision, SpeculativeDeployment
from specdeploy.api.models import SpeculativeDeploymentSpec as Spec
from specdeploy.plan.children.vllm_args import build_vllm_args, schedule_ranges
from specdeploy.plan.rollout.speculation import decide_speculation, served_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CONFIG = OperatorConfig.from_mapping({"batchQueues": ["batch"]})
HOST_PORT = ["--host", "$(SPECDEPLOY_HOST)", "--port", "$(SPECDEPLOY_PORT)"]
#: vLLM drains its requests on SIGTERM for the default grace period less 10 s.
SHUTDOWN = ["--shutdown-timeout", "110"]


def _served(name: str) -> Spec:
    spec = SpeculativeDeployment.from_body(yaml.safe_load((EXAMPLES / name).read_text())).spec
    return served_spec(spec, decide_speculation(spec, CONFIG))


def _gpus(count: int, resource: str = "nvidia.com/gpu") -> SizingDecision:
    return SizingDecision(resourceName=resource, count=count, tensorParallelSize=count)


def test_llama_8b_eagle3_on_a_mig_slice() -> None:
    args = build_vllm_args(_served("llama-8b-eagle3-mig.yaml"), _gpus(1, "nvidia.com/mig-3g.40gb"))
    assert args == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--revision",
        "main",
        "--served-model-name",
        "meta-llama/Llama-3.1-8B-Instruct",
        *HOST_PORT,
        "--tensor-parallel-size",
        "1",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "8",
        "--gpu-memory-utilization",
        "0.9",
        *SHUTDOWN,
        "--speculative-config",
        '{"draft_tensor_parallel_size":1,"method":"eagle3",'
        '"model":"RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3","num_speculative_tokens":3,'
        '"num_speculative_tokens_per_batch_size":[[1,4,3],[5,8,0]],"revision":"main"}',
    ]


def test_llama_70b_eagle3_on_four_gpus() -> None:
    args = build_vllm_args(_served("llama-70b-eagle3-tp4.yaml"), _gpus(4))
    assert args == [
        "meta-llama/Llama-3.3-70B-Instruct",
        "--revision",
        "main",
        "--served-model-name",
        "meta-llama/Llama-3.3-70B-Instruct",
        *HOST_PORT,
        "--tensor-parallel-size",
        "4",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "32",
        "--gpu-memory-utilization",
        "0.92",
        *SHUTDOWN,
        "--speculative-config",
        '{"draft_tensor_parallel_size":4,"method":"eagle3",'
        '"model":"yuhuili/EAGLE3-LLaMA3.3-Instruct-70B","num_speculative_tokens":5,'
        '"num_speculative_tokens_per_batch_size":[[1,8,5],[9,16,3],[17,32,0]],'
        '"revision":"main"}',
    ]


def test_ngram_pair_reads_the_model_from_the_volume() -> None:
    args = build_vllm_args(_served("qwen-7b-ngram.yaml"), _gpus(1))
    assert args == [
        "/models/hub-snapshots/Qwen/Qwen2.5-7B-Instruct",
        "--served-model-name",
        "Qwen/Qwen2.5-7B-Instruct",
        *HOST_PORT,
        "--tensor-parallel-size",
        "1",
        "--max-model-len",
        "32768",
        "--max-num-seqs",
        "32",
        *SHUTDOWN,
        "--speculative-config",
        '{"method":"ngram","num_speculative_tokens":4}',
    ]


def test_batch_queue_serves_the_target_alone() -> None:
    args = build_vllm_args(_served("llama-8b-batch-queue.yaml"), _gpus(1))
    assert args == [
        "meta-llama/Llama-3.1-8B-Instruct",
        "--revision",
        "main",
        "--served-model-name",
        "meta-llama/Llama-3.1-8B-Instruct",
        *HOST_PORT,
        "--tensor-parallel-size",
        "1",
        "--max-model-len",
        "8192",
        "--max-num-seqs",
        "256",
        *SHUTDOWN,
        "--enable-prefix-caching",
    ]


def test_speculate_k5_up_to_batch_8_then_off() -> None:
    steps = [ScheduleStep(maxBatchSize=8, tokens=5)]
    assert schedule_ranges(steps, 64) == [[1, 8, 5], [9, 64, 0]]


@pytest.mark.parametrize(
    ("steps", "max_num_seqs", "expected"),
    [
        ([(8, 5)], 8, [[1, 8, 5]]),
        ([(4, 5), (16, 2)], 32, [[1, 4, 5], [5, 16, 2], [17, 32, 0]]),
        ([(1, 3)], 2, [[1, 1, 3], [2, 2, 0]]),
    ],
)
def test_schedule_ranges_cover_one_to_max_num_seqs(
    steps: list[tuple[int, int]], max_num_seqs: int, expected: list[list[int]]
) -> None:
    schedule = [ScheduleStep(maxBatchSize=b, tokens=k) for b, k in steps]
    assert schedule_ranges(schedule, max_num_seqs) == expected


def test_schedule_in_the_speculative_config() -> None:
    spec = Spec.model_validate(
        {
            "pair": {
                "version": "1",
                "target": {"model": "/m/target"},
                "draft": {
                    "method": "draft_model",
                    "model": "/m/draft",
                    "numSpeculativeTokens": 5,
                    "schedule": [{"maxBatchSize": 8, "tokens": 5}],
                },
            },
            "engine": {"maxNumSeqs": 24},
        }
    )
    args = build_vllm_args(spec, None)
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 8, 5], [9, 24, 0]]
    assert config["method"] == "draft_model"
    assert "revision" not in config
    assert "--revision" not in args
    assert args[args.index("--tensor-parallel-size") + 1] == "1"


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_flag_the_operator_sets_is_one_the_crd_refuses_in_extra_args(name: str) -> None:
    spec = _served(name)
    spec = spec.model_copy(update={"engine": spec.engine.model_copy(update={"extra_args": []})})
    flags = {a.split("=")[0] for a in build_vllm_args(spec, _gpus(4)) if a.startswith("--")}
    assert flags, name
    assert flags <= set(OPERATOR_OWNED_FLAGS), flags - set(OPERATOR_OWNED_FLAGS)
