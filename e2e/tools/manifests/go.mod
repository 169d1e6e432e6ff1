// Pins the Argo CD module whose manifests/crds/ the test bed installs (YAML only, nothing is
// built from it). hack/build-testbed-tools.sh reads the version below; do not run go mod tidy
// here, it would drop the requirement.
module specdeploy.dev/e2e/tools/manifests

go 1.26.0

require github.com/argoproj/argo-cd/v3 v3.5.7
