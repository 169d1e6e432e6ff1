"""Tiny models for tests and the demo, written to disk from fixed seeds (never downloaded).

`write_tiny_models(out)` writes one folder per model and returns {name: path}:

- `target`: a random Llama (hidden 256, 4 layers) with a small BPE tokenizer, `_name_or_path`
  `specdeploy-tiny/target`.
- `draft-good`: a draft_model with the target's own weights: accepted ~100 % under greedy decoding.
- `draft-small`: a one-layer draft_model cut from the target (its embeddings, first layer, norm
  and head; the target's later layers are damped so that it mostly agrees): a quarter of the
  target's layers, accepted most of the time.
- `draft-bad`: a random small Llama with the same tokenizer: accepted ~0 %.
- `draft-slow`: the target's own layers followed by eight more whose outputs are zeroed, so it
  predicts exactly what the target does (accepted 100 % under greedy decoding) at three times
  the target's cost a forward pass: a draft that is accepted but slow to run.
- `eagle3`: an EAGLE-3 head in the speculators format naming the target as its verifier
  (random weights, so its acceptance is ~0 %; it proves the wiring, not the speed-up).
- mismatched drafts for the pair checks: `eagle3-wrong-hidden` (target_hidden_size 512),
  `eagle3-bad-layers` (reads layer 7 of 4), `eagle3-other-verifier` (names another target),
  `eagle3-other-arch` (verifier architecture Qwen3ForCausalLM), `draft-other-tokenizer`
  (same vocabulary size, another tokenizer), `draft-other-vocab` (a 640-token vocabulary).
- `tokenizer`: the tokenizer alone.

Needs torch, transformers, tokenizers, safetensors and speculators (the engine virtualenv); they
are imported here only, so the operator package never needs them.
"""

# Heavy libraries are imported inside the functions: the operator package must not need them.
# ruff: noqa: PLC0415

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

#: Bump when the output changes in a way the code's own hash would not show.
FACTORY_VERSION = "1"
TARGET_ID = "specdeploy-tiny/target"
VOCAB_SIZE = 512
HIDDEN_SIZE = 256
TARGET_LAYERS = 4
EAGLE3_AUX_LAYERS = [1, 2, 3]
SEED = 20261122
#: Each message as `<|role|>content`, then the assistant's turn when asked for.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
#: Prompts in the tiny models' words that the probe runs in the tests and the judge's bench: on
#: draft-small (greedy, k=3) their acceptance spans 0.67 ("A node sees") to 1.00 ("The
#: scheduler places the pod on").
PROBE_PROMPTS = (
    "The cat sat on the",
    "In the morning the queue",
    "A node sees",
    "The scheduler places the pod on",
    "Every small engine serves",
    "This careful teacher reads",
)

_WORDS = {
    "det": ["the", "a", "every", "one", "this", "that", "some", "no"],
    "adj": [
        "quick",
        "lazy",
        "green",
        "silent",
        "bright",
        "old",
        "young",
        "small",
        "large",
        "careful",
        "happy",
        "tired",
        "strange",
        "gentle",
        "brave",
        "cold",
        "warm",
        "red",
    ],
    "noun": [
        "fox",
        "dog",
        "cat",
        "river",
        "mountain",
        "engine",
        "model",
        "server",
        "cluster",
        "teacher",
        "garden",
        "window",
        "train",
        "city",
        "forest",
        "cloud",
        "node",
        "pod",
        "token",
        "draft",
        "target",
        "queue",
        "bird",
        "ship",
        "lamp",
        "road",
    ],
    "verb": [
        "sees",
        "likes",
        "follows",
        "builds",
        "answers",
        "carries",
        "watches",
        "finds",
        "serves",
        "checks",
        "moves",
        "paints",
        "opens",
        "closes",
        "reads",
        "writes",
    ],
    "adv": [
        "slowly",
        "quickly",
        "today",
        "again",
        "quietly",
        "at night",
        "in the morning",
        "without a sound",
        "with care",
        "twice",
    ],
}


