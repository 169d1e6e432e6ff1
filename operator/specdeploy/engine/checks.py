"""Pair checks: does this draft belong to this target?

Pure functions over the models' parsed `config.json` dicts (and tokenizer fingerprints computed
by the launcher). vLLM checks none of this: it happily serves an EAGLE-3 head trained for another
target and just never accepts a token, or crashes deep in the model runner on a shape mismatch.

Every check returns a `CheckResult` with a one-line message a person can act on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specdeploy.api.contract import MODEL_FREE_METHODS

Config = Mapping[str, Any]


class CheckStatus(StrEnum):
    OK = "ok"
    MISMATCH = "mismatch"
    #: The check does not apply, or the checkpoint does not carry what it needs.
    SKIPPED = "skipped"


class DraftKind(StrEnum):
    """What a draft checkpoint is, judged from its config.json alone."""

    EAGLE3_SPECULATORS = "eagle3-speculators"
    EAGLE3_LEGACY = "eagle3-legacy"
    EAGLE_SPECULATORS = "eagle-speculators"
    EAGLE_LEGACY = "eagle-legacy"
    OTHER_SPECULATORS = "other-speculators"
    CAUSAL_LM = "causal-lm"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check; `message` is one line."""

    check: str
    status: CheckStatus
    message: str

    @property
    def failed(self) -> bool:
        return self.status is CheckStatus.MISMATCH


def _ok(check: str, message: str) -> CheckResult:
    return CheckResult(check, CheckStatus.OK, message)


def _mismatch(check: str, message: str) -> CheckResult:
    return CheckResult(check, CheckStatus.MISMATCH, message)


def _skipped(check: str, message: str) -> CheckResult:
    return CheckResult(check, CheckStatus.SKIPPED, message)


# --- reading configs --------------------------------------------------------------------------


def text_config(config: Config) -> Config:
    """The language-model part of a config (multimodal configs nest it under `text_config`)."""
    nested = config.get("text_config")
    if isinstance(nested, Mapping) and "hidden_size" not in config:
        return nested
    return config


def _int(config: Config, key: str) -> int | None:
    value = text_config(config).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _architectures(config: Config) -> list[str]:
    value = config.get("architectures")
    return [str(a) for a in value] if isinstance(value, list) else []


def speculators_verifier(draft: Config) -> Config | None:
    """The `speculators_config.verifier` block of a speculators-format draft, if any."""
    spec = draft.get("speculators_config")
    if not isinstance(spec, Mapping):
        return None
    verifier = spec.get("verifier")
    return verifier if isinstance(verifier, Mapping) else None


def _layer_config(draft: Config) -> Config:
    """The draft's own transformer layer config (speculators nest it; older heads do not)."""
    nested = draft.get("transformer_layer_config")
    return nested if isinstance(nested, Mapping) else draft


def classify_draft(draft: Config) -> DraftKind:
    """Tell what a draft checkpoint is: an EAGLE(-3) head (speculators or older format) or an LM."""
    spec_type = draft.get("speculators_model_type")
    if isinstance(spec_type, str):
        if spec_type == "eagle3":
            return DraftKind.EAGLE3_SPECULATORS
        if spec_type == "eagle":
            return DraftKind.EAGLE_SPECULATORS
        return DraftKind.OTHER_SPECULATORS
    archs = " ".join(_architectures(draft)).lower()
    if "eagle3" in archs:
        return DraftKind.EAGLE3_LEGACY
    if "eagle" in archs:
        return DraftKind.EAGLE_LEGACY
    if "draft_vocab_size" in draft and draft.get("num_hidden_layers") == 1:
        # EAGLE-3 heads published before the speculators format: one layer and a draft vocab.
        return DraftKind.EAGLE3_LEGACY
    if any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in _architectures(draft)):
        return DraftKind.CAUSAL_LM
    return DraftKind.UNKNOWN


# --- names ------------------------------------------------------------------------------------

_HUB_CACHE_DIR = re.compile(r"models--([^/]+)--([^/]+)(?:/snapshots/[^/]+)?/?$")


