#!/usr/bin/env bash
# Installs Debian packages the project needs, when missing: those named as arguments, else the
# test bed's (prometheus; busybox and wget, which stand in for the image of the chart's `helm test`
# pod). A no-op when they are there. hack/build-images.sh asks for podman,
# runc and mmdebstrap.
#
# The test bed runs Prometheus itself, as a plain process with its own configuration on a free
# 127.0.0.1 port (e2e/testbed/cluster.py); the package's service is never used. So that installing
# the package does not start that service (it would listen on every interface), service starts are
# refused through policy-rc.d for the duration of the install. A service that runs anyway (say, one
# installed earlier) is left alone: nothing here depends on it.
set -euo pipefail

PACKAGES=("$@")
if [[ ${#PACKAGES[@]} -eq 0 ]]; then
  PACKAGES=(prometheus busybox wget)
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "install-system-deps: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  SUDO=(sudo)
fi

echo "install-system-deps: installing ${missing[*]}" >&2
POLICY=/usr/sbin/policy-rc.d
placed_policy=0
if [[ ! -e "$POLICY" ]]; then
  printf '#!/bin/sh\n# placed by specdeploy hack/install-system-deps.sh during an install\nexit 101\n' \
    | "${SUDO[@]}" tee "$POLICY" >/dev/null
  "${SUDO[@]}" chmod 755 "$POLICY"
  placed_policy=1
fi
cleanup() { if [[ $placed_policy -eq 1 ]]; then "${SUDO[@]}" rm -f "$POLICY"; fi; }
trap cleanup EXIT

"${SUDO[@]}" apt-get update -qq -o DPkg::Lock::Timeout=600
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}"

# Keep the package's service from starting at boot where systemd manages services.
if [[ " ${missing[*]} " == *" prometheus "* ]]; then
  if command -v systemctl >/dev/null && [[ -d /run/systemd/system ]]; then
    "${SUDO[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
  fi
  prometheus --version 2>&1 | head -n1 >&2
fi
