"""The container images as built by `make images` (hack/build-images.sh), run with podman.

The operator image runs its command as a non-root user; the CPU engine image checks the tiny
pair and serves a completion from inside its container (host network, the models mounted
read-only, its own non-root user); neither image holds this machine's package-index settings
or the pip cache its build used. Tests of the CPU engine image are marked `engine_image`:
`make images` runs them, `make e2e` (which builds only the operator image) leaves them out.
"""

from __future__ import annotations

import configparser
import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine_harness import build_tiny_models, engine_python_path
from testbed.ports import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent
BUILD_SCRIPT = REPO / "hack" / "build-images.sh"
CACHE = Path(os.environ.get("SPECDEPLOY_CACHE", Path.home() / ".cache" / "specdeploy"))
MODELS_IN_CONTAINER = "/models"


def podman(
    *args: str, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """podman with the configuration hack/build-images.sh writes (runtime runc, no ulimits)."""
    env = {**os.environ, "CONTAINERS_CONF": str(CACHE / "images" / "containers.conf")}
    done = subprocess.run(
        ["podman", *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )
    if check and done.returncode != 0:
        raise AssertionError(f"podman {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
    return done


def built_image(which: int) -> str:
    names = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-names"], capture_output=True, text=True, check=True
    ).stdout.split()
    image = names[which]
    if podman("image", "exists", image, check=False).returncode != 0:
        raise RuntimeError(f"{image} is not built: run `make images`")
    return image


@pytest.fixture(scope="module")
def operator_image() -> str:
    return built_image(0)


@pytest.fixture(scope="module")
def engine_cpu_image() -> str:
    return built_image(1)


@contextlib.contextmanager
def image_files(image: str) -> Iterator[Path]:
    """The image's file system, mounted read-only for a look."""
    root = Path(podman("image", "mount", image).stdout.strip())
    try:
        yield root
    finally:
        podman("image", "unmount", image, check=False)


def test_operator_image_runs_the_operator_as_a_non_root_user(operator_image: str) -> None:
    done = podman("run", "--rm", "--network", "host", operator_image, "operator", "run", "--help")
    assert "--config" in done.stdout, done.stdout
    user = podman("run", "--rm", "--entrypoint", "id", operator_image, "-u").stdout.strip()
    assert user == "65532"


@pytest.mark.parametrize(
    "which",
    [
        pytest.param(0, id="operator"),
        pytest.param(1, id="engine-cpu", marks=pytest.mark.engine_image),
    ],
)
def test_images_hold_no_package_index_settings_nor_the_pip_cache(which: int) -> None:
    image = built_image(which)
    settings = configparser.ConfigParser()
    settings.read("/etc/pip.conf")
    cert = settings.get("global", "cert", fallback="")
    with image_files(image) as root:
        # A bind mount of the build leaves its mount point behind, empty.
        pip_conf = root / "etc" / "pip.conf"
        assert not pip_conf.exists() or not pip_conf.read_bytes(), "/etc/pip.conf is in the image"
        for host_file in (Path("/etc/pip.conf"), Path(cert), Path("/etc/hosts")):
            if not host_file.is_file() or not host_file.read_bytes():
                continue
            inside = root / str(host_file).lstrip("/")
            if inside.is_file():
                assert inside.read_bytes() != host_file.read_bytes(), f"{host_file} was copied"
        cached = [p for p in (root / "root" / ".cache" / "pip").rglob("*") if p.is_file()]
        assert not cached, f"pip's cache is in the image: {cached[:3]}"


def _health(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return int(answer.status) == 200
    except OSError:
        return False


@pytest.mark.engine
@pytest.mark.engine_image
def test_engine_cpu_image_checks_the_pair_and_serves_a_completion(
    engine_cpu_image: str, tmp_path: Path
) -> None:
    models = build_tiny_models(engine_python_path())
    # The image's user (1001) reads the models, as from a volume provisioned for it: the tiny
    # models' weights are written owner-only (0600), so a readable copy is mounted.
    folder = tmp_path / "models"
    for name in ("target", "draft-small"):
        shutil.copytree(models[name], folder / Path(models[name]).name)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    inside = {name: f"{MODELS_IN_CONTAINER}/{Path(path).name}" for name, path in models.items()}
    speculative = json.dumps(
        {"method": "draft_model", "model": inside["draft-small"], "num_speculative_tokens": 3}
    )
    vllm_args = [
        inside["target"],
        "--speculative-config",
        speculative,
        "--enforce-eager",
        "--dtype",
        "float32",
        "--max-model-len",
        "512",
    ]
    # vLLM's engine core talks to its front end through shared memory: the runtime's default
    # 64 MB /dev/shm is too small for it.
    run = ["run", "--network", "host", "--shm-size", "1g"]
    run += ["-v", f"{folder}:{MODELS_IN_CONTAINER}:ro"]
    run += ["-e", "VLLM_CPU_KVCACHE_SPACE=1", "-e", "HF_HUB_OFFLINE=1"]
    # As the test bed runs its engines on these 2-core machines (engine_cluster.ENGINE_ENV).
    run += ["-e", "VLLM_CPU_OMP_THREADS_BIND=nobind"]
    checked = podman(*run, "--rm", engine_cpu_image, "check", "--", *vllm_args, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    results = json.loads(checked.stdout)
    assert results, checked.stdout

    port = free_port()
    name = f"specdeploy-engine-smoke-{port}"
    served = [*vllm_args, "--host", "127.0.0.1", "--port", str(port)]
    podman(*run, "-d", "--name", name, engine_cpu_image, "serve", "--", *served)
    try:
        deadline = time.monotonic() + 420
        while not _health(port):
            state = podman("inspect", "--format", "{{.State.Status}}", name, check=False)
            if state.stdout.strip() != "running":
                logs = podman("logs", name, check=False)
                errors = [
                    line
                    for line in (logs.stdout + logs.stderr).splitlines()
                    if "Error" in line or "error" in line
                ]
                raise AssertionError(
                    f"the engine container {state.stdout.strip()}; its error lines:\n"
                    + "\n".join(errors[:40])
                )
            assert time.monotonic() < deadline, "no /health after 420 s"
            time.sleep(2)
        user = podman("exec", name, "id", "-u").stdout.strip()
        assert user == "1001"
        body = {"model": inside["target"], "prompt": "The cat sat on the", "max_tokens": 16}
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as answer:
            completion = json.loads(answer.read())
        assert completion["usage"]["completion_tokens"] == 16, completion
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert b"vllm:spec_decode_num_draft_tokens_total" in answer.read()
    finally:
        podman("rm", "-f", "-t", "10", name, check=False, timeout=60)
