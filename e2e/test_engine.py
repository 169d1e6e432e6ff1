"""The engine launcher with the real CPU vLLM and the tiny models, without the operator.

What a pod would run: `python -m specdeploy.engine serve -- <vllm args>`. A matching pair is
served with its draft; a mismatched one is refused with exit 3 and one line before vLLM starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_harness import (
    ACCEPTED_TOKENS,
    DRAFT_TOKENS,
    EnginePool,
    EngineServer,
    engine_pool,
    engine_python,
    run_launcher_until_exit,
    tiny_models,
    vllm_args,
)

pytestmark = [pytest.mark.e2e, pytest.mark.engine]

__all__ = ["engine_pool", "engine_python", "tiny_models"]  # fixtures used below

PROMPTS = [
    "The quick fox",
    "A lazy dog sees the river",
    "Every small engine serves",
    "This careful teacher reads the old book at night.",
]

_reference: dict[str, list[Any]] = {}


def greedy_outputs(server: EngineServer) -> list[Any]:
    """Token ids (text when ids are not returned) of greedy completions of PROMPTS."""
    outputs = []
    for prompt in PROMPTS:
        choice = server.complete(prompt)["choices"][0]
        outputs.append(choice.get("token_ids") or choice["text"])
    return outputs


def reference_outputs(pool: EnginePool) -> list[Any]:
    """Greedy outputs of the target served without speculation (computed once)."""
    key = pool.models["target"]
    if key not in _reference:
        plain = pool.get("plain")
        assert plain.counters().get(DRAFT_TOKENS, 0.0) == 0
        _reference[key] = greedy_outputs(plain)
    return _reference[key]


def acceptance(server: EngineServer) -> tuple[float, list[Any]]:
    """Acceptance rate over the greedy completions of PROMPTS, and those completions."""
    before = server.counters()
    outputs = greedy_outputs(server)
    after = server.counters()
    assert DRAFT_TOKENS in after, f"{DRAFT_TOKENS} missing from /metrics"
    assert ACCEPTED_TOKENS in after, f"{ACCEPTED_TOKENS} missing from /metrics"
    drafted = after[DRAFT_TOKENS] - before.get(DRAFT_TOKENS, 0.0)
    accepted = after[ACCEPTED_TOKENS] - before.get(ACCEPTED_TOKENS, 0.0)
    assert drafted > 0, "the engine proposed no draft tokens"
    return accepted / drafted, outputs


# --- served pairs ---------------------------------------------------------------------------


def test_good_draft_model_is_accepted_and_changes_no_output(engine_pool: EnginePool) -> None:
    engine_pool.start("plain", "draft-good")
    reference = reference_outputs(engine_pool)
    rate, outputs = acceptance(engine_pool.get("draft-good"))
    print(f"draft-good acceptance {rate:.3f}")
    assert rate >= 0.9
    assert outputs == reference


def test_completions_answer_through_the_launcher(engine_pool: EnginePool) -> None:
    answer = engine_pool.get("draft-good").complete("The quick fox", max_tokens=8)
    assert answer["model"] == "tiny"
    assert answer["usage"]["completion_tokens"] == 8
    assert answer["choices"][0]["text"]


def test_eagle3_head_is_served_and_changes_no_output(engine_pool: EnginePool) -> None:
    reference = reference_outputs(engine_pool)
    engine_pool.start("eagle3", "draft-bad")
    rate, outputs = acceptance(engine_pool.get("eagle3"))
    print(f"eagle3 (random head) acceptance {rate:.3f}")
    assert outputs == reference


def test_bad_draft_is_almost_never_accepted(engine_pool: EnginePool) -> None:
    reference = reference_outputs(engine_pool)
    rate, outputs = acceptance(engine_pool.get("draft-bad"))
    print(f"draft-bad acceptance {rate:.3f}")
    assert rate <= 0.2
    assert outputs == reference


def test_small_draft_is_mostly_accepted_and_changes_no_output(engine_pool: EnginePool) -> None:
    reference = reference_outputs(engine_pool)
    rate, outputs = acceptance(engine_pool.get("draft-small"))
    print(f"draft-small acceptance {rate:.3f}")
    assert rate >= 0.5
    assert outputs == reference


# --- refused pairs --------------------------------------------------------------------------

REFUSALS = [
    (
        "eagle3",
        "eagle3-wrong-hidden",
        "EAGLE-3 head expects target hidden size 512, target has 256",
    ),
    ("eagle3", "eagle3-bad-layers", "EAGLE-3 head reads target layers [1, 2, 7], target has 4"),
    (
        "eagle3",
        "eagle3-other-verifier",
        "draft was trained for verifier specdeploy-tiny/other-target",
    ),
    ("eagle3", "eagle3-other-arch", "verifier architectures Qwen3ForCausalLM differ"),
    ("draft_model", "draft-other-tokenizer", "draft tokenizer ("),
    ("draft_model", "draft-other-vocab", "draft vocabulary size 640 differs from the target's 512"),
    ("eagle3", "draft-good", "method eagle3 does not fit the draft checkpoint: it is a plain"),
    ("draft_model", "eagle3", "method draft_model does not fit the draft checkpoint: it is an"),
    ("ngram", "draft-good", "method ngram takes no draft model, but one is given"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[f"{m}-{d}" for m, d, _ in REFUSALS])
def test_mismatched_pair_is_refused_before_vllm_starts(
    engine_python: Path, tiny_models: dict[str, str], tmp_path: Path, case: tuple[str, str, str]
) -> None:
    method, draft, reason = case
    spec = {"method": method, "model": tiny_models[draft], "num_speculative_tokens": 3}
    args = vllm_args(tiny_models["target"], 1, speculative=spec)
    refusal = run_launcher_until_exit(engine_python, args, tmp_path)
    assert refusal.code == 3, refusal.output
    lines = refusal.termination_message.splitlines()
    assert len(lines) == 1
    assert reason in lines[0]
    # vLLM never started: no engine log line, and the refusal took launcher time only.
    assert "vllm.entrypoints" not in refusal.output
    assert "INFO" not in refusal.output
    assert refusal.seconds < 30


def test_missing_draft_is_exit_4(
    engine_python: Path, tiny_models: dict[str, str], tmp_path: Path
) -> None:
    spec = {"method": "eagle3", "model": str(tmp_path / "gone"), "num_speculative_tokens": 3}
    refusal = run_launcher_until_exit(
        engine_python, vllm_args(tiny_models["target"], 1, speculative=spec), tmp_path
    )
    assert refusal.code == 4, refusal.output
    assert refusal.termination_message.strip().endswith("does not exist")


def test_tiny_models_are_named_in_the_factory_output(tiny_models: dict[str, str]) -> None:
    expected = {
        "tokenizer",
        "target",
        "draft-good",
        "draft-bad",
        "draft-small",
        "eagle3",
        "eagle3-wrong-hidden",
        "eagle3-bad-layers",
        "eagle3-other-verifier",
        "eagle3-other-arch",
        "draft-other-tokenizer",
        "draft-other-vocab",
    }
    assert set(tiny_models) == expected
    head = json.loads((Path(tiny_models["eagle3"]) / "config.json").read_text())
    assert head["speculators_config"]["verifier"]["name_or_path"] == "specdeploy-tiny/target"