def _looks_like_path(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1


def _name_forms(name: str) -> tuple[str, str]:
    """(canonical id, last path component) of a model name, a local path or a cache dir."""
    cleaned = name.strip().rstrip("/")
    cached = _HUB_CACHE_DIR.search(cleaned)
    if cached:
        cleaned = f"{cached.group(1)}/{cached.group(2)}"
    return cleaned.lower(), cleaned.rsplit("/", 1)[-1].lower()


def names_match(declared: str, served: str) -> bool:
    """Whether a declared verifier name designates the served model.

    Hub ids match exactly (case-insensitively). When either side is a local path, as when a head
    was trained against a local copy or the target is mounted from a volume, the last path
    component must match the other's repository name.
    """
    d_full, d_tail = _name_forms(declared)
    s_full, s_tail = _name_forms(served)
    if d_full == s_full:
        return True
    if _looks_like_path(declared) or _looks_like_path(served):
        return d_tail == s_tail
    return False


# --- the checks -------------------------------------------------------------------------------


def check_method(method: str, draft: Config | None) -> CheckResult:
    """The declared speculative method fits what the draft checkpoint is."""
    name = "method"
    if method in MODEL_FREE_METHODS:
        if draft is not None:
            return _mismatch(name, f"method {method} takes no draft model, but one is given")
        return _ok(name, f"method {method} needs no draft model")
    if draft is None:
        if method == "mtp":
            return _ok(name, "method mtp uses the target's own MTP layers")
        return _mismatch(name, f"method {method} needs a draft model, none is given")
    kind = classify_draft(draft)
    expected: dict[str, set[DraftKind]] = {
        "eagle3": {DraftKind.EAGLE3_SPECULATORS, DraftKind.EAGLE3_LEGACY},
        "eagle": {DraftKind.EAGLE_SPECULATORS, DraftKind.EAGLE_LEGACY},
        "draft_model": {DraftKind.CAUSAL_LM},
    }
    wanted = expected.get(method)
    if wanted is None:
        return _skipped(name, f"method {method}: draft checkpoint kind {kind} not checked")
    if kind in wanted:
        return _ok(name, f"method {method} fits a {kind} draft")
    if kind is DraftKind.UNKNOWN:
        return _skipped(name, f"method {method}: cannot tell what the draft checkpoint is")
    if method == "eagle" and kind is DraftKind.CAUSAL_LM and draft.get("num_hidden_layers") == 1:
        # Older EAGLE heads declare a plain LlamaForCausalLM with one layer.
        return _skipped(name, "method eagle: a one-layer LM may be an older EAGLE head")
    what = {
        DraftKind.EAGLE3_SPECULATORS: "an EAGLE-3 head",
        DraftKind.EAGLE3_LEGACY: "an EAGLE-3 head",
        DraftKind.EAGLE_SPECULATORS: "an EAGLE head",
        DraftKind.EAGLE_LEGACY: "an EAGLE head",
        DraftKind.OTHER_SPECULATORS: f"a {draft.get('speculators_model_type')} speculator",
        DraftKind.CAUSAL_LM: "a plain language model",
    }[kind]
    return _mismatch(name, f"method {method} does not fit the draft checkpoint: it is {what}")


def check_verifier(draft: Config, served_names: Sequence[str], target: Config) -> CheckResult:
    """The draft's declared verifier (speculators format) is the served target.

    `served_names` are the names the target goes by: the id it is served from, the pair's declared
    target model, the target directory's own `_name_or_path`. Architectures must equal the
    target's `architectures`.
    """
    name = "verifier"
    verifier = speculators_verifier(draft)
    if verifier is None:
        return _skipped(name, "draft declares no verifier (older format); names not checked")
    declared = verifier.get("name_or_path")
    known = [n for n in served_names if n]
    if (
        isinstance(declared, str)
        and declared
        and known
        and not any(names_match(declared, n) for n in known)
    ):
        first, *others = dict.fromkeys(known)
        also = f" (also named {', '.join(others)})" if others else ""
        return _mismatch(
            name, f"draft was trained for verifier {declared}, but the target is {first}{also}"
        )
    declared_archs = verifier.get("architectures")
    target_archs = _architectures(target)
    if (
        isinstance(declared_archs, list)
        and declared_archs
        and target_archs
        and sorted(map(str, declared_archs)) != sorted(target_archs)
    ):
        return _mismatch(
            name,
            f"draft's verifier architectures {','.join(map(str, declared_archs))} "
            f"differ from the target's {','.join(target_archs)}",
        )
    return _ok(name, f"draft's declared verifier {declared} is the target")


def check_eagle3_shape(draft: Config, target: Config) -> CheckResult:
    """An EAGLE-3 head reads hidden states of the target's size from layers it has."""
    name = "eagle3-shape"
    layer = _layer_config(draft)
    declared_hidden = draft.get("target_hidden_size")
    if not isinstance(declared_hidden, int):
        # vLLM falls back to the head's own hidden size when target_hidden_size is absent.
        declared_hidden = _int(layer, "hidden_size")
    target_hidden = _int(target, "hidden_size")
    if (
        declared_hidden is not None
        and target_hidden is not None
        and declared_hidden != target_hidden
    ):
        return _mismatch(
            name,
            f"EAGLE-3 head expects target hidden size {declared_hidden}, "
            f"target has {target_hidden}",
        )
    layers = _int(target, "num_hidden_layers")
    aux = draft.get("eagle_aux_hidden_state_layer_ids")
    if isinstance(aux, list) and layers is not None:
        bad = [i for i in aux if not isinstance(i, int) or i < 0 or i >= layers]
        if bad:
            return _mismatch(
                name,
                f"EAGLE-3 head reads target layers {aux}, target has {layers} "
                f"(ids 0..{layers - 1})",
            )
    return _ok(name, f"EAGLE-3 head fits target hidden size {target_hidden}, {layers} layers")


def check_draft_vocab(draft: Config, target: Config) -> CheckResult:
    """An EAGLE-3 head's draft vocabulary fits within the target's, and its verifier vocab is it."""
    name = "draft-vocab"
    target_vocab = _int(target, "vocab_size")
    if target_vocab is None:
        return _skipped(name, "target config has no vocab_size")
    draft_vocab = draft.get("draft_vocab_size")
    if isinstance(draft_vocab, int) and draft_vocab > target_vocab:
        return _mismatch(
            name, f"draft vocabulary {draft_vocab} is larger than the target's {target_vocab}"
        )
    layer_vocab = _int(_layer_config(draft), "vocab_size")
    if layer_vocab is not None and layer_vocab != target_vocab:
        return _mismatch(
            name, f"draft head maps to a {layer_vocab}-token vocabulary, target has {target_vocab}"
        )
    return _ok(name, f"draft vocabulary {draft_vocab or layer_vocab} fits target's {target_vocab}")


def check_vocab_size(draft: Config, target: Config) -> CheckResult:
    """A draft LM proposes token ids from the target's vocabulary: the sizes must be equal."""
    name = "vocab-size"
    draft_vocab, target_vocab = _int(draft, "vocab_size"), _int(target, "vocab_size")
    if draft_vocab is None or target_vocab is None:
        return _skipped(name, "vocab_size missing from a config")
    if draft_vocab != target_vocab:
        return _mismatch(
            name, f"draft vocabulary size {draft_vocab} differs from the target's {target_vocab}"
        )
    return _ok(name, f"draft and target share a vocabulary of {target_vocab}")


def check_tokenizer(draft_fingerprint: str | None, target_fingerprint: str | None) -> CheckResult:
    """A draft LM must tokenize like the target: same tokenizer vocabulary fingerprint."""
    name = "tokenizer"
    if draft_fingerprint is None or target_fingerprint is None:
        return _skipped(name, "no tokenizer files to compare")
    if draft_fingerprint != target_fingerprint:
        return _mismatch(
            name,
            f"draft tokenizer ({draft_fingerprint[:12]}) differs from the target's "
            f"({target_fingerprint[:12]})",
        )
    return _ok(name, f"draft and target tokenizers are the same ({target_fingerprint[:12]})")


@dataclass(frozen=True)
class ModelFacts:
    """What the checks know about one model: the names it goes by, its config, its tokenizer."""

    names: tuple[str, ...]
    config: Config
    tokenizer_fingerprint: str | None = None


def check_pair(
    method: str | None,
    target: ModelFacts,
    draft: ModelFacts | None,
    *,
    heterogeneous_vocab: bool = False,
) -> list[CheckResult]:
    """Every check that applies to this pair, in a stable order.

    `heterogeneous_vocab` is the speculative config's `use_heterogeneous_vocab`: vLLM then maps
    a draft LM's vocabulary onto the target's, so different vocabularies are allowed.
    """
    if method is None or method == "none":
        return []
    results = [check_method(method, draft.config if draft else None)]
    if draft is None or results[0].failed:
        return results
    kind = classify_draft(draft.config)
    if kind in (
        DraftKind.EAGLE3_SPECULATORS,
        DraftKind.EAGLE_SPECULATORS,
        DraftKind.OTHER_SPECULATORS,
    ):
        results.append(check_verifier(draft.config, target.names, target.config))
    if kind in (DraftKind.EAGLE3_SPECULATORS, DraftKind.EAGLE3_LEGACY):
        results.append(check_eagle3_shape(draft.config, target.config))
        results.append(check_draft_vocab(draft.config, target.config))
    if kind is DraftKind.CAUSAL_LM and heterogeneous_vocab:
        results.append(
            _skipped("vocab-size", "use_heterogeneous_vocab: vLLM maps the draft's vocabulary")
        )
    elif kind is DraftKind.CAUSAL_LM:
        results.append(check_vocab_size(draft.config, target.config))
        results.append(check_tokenizer(draft.tokenizer_fingerprint, target.tokenizer_fingerprint))
    return results


def failures(results: Iterable[CheckResult]) -> list[CheckResult]:
    return [r for r in results if r.failed]


def summarize_failures(results: Iterable[CheckResult], limit: int = 1024) -> str:
    """One line naming every mismatch, short enough for a termination message."""
    line = "; ".join(r.message for r in failures(results))
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."