def _sentences(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    w = _WORDS

    def pick(k: str) -> str:
        return rng.choice(w[k])

    out = []
    for _ in range(count):
        s = (
            f"{pick('det')} {pick('adj')} {pick('noun')} {pick('verb')} "
            f"{pick('det')} {pick('noun')} {pick('adv')}."
        )
        if rng.random() < 0.3:
            s += f" then {pick('det')} {pick('noun')} {pick('verb')} it."
        out.append(s[0].upper() + s[1:])
    return out


def _write_tokenizer(out: Path, seed: int, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_sentences(seed, 4000), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
    )
    # A chat template, so that the chat completions API answers on the tiny models as on a
    # model that ships one (the simulator's contract test sends chat requests to both).
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def _llama_config(vocab_size: int, hidden: int, layers: int, name: str) -> Any:
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        tie_word_embeddings=False,
        # Larger than the usual 0.02 so random logits are peaked: greedy decoding then has no
        # near-ties for rounding to flip between the speculative and the plain path.
        initializer_range=0.1,
    )
    config.architectures = ["LlamaForCausalLM"]
    config._name_or_path = name
    return config


def _patch_config(folder: Path, **fields: Any) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _write_llama(
    out: Path, config: Any, seed: int, tokenizer_dir: Path, damp_after_first: float = 1.0
) -> Any:
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    if damp_after_first != 1.0:
        # Layers after the first write little into the residual stream, so a one-layer draft cut
        # from this model predicts it most of the time, as a real small draft does a real target.
        with torch.no_grad():
            for layer in model.model.layers[1:]:
                layer.self_attn.o_proj.weight.mul_(damp_after_first)
                layer.mlp.down_proj.weight.mul_(damp_after_first)
    _save_llama(model, out, tokenizer_dir)
    return model


def _save_llama(model: Any, out: Path, tokenizer_dir: Path) -> None:
    config = model.config
    model.save_pretrained(out, safe_serialization=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy2(f, out / f.name)
    # transformers does not always keep _name_or_path; the checks read it, so write it.
    _patch_config(out, _name_or_path=config._name_or_path, torch_dtype="float32", dtype="float32")


def _write_first_layer_draft(out: Path, target: Any, tokenizer_dir: Path, name: str) -> None:
    """A one-layer draft LM: the target's embeddings, first layer, final norm and LM head."""
    import copy

    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:1]
    draft.config.num_hidden_layers = 1
    draft.config._name_or_path = name
    _save_llama(draft, out, tokenizer_dir)


def _write_padded_draft(
    out: Path, target: Any, tokenizer_dir: Path, name: str, extra_layers: int
) -> None:
    """The target followed by `extra_layers` layers that add nothing to the residual stream
    (their attention output and MLP down projections are zero): the target's predictions, at
    the cost of every layer."""
    import copy

    import torch

    draft = copy.deepcopy(target)
    layers = list(draft.model.layers)
    for _ in range(extra_layers):
        layer = copy.deepcopy(target.model.layers[-1])
        with torch.no_grad():
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        layer.self_attn.layer_idx = len(layers)
        layers.append(layer)
    draft.model.layers = torch.nn.ModuleList(layers)
    draft.config.num_hidden_layers = len(layers)
    draft.config._name_or_path = name
    _save_llama(draft, out, tokenizer_dir)


def _write_eagle3(out: Path, target: Any, seed: int, verifier: str) -> None:
    import torch
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    layer = _llama_config(VOCAB_SIZE, HIDDEN_SIZE, 1, "specdeploy-tiny/eagle3-layer")
    layer.architectures = None
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer,
        draft_vocab_size=VOCAB_SIZE,
        norm_before_residual=True,
        target_hidden_size=HIDDEN_SIZE,
        eagle_aux_hidden_state_layer_ids=EAGLE3_AUX_LAYERS,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig(name_or_path=verifier, architectures=["LlamaForCausalLM"]),
        ),
    )
    torch.manual_seed(seed)
    head = Eagle3DraftModel(config)
    with torch.no_grad():
        # Unloaded weights start as NaN in speculators: give every parameter a value.
        for p in head.parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn_like(p) * 0.1)
            else:
                p.fill_(1.0)
        head.embed_tokens.weight.copy_(target.model.embed_tokens.weight)
        head.lm_head.weight.copy_(target.lm_head.weight)
    head.to(torch.float32).save_pretrained(out)


