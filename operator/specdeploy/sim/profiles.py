"""The simulator's profiles: how a target steps and how a draft is accepted, as on a GPU.

A profile is named like a model (`sim/llama-3.1-70b-h100`, `sim/eagle3-good`): a pair in an SD
names a target profile and a draft profile, and the launcher's checks read the `config.json`
each profile declares, so a pair the checks refuse on a GPU is refused here too. The built-in
catalog is `catalog.yaml` beside this file; `SIM_CATALOG` (or `--sim-catalog`) names
a YAML file whose profiles are added to it, a name given twice replacing the built-in one. That
is how a test sets fault knobs on a profile of its own.

Times are milliseconds. A decode step of the target costs `step_ms` for a batch of one token
plus `step_ms_per_token` for each further token the step carries (every running request's
token, and with speculation each of its draft tokens verified too): memory-bound at small
batch, compute-bound as tokens grow. Prefill runs at `prefill_tokens_per_s`. A draft token
costs `draft_ms` plus `draft_ms_per_seq` per running request (up to `draft_saturation` of
them). Acceptance is conditional by
position: `acceptance[i]` is the chance that draft token i is accepted once tokens 0..i-1 were
(the last value repeats for positions beyond the list).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

CATALOG_ENV = "SIM_CATALOG"
PREFIX = "sim/"
BUILTIN_CATALOG = Path(__file__).with_name("catalog.yaml")


class ProfileError(ValueError):
    """A profile that does not exist or does not parse; the message names it."""


#: Each fault knob: its attribute on Faults, and its key in a catalog or /sim/faults.
FAULT_KNOBS: Mapping[str, str] = {
    "error_rates": "errorRates",
    "engine_error_rate": "engineErrorRate",
    "drift_after_s": "driftAfterSeconds",
    "drift_factor": "driftFactor",
    "first_token_extra_ms": "firstTokenExtraMs",
    "crash_after_requests": "crashAfterRequests",
    "start_delay_s": "startDelaySeconds",
}


@dataclass(frozen=True)
class Faults:
    """What a test can make a profile do wrong. Every knob is off by default."""

    #: HTTP status -> the share of completion requests answered with it before the engine.
    error_rates: Mapping[int, float] = field(default_factory=dict)
    #: The share of requests the engine finishes with finished_reason "error".
    engine_error_rate: float = 0.0
    #: Seconds after the server starts when acceptance starts to drift, and the factor every
    #: position's acceptance is multiplied by once it has.
    drift_after_s: float | None = None
    drift_factor: float = 1.0
    #: Added to every request's first token (a cold cache, a slow tokenizer).
    first_token_extra_ms: float = 0.0
    #: The process exits (code 1) once it has admitted this many requests.
    crash_after_requests: int | None = None
    #: Seconds before the port opens (a slow model load).
    start_delay_s: float = 0.0

    @classmethod
    def parse(cls, raw: Mapping[str, Any] | None, where: str) -> Faults:
        if not raw:
            return cls()
        unknown = sorted(set(raw) - set(FAULT_KNOBS.values()))
        if unknown:
            raise ProfileError(f"{where}: unknown fault knob(s) {', '.join(unknown)}")
        rates = {int(k): float(v) for k, v in (raw.get("errorRates") or {}).items()}
        for status, rate in rates.items():
            if not 400 <= status <= 599 or not 0.0 <= rate <= 1.0:
                raise ProfileError(f"{where}: errorRates {status}: {rate} is not a 4xx/5xx share")
        return cls(
            error_rates=rates,
            engine_error_rate=float(raw.get("engineErrorRate", 0.0)),
            drift_after_s=_opt_float(raw.get("driftAfterSeconds")),
            drift_factor=float(raw.get("driftFactor", 1.0)),
            first_token_extra_ms=float(raw.get("firstTokenExtraMs", 0.0)),
            crash_after_requests=_opt_int(raw.get("crashAfterRequests")),
            start_delay_s=float(raw.get("startDelaySeconds", 0.0)),
        )

    def to_json(self) -> dict[str, Any]:
        """The knobs as `parse` reads them (camelCase), unset ones left out."""
        base = Faults()
        found: dict[str, Any] = {}
        for attribute, key in FAULT_KNOBS.items():
            value = getattr(self, attribute)
            if value != getattr(base, attribute):
                found[key] = {str(k): v for k, v in value.items()} if key == "errorRates" else value
        return found

    def merged(self, other: Faults) -> Faults:
        """Both profiles' faults: the other's knobs win where it sets them."""
        base = Faults()
        changes = {
            name: getattr(other, name)
            for name in self.__dataclass_fields__
            if getattr(other, name) != getattr(base, name)
        }
        return replace(self, **changes)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class TargetProfile:
    name: str
    config: Mapping[str, Any]
    step_ms: float
    step_ms_per_token: float
    prefill_tokens_per_s: float
    #: The KV cache's capacity, in tokens (blocks of 16).
    kv_tokens: int
    #: The requests one step schedules at most when the arguments do not say (--max-num-seqs).
    max_num_seqs: int = 256
    #: The tokens one step schedules at most (--max-num-batched-tokens; vLLM's default 8192
    #: with chunked prefill on a GPU).
    max_num_batched_tokens: int = 8192
    faults: Faults = field(default_factory=Faults)
    source: str = ""


@dataclass(frozen=True)
class DraftProfile:
    name: str
    method: str
    config: Mapping[str, Any]
    acceptance: tuple[float, ...]
    draft_ms: float
    draft_ms_per_seq: float
    #: The running requests beyond which a draft token costs no more (a small head's kernels
    #: are launch-bound up to a few sequences, then batch for free); None: no such point.
    draft_saturation: int | None = None
    #: How much acceptance varies between prompts: a prompt's acceptance is scaled by a factor
    #: drawn from its text in [1 - spread, 1 + spread] (capped at 1).
    prompt_spread: float = 0.1
    faults: Faults = field(default_factory=Faults)
    source: str = ""

    def accept_chance(self, position: int, scale: float = 1.0) -> float:
        """The conditional acceptance of draft position `position` (0-based)."""
        table = self.acceptance
        raw = table[min(position, len(table) - 1)] if table else 0.0
        return max(0.0, min(1.0, raw * scale))

    def tokens_per_step(self, k: int) -> float:
        """Expected tokens a step emits with k draft tokens: 1 + sum of cumulative acceptance."""
        total, alive = 1.0, 1.0
        for position in range(k):
            alive *= self.accept_chance(position)
            total += alive
        return total


@dataclass(frozen=True)
class Catalog:
    targets: Mapping[str, TargetProfile]
    drafts: Mapping[str, DraftProfile]

    def target(self, name: str) -> TargetProfile:
        found = self.targets.get(name)
        if found is None:
            raise ProfileError(
                f"no simulator target profile {name} (known: {_known(self.targets)})"
            )
        return found

    def draft(self, name: str) -> DraftProfile:
        found = self.drafts.get(name)
        if found is None:
            raise ProfileError(f"no simulator draft profile {name} (known: {_known(self.drafts)})")
        return found

    def config_of(self, name: str) -> Mapping[str, Any]:
        """The config.json a profile declares, target or draft."""
        if name in self.targets:
            return self.targets[name].config
        if name in self.drafts:
            return self.drafts[name].config
        raise ProfileError(
            f"no simulator profile {name} (known: {_known({**self.targets, **self.drafts})})"
        )


def _known(table: Mapping[str, Any]) -> str:
    return ", ".join(sorted(table)) or "none"


def is_sim_model(name: str | None) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


# --- config.json of a profile ------------------------------------------------------------------


def target_config(name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    shape = raw.get("shape") or {}
    return {
        "_name_or_path": name,
        "architectures": [str(shape.get("architecture", "LlamaForCausalLM"))],
        "model_type": str(shape.get("modelType", "llama")),
        "hidden_size": int(shape.get("hiddenSize", 8192)),
        "num_hidden_layers": int(shape.get("layers", 80)),
        "num_attention_heads": int(shape.get("heads", 64)),
        "num_key_value_heads": int(shape.get("kvHeads", 8)),
        "vocab_size": int(shape.get("vocabSize", 128256)),
        "max_position_embeddings": int(shape.get("maxPositionEmbeddings", 131072)),
        "torch_dtype": "bfloat16",
    }


def draft_config(name: str, raw: Mapping[str, Any], targets: Mapping[str, Any]) -> dict[str, Any]:
    method = str(raw["method"])
    verifier = str(raw.get("verifier", ""))
    target = targets.get(verifier) or {}
    target_shape = target.get("shape") or {}
    hidden = int(target_shape.get("hiddenSize", 8192))
    layers = int(target_shape.get("layers", 80))
    vocab = int(target_shape.get("vocabSize", 128256))
    arch = str(target_shape.get("architecture", "LlamaForCausalLM"))
    shape = raw.get("shape") or {}
    if method == "eagle3":
        aux = shape.get("auxLayers") or [2, layers // 2, layers - 3]
        return {
            "_name_or_path": name,
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_config": {
                "algorithm": "eagle3",
                "verifier": {"name_or_path": verifier, "architectures": [arch]},
            },
            "transformer_layer_config": {
                "model_type": "llama",
                "hidden_size": int(shape.get("hiddenSize", hidden)),
                "num_hidden_layers": 1,
                "vocab_size": vocab,
            },
            "target_hidden_size": int(shape.get("targetHiddenSize", hidden)),
            "draft_vocab_size": int(shape.get("draftVocabSize", 32000)),
            "eagle_aux_hidden_state_layer_ids": [int(x) for x in aux],
        }
    return {
        "_name_or_path": name,
        "architectures": [arch],
        "model_type": "llama",
        "hidden_size": int(shape.get("hiddenSize", 2048)),
        "num_hidden_layers": int(shape.get("layers", 16)),
        "num_attention_heads": int(shape.get("heads", 32)),
        "num_key_value_heads": int(shape.get("kvHeads", 8)),
        "vocab_size": int(shape.get("vocabSize", vocab)),
        "torch_dtype": "bfloat16",
    }


# --- reading catalogs --------------------------------------------------------------------------


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ProfileError(f"simulator catalog {path}: {err}") from err
    if not isinstance(loaded, dict):
        raise ProfileError(f"simulator catalog {path}: not a mapping")
    return loaded


def _require(raw: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in raw:
        raise ProfileError(f"{where}: missing {key}")
    return raw[key]


def parse_catalog(documents: Sequence[Mapping[str, Any]]) -> Catalog:
    """Profiles from catalog documents, later documents replacing earlier names."""
    raw_targets: dict[str, Mapping[str, Any]] = {}
    raw_drafts: dict[str, Mapping[str, Any]] = {}
    for doc in documents:
        raw_targets.update(doc.get("targets") or {})
        raw_drafts.update(doc.get("drafts") or {})
    targets: dict[str, TargetProfile] = {}
    for name, raw in raw_targets.items():
        where = f"target {name}"
        if not is_sim_model(name):
            raise ProfileError(f"{where}: a profile's name starts with {PREFIX}")
        targets[name] = TargetProfile(
            name=name,
            config=target_config(name, raw),
            step_ms=float(_require(raw, "stepMs", where)),
            step_ms_per_token=float(raw.get("stepMsPerToken", 0.0)),
            prefill_tokens_per_s=float(_require(raw, "prefillTokensPerSecond", where)),
            kv_tokens=int(_require(raw, "kvTokens", where)),
            max_num_seqs=int(raw.get("maxNumSeqs", 256)),
            max_num_batched_tokens=int(raw.get("maxNumBatchedTokens", 8192)),
            faults=Faults.parse(raw.get("faults"), where),
            source=str(raw.get("source", "")),
        )
    drafts: dict[str, DraftProfile] = {}
    for name, raw in raw_drafts.items():
        where = f"draft {name}"
        if not is_sim_model(name):
            raise ProfileError(f"{where}: a profile's name starts with {PREFIX}")
        acceptance = tuple(float(a) for a in _require(raw, "acceptance", where))
        if not acceptance or not all(0.0 <= a <= 1.0 for a in acceptance):
            raise ProfileError(f"{where}: acceptance must be shares in [0, 1]")
        drafts[name] = DraftProfile(
            name=name,
            method=str(_require(raw, "method", where)),
            config=draft_config(name, raw, raw_targets),
            acceptance=acceptance,
            draft_ms=float(_require(raw, "draftMs", where)),
            draft_ms_per_seq=float(raw.get("draftMsPerSeq", 0.0)),
            draft_saturation=_opt_int(raw.get("draftSaturation")),
            prompt_spread=float(raw.get("promptSpread", 0.1)),
            faults=Faults.parse(raw.get("faults"), where),
            source=str(raw.get("source", "")),
        )
    return Catalog(targets, drafts)


def load_catalog(extra: str | os.PathLike[str] | None = None) -> Catalog:
    """The built-in catalog, with the profiles of `extra` (or $SIM_CATALOG) added."""
    documents = [_read_yaml(BUILTIN_CATALOG)]
    chosen = extra if extra is not None else os.environ.get(CATALOG_ENV)
    if chosen:
        documents.append(_read_yaml(Path(chosen)))
    return parse_catalog(documents)
