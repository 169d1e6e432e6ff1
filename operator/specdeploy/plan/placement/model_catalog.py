"""Architecture shapes of well-known models and their EAGLE-3 heads, and config.json parsing.

Sizing needs a model's parameter count and attention geometry. They come from the spec, else
from this catalog (keyed by hub id), else from the model's `config.json` read by
`specdeploy.adapters.model_config` and parsed here by `shape_from_config`.

Parameter counts are the published ones; EAGLE-3 heads are counted without the embedding table,
which vLLM shares with the target.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from specdeploy.api.models import Dtype, ModelShape

# Bytes each parameter takes in device memory, by dtype and by quantization method.
BYTES_PER_PARAMETER: Mapping[str, float] = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
QUANTIZATION_BYTES_PER_PARAMETER: Mapping[str, float] = {
    "fp8": 1.0,
    "fbgemm_fp8": 1.0,
    "compressed-tensors": 1.0,
    "int8": 1.0,
    "bitsandbytes": 1.0,
    "awq": 0.5,
    "gptq": 0.5,
    "awq_marlin": 0.5,
    "gptq_marlin": 0.5,
    "int4": 0.5,
}


def _shape(  # noqa: PLR0917 - one row of the catalog table
    parameters_billion: float,
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    head_dim: int | None = None,
    dtype: Dtype = "bfloat16",
) -> ModelShape:
    return ModelShape(
        parameters_billion=parameters_billion,
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        dtype=dtype,
    )


LLAMA_3_8B = _shape(8.03, 32, 4096, 32, 8, 128256)
LLAMA_3_70B = _shape(70.55, 80, 8192, 64, 8, 128256)
LLAMA_3_405B = _shape(405.85, 126, 16384, 128, 8, 128256)
LLAMA_3_2_1B = _shape(1.24, 16, 2048, 32, 8, 128256, head_dim=64)
LLAMA_3_2_3B = _shape(3.21, 28, 3072, 24, 8, 128256, head_dim=128)
QWEN2_5_7B = _shape(7.62, 28, 3584, 28, 4, 152064)
QWEN2_5_32B = _shape(32.76, 64, 5120, 40, 8, 152064)
QWEN2_5_72B = _shape(72.71, 80, 8192, 64, 8, 152064)
QWEN3_8B = _shape(8.19, 36, 4096, 32, 8, 151936, head_dim=128)
QWEN3_14B = _shape(14.77, 40, 5120, 40, 8, 151936, head_dim=128)
QWEN3_32B = _shape(32.76, 64, 5120, 64, 8, 151936, head_dim=128)
MISTRAL_7B = _shape(7.25, 32, 4096, 32, 8, 32768)
MIXTRAL_8X7B = _shape(46.7, 32, 4096, 32, 8, 32000)

# EAGLE-3 heads: one decoder layer whose attention reads [embedding; hidden] (2 x hidden), a
# 3 x hidden -> hidden fusion layer and a reduced-vocabulary LM head (32k tokens).
EAGLE3_LLAMA_3_8B = _shape(0.42, 1, 4096, 32, 8, 128256)
EAGLE3_LLAMA_3_70B = _shape(1.40, 1, 8192, 64, 8, 128256)
EAGLE3_QWEN3_8B = _shape(0.40, 1, 4096, 32, 8, 151936, head_dim=128)
EAGLE3_QWEN3_32B = _shape(0.79, 1, 5120, 64, 8, 151936, head_dim=128)

# Hub ids are compared case-insensitively; several ids name the same weights.
MODEL_SHAPES: Mapping[str, ModelShape] = {
    key.lower(): shape
    for key, shape in {
        "meta-llama/Llama-3.1-8B": LLAMA_3_8B,
        "meta-llama/Llama-3.1-8B-Instruct": LLAMA_3_8B,
        "meta-llama/Meta-Llama-3.1-8B-Instruct": LLAMA_3_8B,
        "meta-llama/Meta-Llama-3-8B-Instruct": LLAMA_3_8B,
        "meta-llama/Llama-3.1-70B": LLAMA_3_70B,
        "meta-llama/Llama-3.1-70B-Instruct": LLAMA_3_70B,
        "meta-llama/Meta-Llama-3.1-70B-Instruct": LLAMA_3_70B,
        "meta-llama/Llama-3.3-70B-Instruct": LLAMA_3_70B,
        "meta-llama/Meta-Llama-3-70B-Instruct": LLAMA_3_70B,
        "meta-llama/Llama-3.1-405B": LLAMA_3_405B,
        "meta-llama/Llama-3.1-405B-Instruct": LLAMA_3_405B,
        "meta-llama/Meta-Llama-3.1-405B-Instruct": LLAMA_3_405B,
        "meta-llama/Llama-3.2-1B-Instruct": LLAMA_3_2_1B,
        "meta-llama/Llama-3.2-3B-Instruct": LLAMA_3_2_3B,
        "Qwen/Qwen2.5-7B-Instruct": QWEN2_5_7B,
        "Qwen/Qwen2.5-32B-Instruct": QWEN2_5_32B,
        "Qwen/Qwen2.5-72B-Instruct": QWEN2_5_72B,
        "Qwen/Qwen3-8B": QWEN3_8B,
        "Qwen/Qwen3-14B": QWEN3_14B,
        "Qwen/Qwen3-32B": QWEN3_32B,
        "mistralai/Mistral-7B-Instruct-v0.3": MISTRAL_7B,
        "mistralai/Mixtral-8x7B-Instruct-v0.1": MIXTRAL_8X7B,
        # EAGLE-3 heads, each trained for exactly one of the targets above.
        "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B": EAGLE3_LLAMA_3_8B,
        "RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3": EAGLE3_LLAMA_3_8B,
        "yuhuili/EAGLE3-LLaMA3.3-Instruct-70B": EAGLE3_LLAMA_3_70B,
        "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3": EAGLE3_LLAMA_3_70B,
        "Tengyunw/qwen3_8b_eagle3": EAGLE3_QWEN3_8B,
        "RedHatAI/Qwen3-8B-speculator.eagle3": EAGLE3_QWEN3_8B,
        "RedHatAI/Qwen3-32B-speculator.eagle3": EAGLE3_QWEN3_32B,
    }.items()
}


def catalog_shape(model: str) -> ModelShape | None:
    """The shipped shape of a model named by hub id (any case), or by a path ending in its name.

    A path such as `/models/Llama-3.1-8B-Instruct` matches the hub id whose name part is the
    path's last component, when exactly one catalog id has that name.
    """
    key = model.strip().rstrip("/").lower()
    if key in MODEL_SHAPES:
        return MODEL_SHAPES[key]
    name = key.rsplit("/", 1)[-1]
    matches = {id_: s for id_, s in MODEL_SHAPES.items() if id_.rsplit("/", 1)[-1] == name}
    if len(matches) == 1:
        return next(iter(matches.values()))
    shapes = {s for s in matches.values()}
    return shapes.pop() if len(shapes) == 1 else None


def head_dim(shape: ModelShape) -> int:
    """The attention head dimension: explicit, else hiddenSize / attentionHeads."""
    return shape.head_dim or shape.hidden_size // shape.attention_heads


def bytes_per_parameter(shape: ModelShape) -> float:
    """Bytes one weight takes on the device: the quantization's width, else the dtype's."""
    if shape.quantization:
        width = QUANTIZATION_BYTES_PER_PARAMETER.get(shape.quantization.lower())
        if width is not None:
            return width
    return BYTES_PER_PARAMETER[shape.dtype]


def kv_bytes_per_element(shape: ModelShape) -> float:
    """Bytes of one cached key or value element: the activation dtype (quantized weights keep a
    16-bit cache unless the engine is told otherwise)."""
    return 4.0 if shape.dtype == "float32" else 2.0


def eagle3_head_shape_for(target: ModelShape, draft_vocab_size: int = 32000) -> ModelShape:
    """An estimated EAGLE-3 head for a target the catalog has no head for.

    Same geometry as one target layer; parameters: attention over 2 x hidden inputs, a gated
    MLP of 3.5 x hidden, the 3 x hidden fusion layer and a reduced-vocabulary LM head.
    """
    hidden = target.hidden_size
    hd = head_dim(target)
    attention = 2 * hidden * (target.attention_heads + 2 * target.kv_heads) * hd
    attention += target.attention_heads * hd * hidden
    mlp = 3 * hidden * int(3.5 * hidden)
    fusion = 3 * hidden * hidden
    lm_head = hidden * draft_vocab_size
    parameters = attention + mlp + fusion + lm_head
    return ModelShape(
        parameters_billion=round(parameters / 1e9, 3),
        layers=1,
        hidden_size=hidden,
        attention_heads=target.attention_heads,
        kv_heads=target.kv_heads,
        head_dim=target.head_dim,
        vocab_size=target.vocab_size,
        dtype=target.dtype if target.dtype in ("bfloat16", "float16", "float32") else "bfloat16",
    )


_DTYPES: Mapping[str, Dtype] = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "fp16": "float16",
    "half": "float16",
    "float32": "float32",
    "fp32": "float32",
    "float": "float32",
}


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def shape_from_config(config: Mapping[str, Any]) -> ModelShape:
    """Parses a Hugging Face style `config.json` (or a speculators draft config) into a shape.

    The parameter count is estimated from the architecture: embeddings, attention, a gated MLP
    (or its experts), norms and the LM head. EAGLE-3 heads count their fusion layer and reduced
    LM head and not the shared embedding. Raises ValueError when a needed key is missing.
    """
    # Speculators drafts nest their decoder layer; multimodal models nest their text model.
    layer_config: Mapping[str, Any] = (
        config.get("transformer_layer_config") or config.get("text_config") or config
    )
    architectures = [str(a) for a in config.get("architectures") or []]
    is_eagle3 = (
        "speculators_config" in config
        or "draft_vocab_size" in config
        or any("eagle3" in a.lower() for a in architectures)
    )

    hidden = _int(layer_config, "hidden_size", "d_model", "n_embd")
    heads = _int(layer_config, "num_attention_heads", "n_head")
    layers = _int(layer_config, "num_hidden_layers", "n_layer")
    vocab = _int(layer_config, "vocab_size") or _int(config, "vocab_size")
    if hidden is None or heads is None or layers is None or vocab is None:
        raise ValueError(
            "config.json lacks one of hidden_size, num_attention_heads, num_hidden_layers, "
            "vocab_size"
        )
    kv_heads = _int(layer_config, "num_key_value_heads", "num_kv_heads") or heads
    explicit_head_dim = _int(layer_config, "head_dim")
    hd = explicit_head_dim or hidden // heads
    intermediate = _int(layer_config, "intermediate_size", "ffn_dim") or 4 * hidden
    experts = _int(layer_config, "num_local_experts", "num_experts", "n_routed_experts")
    moe_intermediate = _int(layer_config, "moe_intermediate_size") or intermediate

    if is_eagle3:
        layers = _int(config, "num_hidden_layers") or (1 if layer_config is not config else layers)
        attention = 2 * hidden * (heads + 2 * kv_heads) * hd + heads * hd * hidden
        draft_vocab = _int(config, "draft_vocab_size") or vocab
        per_layer = attention + 3 * hidden * intermediate + 2 * hidden
        parameters = layers * per_layer + 3 * hidden * hidden + hidden * draft_vocab
    else:
        attention = hidden * (heads + 2 * kv_heads) * hd + heads * hd * hidden
        if experts:
            mlp = experts * 3 * hidden * moe_intermediate + hidden * experts
        else:
            mlp = 3 * hidden * intermediate
        per_layer = attention + mlp + 2 * hidden
        tied = bool(config.get("tie_word_embeddings", layer_config.get("tie_word_embeddings")))
        embeddings = vocab * hidden * (1 if tied else 2)
        parameters = layers * per_layer + embeddings + hidden

    raw_dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").lower()
    dtype = _DTYPES.get(raw_dtype.removeprefix("torch."), "bfloat16")
    quantization_config = config.get("quantization_config") or {}
    quantization = str(quantization_config.get("quant_method")) if quantization_config else None
    return ModelShape(
        parameters_billion=round(parameters / 1e9, 3),
        layers=layers,
        hidden_size=hidden,
        attention_heads=heads,
        kv_heads=kv_heads,
        head_dim=explicit_head_dim,
        vocab_size=vocab,
        dtype=dtype,
        quantization=quantization,
    )
