#!/usr/bin/env bash
# Builds the LeaderWorkerSet (LWS) controller from the Go module pinned in e2e/tools/lws/ and
# copies the upstream YAML the test bed needs at run time (its CRD and webhook configurations)
# next to it, so running the cluster needs no Go.
#
# Output: ${SPECDEPLOY_CACHE:-~/.cache/specdeploy}/lws/<version>-<key>/ where <key> hashes
# e2e/tools/lws/go.mod, go.sum and RECIPE below. A no-op when that folder is complete (marker
# written last). Kept apart from hack/build-testbed-tools.sh (whose key leaves e2e/tools/lws/
# out) so that pinning another LWS never rebuilds Kubernetes, KWOK, Kueue and helm.
#
#   hack/build-lws.sh              build if needed, print the folder
#   hack/build-lws.sh --print-dir  print the folder it would use, build nothing
set -euo pipefail

RECIPE=2
MODULE=sigs.k8s.io/lws

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOL="$ROOT/e2e/tools/lws"
CACHE="${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}"

VERSION=$(awk -v m="$MODULE" '$1 == m && $2 ~ /^v/ { print $2 }' "$TOOL/go.mod" | head -n1)
[[ -n "$VERSION" ]] || { echo "build-lws: $MODULE is not required in $TOOL/go.mod" >&2; exit 1; }
KEY=$( (echo "recipe=$RECIPE"; cat "$TOOL/go.mod" "$TOOL/go.sum") | sha256sum | cut -c1-12)
OUT="$CACHE/lws/$VERSION-$KEY"
if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
if [[ -f "$OUT/.complete" ]]; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-lws: Go 1.26+ is needed (go not found)" >&2; exit 1; }
log() { echo "build-lws: $*" >&2; }

export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
TMP="$OUT.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP/manifests"
trap 'rm -rf "$TMP"' EXIT
START=$(date +%s)

INFO=$(cd "$TOOL" && go mod download -json "$MODULE")
DIR=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' <<<"$INFO")
COMMIT=$(awk -F'"' '$2 == "Hash" && !n { print $4; n = 1 }' <<<"$INFO")
log "building LeaderWorkerSet $VERSION"
(
  cd "$TOOL"
  go build -trimpath -ldflags "-s -w -X $MODULE/pkg/version.GitVersion=$VERSION -X $MODULE/pkg/version.GitCommit=${COMMIT:-unknown}" \
    -o "$TMP/lws" "$MODULE/cmd"
)
mkdir -p "$TMP/manifests/crd"
cp "$DIR"/config/crd/bases/*.yaml "$TMP/manifests/crd/"
cp "$DIR/config/webhook/manifests.yaml" "$TMP/manifests/webhook.yaml"
chmod -R u+w "$TMP"
echo "$VERSION" >"$TMP/version"
"$TMP/lws" --version >&2
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
date -u +%Y-%m-%dT%H:%M:%SZ >"$OUT/.complete"
log "done in $(($(date +%s) - START))s"
echo "$OUT"
