#!/usr/bin/env bash
# Copies the Prometheus Operator's PodMonitor and ServiceMonitor CRDs, as its release ships them,
# into the cache so the end-to-end tests can install the real CRDs (not stand-ins that keep
# unknown fields).
#
# Source: the github.com/prometheus-operator/prometheus-operator Go module at the version pinned
# below, files example/prometheus-operator-crd/monitoring.coreos.com_{podmonitors,servicemonitors}.yaml (the same
# YAML as the release's bundle), checked against the pinned module hash.
#
# Output: ${SPECDEPLOY_CACHE:-~/.cache/specdeploy}/manifests/prometheus-operator-<version>/
# with the CRD file; `.complete` is written last. A no-op when that folder is complete. Kept apart
# from hack/build-testbed-tools.sh so that pinning another version never rebuilds Kubernetes.
#
#   hack/fetch-prometheus-operator-crd.sh              fetch if needed, print the folder
#   hack/fetch-prometheus-operator-crd.sh --print-dir  print the folder it would use, fetch nothing
set -euo pipefail

MODULE=github.com/prometheus-operator/prometheus-operator
VERSION=v0.85.0
# The module's h1: hash (go.sum form) at VERSION; the checksum database agrees.
MODULE_SUM="h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s="
CRD_DIR=example/prometheus-operator-crd
CRDS=(podmonitors servicemonitors)

CACHE="${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}"
OUT="$CACHE/manifests/prometheus-operator-$VERSION"
if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
if [[ -f "$OUT/.complete" && -f "$OUT/monitoring.coreos.com_servicemonitors.yaml" ]]; then
  echo "$OUT"
  exit 0
fi

fail() { echo "fetch-prometheus-operator-crd: $*" >&2; exit 1; }
command -v go >/dev/null || fail "Go is needed to fetch $MODULE@$VERSION (go not found)"

TMP="$OUT.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
# Outside any module, so that no go.mod around us decides anything.
INFO=$(cd "$TMP" && GOFLAGS= GO111MODULE=on go mod download -json "$MODULE@$VERSION")
DIR=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$INFO")
SUM=$(sed -n 's/^\t"Sum": "\(.*\)",$/\1/p' <<<"$INFO")
[[ "$SUM" == "$MODULE_SUM" ]] || fail "$MODULE@$VERSION has hash '$SUM', expected $MODULE_SUM"
for plural in "${CRDS[@]}"; do
  path="$CRD_DIR/monitoring.coreos.com_$plural.yaml"
  [[ -f "$DIR/$path" ]] || fail "$path is not in $MODULE@$VERSION ($DIR)"
  grep -q "^  name: $plural.monitoring.coreos.com\$" "$DIR/$path" \
    || fail "$DIR/$path is not the $plural CRD"
  cp "$DIR/$path" "$TMP/"
done
chmod u+w "$TMP"/*.yaml
echo "$VERSION" >"$TMP/version"
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
date -u +%Y-%m-%dT%H:%M:%SZ >"$OUT/.complete"
echo "fetch-prometheus-operator-crd: $MODULE@$VERSION PodMonitor and ServiceMonitor CRDs in $OUT" >&2
echo "$OUT"
