#!/usr/bin/env bash
# `make e2e-kind`: the e2e suite against a real Kubernetes cluster in kind.
#
# Creates a kind cluster, builds the operator image and the CPU Triton image from docker/,
# loads them into the cluster, installs the chart with the suite's CPU-pool values
# (e2e/values-cpu.yaml), runs the same suite as `make e2e` with VOXFLEET_E2E_KUBECONFIG
# pointing at the cluster, and deletes the cluster, also when something fails.
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
tag="e2e"

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

docker build -f docker/operator.Dockerfile -t "voxfleet-operator:$tag" .
docker build -f docker/triton-cpu.Dockerfile -t "voxfleet-triton-cpu:$tag" .
kind load docker-image --name "$cluster" "voxfleet-operator:$tag" "voxfleet-triton-cpu:$tag"

helm install voxfleet charts/voxfleet --namespace "$namespace" --create-namespace \
    -f e2e/values-cpu.yaml \
    --set operator.image.repository=voxfleet-operator --set "operator.image.tag=$tag" \
    --set tritonImage.repository=voxfleet-triton-cpu --set "tritonImage.tag=$tag" \
    --wait --timeout 5m

VOXFLEET_E2E_KUBECONFIG="$work/kubeconfig" VOXFLEET_E2E_NAMESPACE="$namespace" \
    VOXFLEET_E2E_RELEASE=voxfleet \
    .venv/bin/pytest e2e/test_kubectl_to_audio.py -q ${PYTEST_ARGS:-}
