#!/usr/bin/env bash
# Installs checkov (a maintained Kubernetes manifest scanner, from PyPI) into its own virtualenv,
# cached by version, and prints the path of its `checkov` command. Its dependency tree is large
# and pins versions the project's own virtualenv must not be bound by, hence a separate venv.
set -euo pipefail

CHECKOV_VERSION=${CHECKOV_VERSION:-3.3.30}
PYTHON=${PYTHON:-python3}
CACHE=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
key="checkov-${CHECKOV_VERSION}-py$($PYTHON -c 'import sys;print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
venv="$CACHE/tools/$key"

if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/checkov"
  exit 0
fi
log() { echo "install-checkov: $*" >&2; }
mkdir -p "$(dirname "$venv")"
# One install at a time per cache (another checkout's make waits, then finds it complete).
exec 9>"$venv.lock"
if ! flock -n 9; then
  log "another install of $key is running; waiting for it"
  flock 9
fi
if [ -f "$venv/.complete" ]; then
  echo "$venv/bin/checkov"
  exit 0
fi
rm -rf "$venv"
log "creating $venv"
"$PYTHON" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade pip >&2
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "checkov==$CHECKOV_VERSION" >&2
"$venv/bin/checkov" --version >&2
touch "$venv/.complete"
echo "$venv/bin/checkov"
