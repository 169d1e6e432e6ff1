#!/usr/bin/env bash
# Builds helm v3 (the Helm major most users still run) from its pinned Go module into the cache,
# for the chart's e2e test under both majors (e2e/test_chart_pods.py); prints the binary's path.
# Kept apart from hack/build-testbed-tools.sh, as the Prometheus Operator's CRDs are, so that this
# pin never changes the tools' cache key.
#
# helm v3 compiles in the Kubernetes version it assumes for `.Capabilities.KubeVersion` (and in
# `helm lint`): without ldflags it says v1.20, and the chart's `kubeVersion: >=1.30.0-0` refuses
# it. The ldflags give it the test bed's Kubernetes minor (e2e/tools/kubernetes/go.mod).
#
#   hack/build-helm3.sh               build if needed, print the binary
#   hack/build-helm3.sh --print-path  print where the binary is (or would be), build nothing
set -euo pipefail
cd "$(dirname "$0")/.."

HELM3_VERSION=v3.21.4
CACHE=${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}
k8s=$(sed -n 's/^\tk8s.io\/kubernetes v\([0-9]*\)\.\([0-9]*\)\..*/\1 \2/p' e2e/tools/kubernetes/go.mod | head -n1)
read -r k8s_major k8s_minor <<<"$k8s"
[[ -n $k8s_major && -n $k8s_minor ]] || { echo "build-helm3: no k8s.io/kubernetes pin found" >&2; exit 1; }
OUT="$CACHE/tools/helm-$HELM3_VERSION-k8s$k8s_major.$k8s_minor"
if [[ ${1:-} == --print-path ]]; then
  echo "$OUT/helm"
  exit 0
fi
if [[ -f "$OUT/.complete" ]]; then
  echo "$OUT/helm"
  exit 0
fi
command -v go >/dev/null || { echo "build-helm3: Go is needed to build helm $HELM3_VERSION" >&2; exit 1; }
mkdir -p "$(dirname "$OUT")"
exec 9>"$OUT.lock"
if ! flock -n 9; then
  echo "build-helm3: another build of helm $HELM3_VERSION is running; waiting for it" >&2
  flock 9
fi
if [[ -f "$OUT/.complete" ]]; then
  echo "$OUT/helm"
  exit 0
fi
began=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT"
flags="-s -w"
for package in pkg/chartutil pkg/lint/rules; do
  flags+=" -X helm.sh/helm/v3/$package.k8sVersionMajor=$k8s_major"
  flags+=" -X helm.sh/helm/v3/$package.k8sVersionMinor=$k8s_minor"
done
flags+=" -X helm.sh/helm/v3/internal/version.version=$HELM3_VERSION"
flags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
# Outside any module, so that no go.mod around us decides anything; the module proxy's checksum
# database verifies the module.
(cd "$OUT" && GOFLAGS= GO111MODULE=on GOBIN="$OUT" CGO_ENABLED=0 \
  go install -trimpath -ldflags "$flags" "helm.sh/helm/v3/cmd/helm@$HELM3_VERSION")
"$OUT/helm" version --short >&2
date -u +%Y-%m-%dT%H:%M:%SZ >"$OUT/.complete"
echo "build-helm3: helm $HELM3_VERSION in $OUT ($(($(date +%s) - began)) s)" >&2
echo "$OUT/helm"
