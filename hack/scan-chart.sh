#!/usr/bin/env bash
# Scans the rendered Helm chart with checkov (a maintained Kubernetes manifest linter, installed
# by hack/install-checkov.sh), under .checkov.yaml: the default values, and every optional
# object on with watched namespaces. Fails on any finding not disabled there with its reason.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HELM="$(bash "$ROOT/hack/build-testbed-tools.sh")/helm"
CHECKOV="$(bash "$ROOT/hack/install-checkov.sh")"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT

"$HELM" template specdeploy "$ROOT/charts/specdeploy" -n specdeploy-system >"$OUT/default.yaml"
"$HELM" template specdeploy "$ROOT/charts/specdeploy" -n specdeploy-system \
  --set 'config.namespaces={serving}' --set 'rbac.secretNamespaces={serving}' \
  --set networkPolicy.enabled=true --set serviceMonitor.enabled=true >"$OUT/everything-on.yaml"
"$HELM" template specdeploy "$ROOT/charts/specdeploy" -n specdeploy-system \
  --set 'rbac.secretNamespaces={serving}' >"$OUT/cluster-wide-secrets-confined.yaml"

cd "$ROOT"
"$CHECKOV" --config-file "$ROOT/.checkov.yaml" -d "$OUT"
