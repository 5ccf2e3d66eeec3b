#!/usr/bin/env bash
# `make e2e-kind`: the e2e suite against a real Kubernetes cluster in kind.
#
# Creates a kind cluster, loads the images `make images` built from docker/ (the OCI archives
# in .tools/images, the same images `make e2e`'s node runs), and runs the same scenarios as
# `make e2e` with VOXFLEET_E2E_KUBECONFIG pointing at the cluster: the suite itself runs
# `helm install` with the suite's values (e2e/values-cpu.yaml, which name those images), then
# `helm upgrade` and `helm uninstall`, as it does on the local cluster. The cluster is deleted
# at the end, also when something fails.
# What differs from `make e2e`: kind runs the control plane and the pods, and the suite
# reaches Services and pods with `kubectl port-forward`.
#
# Needs Docker (a running engine), kind, helm and kubectl; stops at once, before creating
# anything, where one is missing. Environment:
#   KIND_CLUSTER   cluster name (default voxfleet-e2e)
#   KEEP_CLUSTER=1 leave the cluster running after the suite
#   PYTEST_ARGS    extra pytest arguments
set -euo pipefail

cd "$(dirname "$0")/.."
cluster="${KIND_CLUSTER:-voxfleet-e2e}"
namespace="voxfleet-e2e"
images=(.tools/images/operator.tar .tools/images/speech-api.tar .tools/images/triton-cpu.tar)

missing=()
for tool in docker kind helm kubectl; do
    command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "e2e-kind: ${missing[*]} not found on PATH; make e2e-kind needs Docker, kind, helm and" \
        "kubectl (helm and kubectl come with \`make setup\` in .tools/bin). Without Docker," \
        "run \`make e2e\` (the local cluster) instead." >&2
    exit 2
fi
if ! docker info >/dev/null 2>&1; then
    echo "e2e-kind: the Docker engine is not reachable (\`docker info\` fails); start it or" \
        "run \`make e2e\` (the local cluster) instead." >&2
    exit 2
fi

for archive in "${images[@]}"; do
    if ! [ -f "$archive" ]; then
        echo "e2e-kind: $archive not found: run \`make images\` (\`make e2e-kind\` does)." >&2
        exit 2
    fi
done

work="$(mktemp -d)"
cleanup() {
    status=$?
    if [ "${KEEP_CLUSTER:-0}" != 1 ]; then
        kind delete cluster --name "$cluster" || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT

kind create cluster --name "$cluster" --wait 180s
kind get kubeconfig --name "$cluster" >"$work/kubeconfig"
export KUBECONFIG="$work/kubeconfig"

for archive in "${images[@]}"; do
    kind load image-archive --name "$cluster" "$archive"
done

VOXFLEET_E2E_KUBECONFIG="$work/kubeconfig" VOXFLEET_E2E_NAMESPACE="$namespace" \
    VOXFLEET_E2E_RELEASE=voxfleet \
    .venv/bin/pytest e2e -q ${PYTEST_ARGS:-}
