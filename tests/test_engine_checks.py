"""The pair checks against real-shaped configs: fields copied from public checkpoints."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from specdeploy.engine.checks import (
    CheckStatus,
    DraftKind,
    ModelFacts,
    check_draft_vocab,
    check_eagle3_shape,
    check_method,
    check_pair,
    check_tokenizer,
    check_verifier,
    check_vocab_size,
    classify_draft,
    names_match,
    summarize_failures,
)

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


@pytest.fixture
def llama8b() -> dict[str, Any]:
    return config("llama-3.1-8b-instruct")


@pytest.fixture
def eagle3_head() -> dict[str, Any]:
    return config("llama-3.1-8b-instruct-speculator.eagle3")


# --- what a draft is ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("llama-3.1-8b-instruct-speculator.eagle3", DraftKind.EAGLE3_SPECULATORS),
        ("qwen3-8b-speculator.eagle3", DraftKind.EAGLE3_SPECULATORS),
        ("eagle3-llama3.1-instruct-8b-legacy", DraftKind.EAGLE3_LEGACY),
        ("llama-3.2-1b-instruct", DraftKind.CAUSAL_LM),
        ("qwen3-0.6b", DraftKind.CAUSAL_LM),
    ],
)
def test_classify_draft(name: str, kind: DraftKind) -> None:
    assert classify_draft(config(name)) is kind


# --- method against checkpoint ----------------------------------------------------------------


def test_eagle3_method_with_an_eagle3_head_passes(eagle3_head: dict[str, Any]) -> None:
    assert check_method("eagle3", eagle3_head).status is CheckStatus.OK


def test_eagle3_method_with_a_legacy_head_passes() -> None:
    result = check_method("eagle3", config("eagle3-llama3.1-instruct-8b-legacy"))
    assert result.status is CheckStatus.OK


def test_eagle3_method_with_a_plain_lm_is_refused() -> None:
    result = check_method("eagle3", config("llama-3.2-1b-instruct"))
    assert result.failed
    assert "plain language model" in result.message


def test_draft_model_method_with_an_eagle3_head_is_refused(eagle3_head: dict[str, Any]) -> None:
    result = check_method("draft_model", eagle3_head)
    assert result.failed
    assert (
        result.message
        == "method draft_model does not fit the draft checkpoint: it is an EAGLE-3 head"
    )


def test_draft_model_method_with_a_plain_lm_passes() -> None:
    assert check_method("draft_model", config("llama-3.2-1b-instruct")).status is CheckStatus.OK


def test_eagle_method_with_an_eagle3_head_is_refused(eagle3_head: dict[str, Any]) -> None:
    assert check_method("eagle", eagle3_head).failed


def test_eagle_method_with_an_older_one_layer_head_is_not_refused() -> None:
    # EAGLE-1 heads declare LlamaForCausalLM: they cannot be told from a one-layer LM.
    result = check_method("eagle", config("eagle-llama3.1-instruct-8b-legacy"))
    assert result.status is CheckStatus.SKIPPED


def test_ngram_with_a_model_is_refused() -> None:
    result = check_method("ngram", config("llama-3.2-1b-instruct"))
    assert result.failed
    assert "takes no draft model" in result.message


def test_ngram_without_a_model_passes() -> None:
    assert check_method("ngram", None).status is CheckStatus.OK


def test_a_model_method_without_a_model_is_refused() -> None:
    assert check_method("eagle3", None).failed


def test_mtp_without_a_model_passes() -> None:
    assert check_method("mtp", None).status is CheckStatus.OK


# --- declared verifier ------------------------------------------------------------------------


def test_verifier_served_by_hub_id_matches(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    assert check_verifier(eagle3_head, [LLAMA_8B], llama8b).status is CheckStatus.OK


def test_verifier_of_another_target_is_refused(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    result = check_verifier(eagle3_head, ["meta-llama/Llama-3.3-70B-Instruct"], llama8b)
    assert result.failed
    assert result.message == (
        "draft was trained for verifier meta-llama/Llama-3.1-8B-Instruct, "
        "but the target is meta-llama/Llama-3.3-70B-Instruct"
    )


def test_verifier_matches_a_volume_path_through_the_pair_name(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    # Served from a PVC: the pair's declared target id names it.
    names = ["/models/llama-8b", LLAMA_8B]
    assert check_verifier(eagle3_head, names, llama8b).status is CheckStatus.OK


def test_verifier_matches_a_volume_path_by_its_last_component(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    names = ["/mnt/models/Llama-3.1-8B-Instruct"]
    assert check_verifier(eagle3_head, names, llama8b).status is CheckStatus.OK


def test_verifier_matches_the_target_dirs_own_name(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    names = ["/models/target", "RedHatAI/whatever", "meta-llama/llama-3.1-8b-instruct"]
    assert check_verifier(eagle3_head, names, llama8b).status is CheckStatus.OK


def test_verifier_architectures_must_equal_the_targets(llama8b: dict[str, Any]) -> None:
    head = config("qwen3-8b-speculator.eagle3")
    head["speculators_config"]["verifier"]["name_or_path"] = LLAMA_8B
    result = check_verifier(head, [LLAMA_8B], llama8b)
    assert result.failed
    assert "Qwen3ForCausalLM" in result.message
    assert "LlamaForCausalLM" in result.message


def test_older_heads_without_verifier_are_skipped(llama8b: dict[str, Any]) -> None:
    result = check_verifier(config("eagle3-llama3.1-instruct-8b-legacy"), [LLAMA_8B], llama8b)
    assert result.status is CheckStatus.SKIPPED


@pytest.mark.parametrize(
    ("declared", "served", "match"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/llama-3.1-8b-instruct", True),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B", False),
        ("meta-llama/Llama-3.1-8B-Instruct", "other-org/Llama-3.1-8B-Instruct", False),
        ("/data/ckpt/Llama-3.1-8B-Instruct/", "meta-llama/Llama-3.1-8B-Instruct", True),
        (
            "/root/.cache/huggingface/hub/models--meta-llama--Llama-3.1-8B-Instruct/snapshots/0e9e",
            "meta-llama/Llama-3.1-8B-Instruct",
            True,
        ),
        ("Qwen/Qwen3-8B", "/models/Qwen3-8B", True),
        ("Qwen/Qwen3-8B", "/models/Qwen3-8B-Base", False),
    ],
)
def test_names_match(declared: str, served: str, match: bool) -> None:
    assert names_match(declared, served) is match


# --- EAGLE-3 shape ----------------------------------------------------------------------------


def test_eagle3_head_fits_its_target(eagle3_head: dict[str, Any], llama8b: dict[str, Any]) -> None:
    # target_hidden_size is null: vLLM uses the head's own hidden size, 4096.
    assert check_eagle3_shape(eagle3_head, llama8b).status is CheckStatus.OK


def test_eagle3_head_on_a_wider_target_is_refused(eagle3_head: dict[str, Any]) -> None:
    result = check_eagle3_shape(eagle3_head, config("llama-3.3-70b-instruct"))
    assert result.failed
    assert result.message == "EAGLE-3 head expects target hidden size 4096, target has 8192"


def test_explicit_target_hidden_size_is_compared(llama8b: dict[str, Any]) -> None:
    head = config("qwen3-8b-speculator.eagle3")
    head["target_hidden_size"] = 5120
    assert check_eagle3_shape(head, config("qwen3-8b")).failed


def test_aux_layers_beyond_the_target_are_refused() -> None:
    head = config("qwen3-8b-speculator.eagle3")
    assert check_eagle3_shape(head, config("qwen3-8b")).status is CheckStatus.OK
    shallow = copy.deepcopy(config("qwen3-8b"))
    shallow["num_hidden_layers"] = 28
    result = check_eagle3_shape(head, shallow)
    assert result.failed
    assert (
        result.message == "EAGLE-3 head reads target layers [1, 17, 32], target has 28 (ids 0..27)"
    )


def test_eagle3_shape_reads_multimodal_text_config(eagle3_head: dict[str, Any]) -> None:
    target = {"architectures": ["X"], "text_config": config("llama-3.1-8b-instruct")}
    assert check_eagle3_shape(eagle3_head, target).status is CheckStatus.OK


# --- vocabularies and tokenizers --------------------------------------------------------------


def test_draft_vocab_within_target_vocab(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    assert check_draft_vocab(eagle3_head, llama8b).status is CheckStatus.OK


def test_draft_vocab_larger_than_target_is_refused(eagle3_head: dict[str, Any]) -> None:
    small = {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "vocab_size": 16000}
    result = check_draft_vocab(eagle3_head, small)
    assert result.failed
    assert result.message == "draft vocabulary 32000 is larger than the target's 16000"


def test_eagle3_head_for_another_vocabulary_is_refused(eagle3_head: dict[str, Any]) -> None:
    # Llama 3.1 head (128256-token verifier vocab) on a Qwen3 target (151936).
    result = check_draft_vocab(eagle3_head, config("qwen3-8b"))
    assert result.failed
    assert "128256" in result.message


def test_draft_lm_vocab_size_must_equal_the_targets(llama8b: dict[str, Any]) -> None:
    assert check_vocab_size(config("llama-3.2-1b-instruct"), llama8b).status is CheckStatus.OK
    result = check_vocab_size(config("qwen3-0.6b"), llama8b)
    assert result.failed
    assert result.message == "draft vocabulary size 151936 differs from the target's 128256"


def test_tokenizer_fingerprints() -> None:
    assert check_tokenizer("a" * 64, "a" * 64).status is CheckStatus.OK
    assert check_tokenizer("a" * 64, "b" * 64).failed
    assert check_tokenizer(None, "b" * 64).status is CheckStatus.SKIPPED


# --- the whole pair ---------------------------------------------------------------------------


def test_a_matching_eagle3_pair_passes_every_check(
    eagle3_head: dict[str, Any], llama8b: dict[str, Any]
) -> None:
    results = check_pair(
        "eagle3",
        ModelFacts((LLAMA_8B,), llama8b),
        ModelFacts(("RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",), eagle3_head),
    )
    assert [r.check for r in results] == ["method", "verifier", "eagle3-shape", "draft-vocab"]
    assert not [r for r in results if r.failed]


def test_an_upgraded_target_with_the_old_head_is_refused_in_one_line(
    eagle3_head: dict[str, Any],
) -> None:
    results = check_pair(
        "eagle3",
        ModelFacts(("meta-llama/Llama-3.3-70B-Instruct",), config("llama-3.3-70b-instruct")),
        ModelFacts(("head",), eagle3_head),
    )
    line = summarize_failures(results)
    assert "\n" not in line
    assert line.startswith("draft was trained for verifier meta-llama/Llama-3.1-8B-Instruct")
    assert "target hidden size 4096, target has 8192" in line


def test_a_draft_lm_pair_checks_vocab_and_tokenizer(llama8b: dict[str, Any]) -> None:
    results = check_pair(
        "draft_model",
        ModelFacts((LLAMA_8B,), llama8b, "f" * 64),
        ModelFacts(
            ("meta-llama/Llama-3.2-1B-Instruct",), config("llama-3.2-1b-instruct"), "e" * 64
        ),
    )
    assert [r.check for r in results] == ["method", "vocab-size", "tokenizer"]
    assert [r.check for r in results if r.failed] == ["tokenizer"]


def test_heterogeneous_vocab_allows_another_tokenizer(llama8b: dict[str, Any]) -> None:
    # vLLM maps between vocabularies when use_heterogeneous_vocab is set (draft_model only).
    results = check_pair(
        "draft_model",
        ModelFacts((LLAMA_8B,), llama8b, "f" * 64),
        ModelFacts(("Qwen/Qwen3-0.6B",), config("qwen3-0.6b"), "e" * 64),
        heterogeneous_vocab=True,
    )
    assert not [r for r in results if r.failed]


def test_no_speculation_checks_nothing(llama8b: dict[str, Any]) -> None:
    assert check_pair(None, ModelFacts((LLAMA_8B,), llama8b), None) == []


def test_summary_is_bounded() -> None:
    results = check_pair("ngram", ModelFacts(("t",), {}), ModelFacts(("x" * 5000,), {}))
    assert len(summarize_failures(results, limit=100)) <= 100
