#!/usr/bin/env bash
# Builds the pinned test-bed tools (Kubernetes control plane, etcd, KWOK, Kueue, helm) from the Go
# modules under e2e/tools/ and copies the upstream YAML the test bed needs at run time (Kueue CRDs
# and webhooks, KWOK stages, Argo CD CRDs) next to them, so running the cluster needs no Go.
#
# Output: ${SPECDEPLOY_CACHE:-~/.cache/specdeploy}/bin/<key>/ where <key> hashes every go.mod and
# go.sum under e2e/tools/ (but e2e/tools/lws/, which hack/build-lws.sh builds) plus RECIPE below. A no-op when that folder is complete (marker written
# last). Needs only Go (1.26+) and the Go module proxy.
#
#   hack/build-testbed-tools.sh              build if needed, print the folder
#   hack/build-testbed-tools.sh --print-dir  print the folder it would use, build nothing
set -euo pipefail

# Bump when the build recipe (flags, file layout) changes, so old caches are not reused.
RECIPE=4

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/e2e/tools"
CACHE="${SPECDEPLOY_CACHE:-$HOME/.cache/specdeploy}"

key() {
  (
    cd "$TOOLS"
    echo "recipe=$RECIPE"
    # e2e/tools/lws/ is built by hack/build-lws.sh into a cache folder of its own: a new LWS
    # pin never rebuilds the tools here.
    for f in $(find . -path ./lws -prune -o \( -name go.mod -o -name go.sum \) -print | LC_ALL=C sort); do
      echo "== $f"
      cat "$f"
    done
  ) | sha256sum | cut -c1-16
}

OUT="$CACHE/bin/$(key)"
if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$OUT"
  exit 0
fi
MARKER="$OUT/.complete"
if [[ -f "$MARKER" ]]; then
  echo "$OUT"
  exit 0
fi

command -v go >/dev/null || { echo "build-testbed-tools: Go 1.26+ is needed (go not found)" >&2; exit 1; }

# The version a module is pinned at in one of our go.mod files.
pinned() { # <tools subdir> <module path>
  awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && $2 ~ /^v/ { print $2 }' \
    "$TOOLS/$1/go.mod" | head -n1
}
moddir() { # <tools subdir> <module path>: the module's extracted folder, downloaded if needed
  (cd "$TOOLS/$1" && go mod download -json "$2" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
}
log() { echo "build-testbed-tools: $*" >&2; }

export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"
TMP="$OUT.tmp.$$"
rm -rf "$TMP"
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT
START=$(date +%s)

# --- Kubernetes control plane and etcd ---------------------------------------------------------
K8S=$(pinned kubernetes k8s.io/kubernetes)            # v1.36.3
K8S_MAJOR=$(echo "${K8S#v}" | cut -d. -f1)
K8S_MINOR=$(echo "${K8S#v}" | cut -d. -f2)
# The upstream commit of a module version (from the proxy's origin record), for version output.
origin_commit() { # <tools subdir> <module path>
  (cd "$TOOLS/$1" && go mod download -json "$2") | awk -F'"' '$2 == "Hash" && !n { print $4; n = 1 }'
}
K8S_COMMIT=$(origin_commit kubernetes k8s.io/kubernetes)
vflags() { # ldflags like hack/lib/version.sh sets them
  local pkg
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s ' \
      "$pkg" "$K8S" "$pkg" "$K8S_MAJOR" "$pkg" "$K8S_MINOR"
    printf -- '-X %s.gitTreeState=clean -X %s.gitCommit=%s ' "$pkg" "$pkg" "${K8S_COMMIT:-}"
  done
}
log "building Kubernetes $K8S (kube-apiserver, kube-controller-manager, kube-scheduler, kubectl) and etcd"
(
  cd "$TOOLS/kubernetes"
  go build -trimpath -tags selinux,notest -ldflags "-s -w $(vflags)" -o "$TMP/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
)
ETCD=$(pinned kubernetes go.etcd.io/etcd/server/v3)
[[ -n "$ETCD" ]] || ETCD=$(cd "$TOOLS/kubernetes" && go list -m -f '{{.Version}}' go.etcd.io/etcd/server/v3)
ETCD_COMMIT=$(origin_commit kubernetes go.etcd.io/etcd/server/v3 | cut -c1-12)
(
  cd "$TOOLS/kubernetes"
  go build -trimpath -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_COMMIT:-unknown}" \
    -o "$TMP/etcd" go.etcd.io/etcd/server/v3
)

