"""One real Kubernetes node on this machine: containerd, the kubelet and kube-proxy.

    node = Node(workdir, plane)      # plane: a started ControlPlane
    node.start()                     # containerd, images imported, kubelet Ready, kube-proxy
    node.stop()                      # every pod stopped, then the three processes, then cleanup

- containerd (Debian's) with runc and the CNI plugins (`bridge` + `host-local` + `portmap`,
  Debian's containernetworking-plugins): its own configuration, socket and state under
  `STATE` and its image store under `VAR`/containerd, which runs kept between runs so that
  a second run imports no image again (images.py). `restrict_oom_score_adj = true`: this
  machine's capability bounding set lacks CAP_SYS_RESOURCE, so runc could not write the
  kubelet's oom_score_adj otherwise.
- the kubelet (built by `make setup` from k8s.io/kubernetes, the control plane's release):
  cgroupfs driver under the cgroup `CGROUP_ROOT` (cgroup v1 here: `failCgroupV1: false`),
  pods on the bridge `BRIDGE` (POD_SUBNET, the host at GATEWAY, which is also the node's
  address and where the API server's `kubernetes` Service points), cluster DNS at DNS_IP.
  Its server (logs, exec, port-forward, attach) authenticates the API server's client
  certificate and asks the API server (Webhook) what it may do. Image garbage collection is
  off: the images are imported, never pulled.
- kube-proxy in iptables mode, for Services on SERVICE_CIDR, from the host too.

The kubelet sets three kernel settings on the host as any kubelet with
`protectKernelDefaults: false` does (vm.overcommit_memory=1, kernel.panic=10,
kernel.panic_on_oops=1), and the CNI bridge plugin turns IP forwarding on (net.ipv4.ip_forward
=1, for pods to reach Services); the node keeps their values before it starts and puts them
back when it stops (or, after a killed run, when the next one starts). kube-proxy's and the
bridge's iptables rules, the bridge, the pods' network namespaces, mounts and cgroups are
removed at stop, and whatever a killed run left is removed before the next one starts
(leftovers.py). One node per machine: a second one fails at once and names the first.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from . import leftovers
from .controlplane import BIN_DIR, ControlPlane
from .images import Archive, import_images, node_archives, product_archives
from .processes import ControlPlaneError, Supervised, free_port, log_tail

NODE_NAME = "voxfleet-node"
POD_SUBNET = "10.216.0.0/24"
GATEWAY = "10.216.0.1"
SERVICE_CIDR = "10.217.0.0/24"
DNS_IP = "10.217.0.10"
CLUSTER_DOMAIN = "cluster.local"
BRIDGE = "vxfnode0"
STATE = leftovers.STATE
VAR = leftovers.VAR
CGROUP_ROOT = leftovers.CGROUP_ROOT
CNI_BIN = Path("/usr/lib/cni")
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
NODE_BINARIES = ("kubelet", "kube-proxy", "coredns", "pause")
PACKAGES = "apt-get install containerd runc containernetworking-plugins iptables conntrack"
START_TIMEOUT_S = 120.0
# A kubelet that dies while it starts is started again, as systemd's `Restart=always` does on
# a real node: kubelet 1.35.4 now and then stops at its first node status with "fatal error:
# concurrent map iteration and map write" (its node allocatable read beside the DRA plugin
# manager's first pass), and a second start goes through.
KUBELET_START_RETRIES = 2
LOGGER = logging.getLogger(__name__)


class NodeError(ControlPlaneError):
    """The node could not start, or one of its processes died."""


def node_missing(bin_dir: Path = BIN_DIR, cgroups: Path = Path("/sys/fs/cgroup")) -> str | None:
    """What this machine lacks to run the node, in one line that says how to get it."""
    if os.geteuid() != 0:
        return "the e2e node needs root (containerd, cgroups, network namespaces, iptables)"
    for tool in ("containerd", "containerd-shim-runc-v2", "ctr", "runc", "iptables", "ip"):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH: `{PACKAGES}` (make setup does)"
    for plugin in CNI_PLUGINS:
        if not (CNI_BIN / plugin).is_file():
            return f"the CNI plugin {CNI_BIN / plugin} is missing: `{PACKAGES}` (make setup does)"
    built = [name for name in NODE_BINARIES if not (bin_dir / name).is_file()]
    if built:
        return (
            f"{', '.join(built)} not found in {bin_dir}: run `make setup`, which builds them "
            "from their Go modules (scripts/build-control-plane.sh)"
        )
    probe = cgroups / "memory" / f"voxfleet-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as error:
        return (
            f"cannot create a cgroup ({probe}: {error.strerror}): the kubelet needs write "
            f"access to {cgroups} (root on a host or VM, or a privileged container)"
        )
    return None


def missing_image(archives: list[Archive]) -> str | None:
    for archive in archives:
        if not archive.path.is_file():
            return (
                f"the image {archive.name} is missing ({archive.path} not found): run "
                "`make images`, which builds docker/'s images without Docker"
            )
    return None


class Node:
    """containerd, the kubelet and kube-proxy of one run, registered as NODE_NAME."""

    def __init__(
        self,
        workdir: Path,
        plane: ControlPlane,
        *,
        bin_dir: Path = BIN_DIR,
        archives: list[Archive] | None = None,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.plane = plane
        self.bin_dir = bin_dir
        self.archives = product_archives() if archives is None else list(archives)
        self.processes: dict[str, Supervised] = {}
        self._lock_fd = -1
        self.kubelet_port = 0
        self.imported: list[str] = []

    @property
    def socket(self) -> Path:
        return STATE / "containerd" / "containerd.sock"

    @property
    def ctr(self) -> list[str]:
        return ["ctr", "--address", str(self.socket)]

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def check(self) -> None:
        for process in self.processes.values():
            reason = process.failure()
            if reason:
                raise NodeError(reason)

    # -- life

    def prepare(self) -> Node:
        """Before the control plane starts: what the machine lacks fails here, in one line;
        then the node's lock, what a killed run left removed, and the pods' bridge (the node's
        address, which the API server advertises)."""
        missing = node_missing(self.bin_dir) or missing_image(self.archives)
        if missing:
            raise NodeError(missing)
        self._take_lock()
        try:
            leftovers.clean(self.bin_dir / "kube-proxy", BRIDGE)
            leftovers.save_sysctls()
            leftovers.make_cgroup_root()
            _make_bridge()
        except BaseException:
            self.stop()
            raise
        return self

    def start(self) -> Node:
        """containerd with the images, the kubelet (until its Node is Ready), kube-proxy."""
        if self._lock_fd < 0:
            self.prepare()
        try:
            self._start_containerd()
            self.imported = import_images(self.ctr, [*node_archives(self.bin_dir), *self.archives])
            self._start_kubelet()
            self._start_kube_proxy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, pods_gone_timeout_s: float = 60.0) -> None:
        """Stop every pod (the kubelet tears down their containers and networks), then
        kube-proxy, the kubelet and containerd, and remove what they leave on the host."""
        kubelet = self.processes.get("kubelet")
        if kubelet is not None and kubelet.failure() is None and self.socket.exists():
            with contextlib.suppress(Exception):
                self._stop_pods(pods_gone_timeout_s)
        for name in ("kube-proxy", "kubelet", "containerd"):
            process = self.processes.pop(name, None)
            if process is not None:
                process.stop(grace_s=15)
        with contextlib.suppress(Exception):
            leftovers.clean(self.bin_dir / "kube-proxy", BRIDGE)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1

    # -- pieces

    def _take_lock(self) -> None:
        STATE.mkdir(parents=True, exist_ok=True)
        lock = STATE / "node.lock"
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = lock.read_text().strip() or "another process"
            os.close(fd)
            raise NodeError(
                f"another e2e node runs on this machine (pid {holder}, lock {lock}): one node "
                "per machine; wait for it or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._lock_fd = fd

    def _launch(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Supervised:
        process = Supervised(name, argv, self.log_path(name), {}, env=env)
        process.start()
        self.processes[name] = process
        return process

    def _wait(
        self,
        name: str,
        ready: Callable[[], bool],
        what: str,
        timeout_s: float = START_TIMEOUT_S,
        retries: int = 0,
    ) -> None:
        """Wait for `ready`; a process that dies meanwhile is started again at most `retries`
        times, then its death is the error."""
        process = self.processes[name]
        deadline = time.monotonic() + timeout_s
        while not ready():
            reason = process.failure()
            if reason and retries > 0:
                retries -= 1
                LOGGER.warning("%s; starting it again", reason)
                process.start()
                continue
            if reason:
                raise NodeError(reason)
            if time.monotonic() > deadline:
                raise NodeError(
                    f"waited {timeout_s:g} s for {what}; the last lines of {name}'s log:\n"
                    + log_tail(process.log_path)
                )
            time.sleep(0.3)

    def _start_containerd(self) -> None:
        config = self.workdir / "containerd" / "config.toml"
        cni_conf = self.workdir / "cni" / "net.d"
        cni_conf.mkdir(parents=True, exist_ok=True)
        (cni_conf / "10-voxfleet.conflist").write_text(json.dumps(cni_config(), indent=2))
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(containerd_config(self.socket, cni_conf))
        self._launch("containerd", ["containerd", "--config", str(config)])

        def answering() -> bool:
            result = subprocess.run([*self.ctr, "version"], capture_output=True)
            return result.returncode == 0

        self._wait("containerd", answering, f"containerd to answer on {self.socket}")

    def _start_kubelet(self) -> None:
        assert self.plane.pki is not None
        directory = self.workdir / "kubelet"
        directory.mkdir(parents=True, exist_ok=True)
        self.kubelet_port = free_port(GATEWAY)
        resolv = directory / "resolv.conf"
        # The pods' upstream: none. Cluster names are CoreDNS's; nothing else resolves.
        resolv.write_text("options ndots:5\n")
        config = directory / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(self.socket, self.kubelet_port, self.plane.pki.cluster.cert, resolv)
            )
        )
        kubeconfig = self.plane.kubeconfig(f"system:node:{NODE_NAME}", ("system:nodes",))
        (VAR / "kubelet").mkdir(parents=True, exist_ok=True)
        self._launch(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={VAR / 'kubelet'}",
                f"--cert-dir={directory / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={GATEWAY}",
                "--v=1",
            ],
        )
        admin = self.plane.admin_kubeconfig

        def node_ready() -> bool:
            result = subprocess.run(
                [
                    "kubectl",
                    f"--kubeconfig={admin}",
                    "get",
                    "node",
                    NODE_NAME,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
                ],
                capture_output=True,
                text=True,
            )
            return result.stdout.strip() == "True"

        self._wait(
            "kubelet",
            node_ready,
            f"the node {NODE_NAME} to be Ready",
            retries=KUBELET_START_RETRIES,
        )

    def _start_kube_proxy(self) -> None:
        directory = self.workdir / "kube-proxy"
        directory.mkdir(parents=True, exist_ok=True)
        kubeconfig = self.plane.kubeconfig("system:kube-proxy")
        config = directory / "config.yaml"
        health, metrics = free_port(), free_port()
        config.write_text(yaml.safe_dump(kube_proxy_config(kubeconfig, health, metrics)))
        self._launch(
            "kube-proxy", [str(self.bin_dir / "kube-proxy"), f"--config={config}", "--v=1"]
        )

        def synced() -> bool:
            rules = subprocess.run(
                ["iptables", "-t", "nat", "-S", "KUBE-SERVICES"], capture_output=True, text=True
            ).stdout
            return self.plane.kubernetes_service_ip in rules

        self._wait("kube-proxy", synced, "kube-proxy to program the `kubernetes` Service")

    def _stop_pods(self, timeout_s: float) -> None:
        """Delete every pod with no grace, and wait until containerd runs none: the kubelet
        stops their containers and tears down their sandboxes' networks itself."""
        for name in ("kube-controller-manager", "kube-scheduler"):
            for process in self.plane.processes:
                if process.name == name:
                    process.stop()
        admin = str(self.plane.admin_kubeconfig)
        subprocess.run(
            [
                "kubectl",
                f"--kubeconfig={admin}",
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                "--grace-period=0",
                "--force",
                "--wait=false",
            ],
            capture_output=True,
            timeout=60,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            tasks = subprocess.run(
                [*self.ctr, "-n", "k8s.io", "tasks", "ls", "-q"], capture_output=True, text=True
            ).stdout.split()
            if not tasks:
                return
            time.sleep(0.5)


def _has_address(address: str) -> bool:
    shown = subprocess.run(["ip", "-o", "addr", "show"], capture_output=True, text=True).stdout
    return f" {address}/" in shown


def _make_bridge() -> None:
    """The pods' bridge with the host's (and node's) address, before the first pod makes it:
    the API server's `kubernetes` endpoint and the kubelet listen there."""
    if not _has_address(GATEWAY):
        subprocess.run(["ip", "link", "add", BRIDGE, "type", "bridge"], capture_output=True)
        subprocess.run(
            ["ip", "addr", "add", f"{GATEWAY}/24", "dev", BRIDGE], check=True, capture_output=True
        )
    subprocess.run(["ip", "link", "set", BRIDGE, "up"], check=True, capture_output=True)


def cni_config() -> dict[str, object]:
    return {
        "cniVersion": "0.4.0",
        "name": "voxfleet-e2e",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                # Pod traffic stays on this machine: nothing is masqueraded out of it.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(STATE / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def containerd_config(socket: Path, cni_conf: Path) -> str:
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return "\n".join(
        [
            "version = 2",
            f'root = "{VAR / "containerd"}"',
            f'state = "{STATE / "containerd"}"',
            "[grpc]",
            f'  address = "{socket}"',
            "[ttrpc]",
            f'  address = "{socket}.ttrpc"',
            "[metrics]",
            '  address = ""',
            f"[{cri}]",
            '  sandbox_image = "localhost/voxfleet-pause:e2e"',
            "  restrict_oom_score_adj = true",
            "  enable_selinux = false",
            # The pods' network namespaces under STATE, where leftovers.py looks for them.
            "  netns_mounts_under_state_dir = true",
            f"[{cri}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            f"[{cri}.containerd.runtimes.runc]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"[{cri}.containerd.runtimes.runc.options]",
            "  SystemdCgroup = false",
            f'  BinaryName = "{shutil.which("runc") or "runc"}"',
            f"[{cri}.cni]",
            f'  bin_dir = "{CNI_BIN}"',
            f'  conf_dir = "{cni_conf}"',
            "  max_conf_num = 1",
            "",
        ]
    )


def kubelet_config(socket: Path, port: int, client_ca: Path, resolv: Path) -> dict[str, object]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # This machine's cgroups are v1 (a hybrid layout) and it has no systemd.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": CGROUP_ROOT,
        "containerRuntimeEndpoint": f"unix://{socket}",
        "address": GATEWAY,
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "Webhook"},
        "clusterDNS": [DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv),
        "podLogsDir": str(VAR / "pod-logs"),
        "failSwapOn": False,
        # Images are imported, never pulled: never collect them.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # A shared development machine's disk and memory are not this node's to guard.
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%"},
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "0s",
        "shutdownGracePeriod": "0s",
        "containerLogMaxSize": "50Mi",
        "maxPods": 110,
    }


def kube_proxy_config(kubeconfig: Path, health_port: int, metrics_port: int) -> dict[str, object]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_SUBNET,
        "healthzBindAddress": f"127.0.0.1:{health_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # NodePorts on the node's address only: kube-proxy leaves route_localnet alone.
        "nodePortAddresses": [f"{GATEWAY}/32"],
        # Leave the host's conntrack settings as they are.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "iptables": {"minSyncPeriod": "0s", "syncPeriod": "30s"},
    }
