"""Shapes from config.json: parsing, and reading it from a local HTTP server."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from specdeploy.adapters.model_config import ModelConfigUnavailableError, fetch_model_shape
from specdeploy.plan.placement.model_catalog import catalog_shape, shape_from_config

LLAMA_8B_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
EAGLE3_HEAD_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 1,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "torch_dtype": "float16",
}
SPECULATORS_CONFIG: dict[str, Any] = {
    "speculators_model_type": "eagle3",
    "draft_vocab_size": 32000,
    "speculators_config": {"verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"}},
    "transformer_layer_config": {
        k: v for k, v in EAGLE3_HEAD_CONFIG.items() if k != "architectures"
    },
}


def test_llama_8b_config_gives_the_catalog_numbers() -> None:
    shape = shape_from_config(LLAMA_8B_CONFIG)
    catalog = catalog_shape("meta-llama/Llama-3.1-8B-Instruct")
    assert catalog is not None
    assert shape.parameters_billion == pytest.approx(catalog.parameters_billion, rel=0.01)
    assert (shape.layers, shape.kv_heads, shape.dtype) == (32, 8, "bfloat16")


@pytest.mark.parametrize("config", [EAGLE3_HEAD_CONFIG, SPECULATORS_CONFIG])
def test_eagle3_head_configs_count_one_layer_and_the_reduced_head(config: dict[str, Any]) -> None:
    shape = shape_from_config(config)
    assert shape.layers == 1
    assert shape.parameters_billion == pytest.approx(0.42, abs=0.01)


def test_moe_and_quantized_configs() -> None:
    mixtral = {
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_hidden_layers": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "fp8"},
    }
    shape = shape_from_config(mixtral)
    assert shape.parameters_billion == pytest.approx(46.7, rel=0.01)
    assert shape.quantization == "fp8"


def test_a_config_without_the_numbers_is_refused() -> None:
    with pytest.raises(ValueError, match="hidden_size"):
        shape_from_config({"architectures": ["X"]})


class ConfigServer(BaseHTTPRequestHandler):
    files: dict[str, bytes] = {  # noqa: RUF012 - a fixed table the handler only reads
        "/acme/llama-clone/resolve/v1/config.json": json.dumps(LLAMA_8B_CONFIG).encode(),
        "/acme/broken/resolve/main/config.json": b"not json",
        "/acme/gated/resolve/main/config.json": json.dumps(EAGLE3_HEAD_CONFIG).encode(),
    }

    def do_GET(self) -> None:
        if (
            self.path.startswith("/acme/gated/")
            and self.headers.get("Authorization") != "Bearer s3"
        ):
            self.send_response(401)
            self.end_headers()
            return
        body = self.files.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        if body is not None:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Keep test output quiet."""


@pytest.fixture
def url_template() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), ConfigServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/{{model}}/resolve/{{revision}}/config.json"
    finally:
        server.shutdown()
        server.server_close()


def test_fetches_and_parses_config_json(url_template: str) -> None:
    shape = fetch_model_shape(url_template, "acme/llama-clone", "v1")
    assert shape.parameters_billion == pytest.approx(8.03, rel=0.01)


def test_sends_the_token(url_template: str) -> None:
    with pytest.raises(ModelConfigUnavailableError, match="401"):
        fetch_model_shape(url_template, "acme/gated")
    assert fetch_model_shape(url_template, "acme/gated", token="s3").layers == 1


def test_missing_and_broken_configs_are_reported(url_template: str) -> None:
    with pytest.raises(ModelConfigUnavailableError, match="404"):
        fetch_model_shape(url_template, "acme/missing")
    with pytest.raises(ModelConfigUnavailableError, match="not JSON"):
        fetch_model_shape(url_template, "acme/broken")