# --- KWOK ----------------------------------------------------------------------------------------
KWOK=$(pinned kwok sigs.k8s.io/kwok)
log "building KWOK $KWOK"
(
  cd "$TOOLS/kwok"
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=$K8S" \
    -o "$TMP/kwok" sigs.k8s.io/kwok/cmd/kwok
)
KWOK_DIR=$(moddir kwok sigs.k8s.io/kwok)
mkdir -p "$TMP/manifests/kwok"
cp -r "$KWOK_DIR/kustomize/stage" "$TMP/manifests/kwok/stage"

# --- Kueue ---------------------------------------------------------------------------------------
KUEUE=$(pinned kueue sigs.k8s.io/kueue)
log "building Kueue $KUEUE"
(
  cd "$TOOLS/kueue"
  go build -trimpath -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE" \
    -o "$TMP/kueue" sigs.k8s.io/kueue/cmd/kueue
)
KUEUE_DIR=$(moddir kueue sigs.k8s.io/kueue)
mkdir -p "$TMP/manifests/kueue"
# bases/ plus the kustomization and patches that say which CRDs get a conversion webhook.
cp -r "$KUEUE_DIR/config/components/crd" "$TMP/manifests/kueue/crd"
cp "$KUEUE_DIR/config/components/webhook/manifests.yaml" "$TMP/manifests/kueue/webhook.yaml"
if [[ -f "$KUEUE_DIR/config/components/rbac/role.yaml" ]]; then
  cp "$KUEUE_DIR/config/components/rbac/role.yaml" "$TMP/manifests/kueue/role.yaml"
fi

# --- helm ----------------------------------------------------------------------------------------
HELM=$(pinned helm helm.sh/helm/v4)
log "building helm $HELM"
(
  cd "$TOOLS/helm"
  go build -trimpath -ldflags "-s -w -X helm.sh/helm/v4/internal/version.version=$HELM -X helm.sh/helm/v4/internal/version.gitTreeState=clean" \
    -o "$TMP/helm" helm.sh/helm/v4/cmd/helm
)

# --- Argo CD CRDs (YAML only) -------------------------------------------------------------------
ARGOCD=$(pinned manifests github.com/argoproj/argo-cd/v3)
log "fetching Argo CD $ARGOCD CRDs"
ARGOCD_DIR=$(cd "$TMP" && GOFLAGS= go mod download -json "github.com/argoproj/argo-cd/v3@$ARGOCD" \
  | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
mkdir -p "$TMP/manifests/argocd"
cp "$ARGOCD_DIR"/manifests/crds/{application,applicationset,appproject}-crd.yaml "$TMP/manifests/argocd/"

chmod -R u+w "$TMP"
cat >"$TMP/versions.json" <<EOF
{
  "kubernetes": "$K8S",
  "etcd": "$ETCD",
  "kwok": "$KWOK",
  "kueue": "$KUEUE",
  "helm": "$HELM",
  "argocd": "$ARGOCD",
  "go": "$(go env GOVERSION)"
}
EOF
"$TMP/kube-apiserver" --version >&2
rm -rf "$OUT"
mv "$TMP" "$OUT"
trap - EXIT
date -u +%Y-%m-%dT%H:%M:%SZ >"$OUT/.complete"
log "done in $(($(date +%s) - START))s"
echo "$OUT"