def _copy_with_config(src: Path, dst: Path, mutate: Any) -> None:
    shutil.copytree(src, dst)
    path = dst / "config.json"
    data = json.loads(path.read_text())
    mutate(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_tiny_models(out_dir: str | Path) -> dict[str, str]:
    """Write every tiny model under `out_dir` (replacing it) and return {name: absolute path}."""
    import torch

    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    out = Path(out_dir).resolve()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    paths: dict[str, Path] = {}

    def folder(name: str) -> Path:
        paths[name] = out / name
        return paths[name]

    _write_tokenizer(folder("tokenizer"), SEED, VOCAB_SIZE)
    target_config = _llama_config(VOCAB_SIZE, HIDDEN_SIZE, TARGET_LAYERS, TARGET_ID)
    target = _write_llama(
        folder("target"), target_config, SEED, paths["tokenizer"], damp_after_first=0.03
    )

    # The good draft is the target itself under another name.
    shutil.copytree(paths["target"], folder("draft-good"))
    _patch_config(paths["draft-good"], _name_or_path="specdeploy-tiny/draft-good")

    # A cheaper draft that still agrees with the target most of the time.
    _write_first_layer_draft(
        folder("draft-small"), target, paths["tokenizer"], "specdeploy-tiny/draft-small"
    )

    # Accepted but slow: the target and eight layers that change nothing.
    _write_padded_draft(
        folder("draft-slow"), target, paths["tokenizer"], "specdeploy-tiny/draft-slow", 8
    )

    bad_config = _llama_config(VOCAB_SIZE, 128, 2, "specdeploy-tiny/draft-bad")
    _write_llama(folder("draft-bad"), bad_config, SEED + 1, paths["tokenizer"])

    _write_eagle3(folder("eagle3"), target, SEED + 2, TARGET_ID)

    def wrong_hidden(c: dict[str, Any]) -> None:
        c["target_hidden_size"] = 512

    def bad_layers(c: dict[str, Any]) -> None:
        c["eagle_aux_hidden_state_layer_ids"] = [1, 2, 7]

    def other_verifier(c: dict[str, Any]) -> None:
        c["speculators_config"]["verifier"]["name_or_path"] = "specdeploy-tiny/other-target"

    def other_arch(c: dict[str, Any]) -> None:
        c["speculators_config"]["verifier"]["architectures"] = ["Qwen3ForCausalLM"]

    _copy_with_config(paths["eagle3"], folder("eagle3-wrong-hidden"), wrong_hidden)
    _copy_with_config(paths["eagle3"], folder("eagle3-bad-layers"), bad_layers)
    _copy_with_config(paths["eagle3"], folder("eagle3-other-verifier"), other_verifier)
    _copy_with_config(paths["eagle3"], folder("eagle3-other-arch"), other_arch)

    other_tok = out / ".tokenizer-other"
    _write_tokenizer(other_tok, SEED + 100, VOCAB_SIZE - 64)
    other_tok_config = _llama_config(VOCAB_SIZE, 128, 2, "specdeploy-tiny/draft-other-tokenizer")
    _write_llama(folder("draft-other-tokenizer"), other_tok_config, SEED + 3, other_tok)
    shutil.rmtree(other_tok)

    other_vocab_config = _llama_config(640, 128, 2, "specdeploy-tiny/draft-other-vocab")
    _write_llama(folder("draft-other-vocab"), other_vocab_config, SEED + 4, paths["tokenizer"])

    (out / "models.json").write_text(
        json.dumps({k: str(v) for k, v in paths.items()}, indent=2, sort_keys=True) + "\n"
    )
    return {k: str(v) for k, v in paths.items()}
