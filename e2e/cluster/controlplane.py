"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager
and kube-scheduler, the binaries `make setup` builds from their Go modules into .tools/bin
(scripts/build-control-plane.sh).

    with ControlPlane(workdir) as plane:        # or start() / stop()
        plane.admin_kubeconfig                 # system:masters, for kubectl and helm
        plane.kubeconfig("system:node:n1", ("system:nodes",))   # any other identity
        plane.check()                          # raises ControlPlaneError if a process died

Every process listens on 127.0.0.1 only (the API server also on the node's address when it has
one: `advertise_address`), on ports chosen free (or given), with certificates
made for this run (pki.py). A port in use, a binary missing, or a process that exits is a
`ControlPlaneError` that names the process and, for an exit, shows the last lines of its log;
waits for readiness end as soon as a process dies, never at a timeout alone.

The API server runs with RBAC and Node authorization, service-account tokens signed by the
run's key (issuer https://kubernetes.default.svc.cluster.local), the NodeRestriction
admission plugin, and the aggregation layer's front-proxy flags (for the custom metrics
API). The controller manager runs the controllers `CONTROLLERS` lists, each with its own
service-account credentials, as kubeadm's does; `hpa_sync_period_s` shortens the HPA
controller's period (15 s by default in Kubernetes).
"""

from __future__ import annotations

import ipaddress
import shutil
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import yaml

from .pki import API_NAMES, ClusterPki, KeyPair
from .processes import ControlPlaneError, Supervised, free_port

ROOT = Path(__file__).resolve().parents[2]
BIN_DIR = ROOT / ".tools" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
CONTROLLERS = (
    "deployment-controller",
    "replicaset-controller",
    "job-controller",
    "ttl-after-finished-controller",
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "horizontal-pod-autoscaler-controller",
    "disruption-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "endpointslice-mirroring-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "node-lifecycle-controller",
    "persistentvolume-binder-controller",
    "persistentvolume-protection-controller",
    "persistentvolumeclaim-protection-controller",
)
START_TIMEOUT_S = 120.0


def missing_binaries(bin_dir: Path = BIN_DIR) -> list[str]:
    return [name for name in BINARIES if not (bin_dir / name).is_file()]


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler for one run.

    `service_cidr`: the Services' cluster IPs (the `kubernetes` Service takes the first).
    `controllers`: the controller manager's controllers (default `CONTROLLERS`); empty runs
    no controller manager, `scheduler=False` no scheduler (an API server for API tests).
    `ports`: fixed ports by process ("etcd", "etcd-peer", "kube-apiserver",
    "kube-controller-manager", "kube-scheduler"); the others are chosen free.
    `apiserver_flags`, `controller_manager_flags`: extra flags, appended.
    `advertise_address`: where the `kubernetes` Service's endpoints point (pods reach the API
    server there, so it then listens on every address, not only on loopback). Without it no
    endpoints are written: the API server refuses loopback endpoints.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        service_cidr: str = "10.214.0.0/24",
        controllers: Sequence[str] = CONTROLLERS,
        scheduler: bool = True,
        hpa_sync_period_s: float = 15.0,
        ports: Mapping[str, int] | None = None,
        apiserver_flags: Sequence[str] = (),
        controller_manager_flags: Sequence[str] = (),
        advertise_address: str | None = None,
        bin_dir: Path = BIN_DIR,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.service_cidr = service_cidr
        self.controllers = list(controllers)
        self.run_scheduler = scheduler
        self.hpa_sync_period_s = hpa_sync_period_s
        self.apiserver_flags = list(apiserver_flags)
        self.controller_manager_flags = list(controller_manager_flags)
        self.advertise_address = advertise_address
        self.bin_dir = bin_dir
        wanted = dict(ports or {})
        self.ports = {
            name: wanted.get(name) or free_port()
            for name in (
                "etcd",
                "etcd-peer",
                "kube-apiserver",
                "kube-controller-manager",
                "kube-scheduler",
            )
        }
        self.processes: list[Supervised] = []
        self.pki: ClusterPki | None = None
        self._kubeconfigs: dict[str, Path] = {}

    # -- what users of the control plane read

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.ports['kube-apiserver']}"

    @property
    def kubernetes_service_ip(self) -> str:
        network = ipaddress.ip_network(self.service_cidr)
        return str(network.network_address + 1)

    @property
    def ca_cert(self) -> Path:
        assert self.pki is not None, "the control plane is not started"
        return self.pki.cluster.cert

    @property
    def admin_kubeconfig(self) -> Path:
        return self.kubeconfig("voxfleet-e2e-admin", ("system:masters",))

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def client_certificate(self, user: str, groups: Sequence[str] = ()) -> KeyPair:
        assert self.pki is not None, "the control plane is not started"
        file_name = user.replace(":", "-")
        return self.pki.cluster.issue(f"client-{file_name}", user, tuple(groups))

    def kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig that logs in as `user` (member of `groups`) with a client
        certificate of the cluster CA."""
        if user in self._kubeconfigs:
            return self._kubeconfigs[user]
        pair = self.client_certificate(user, groups)
        path = self.workdir / "kubeconfigs" / f"{user.replace(':', '-')}.yaml"
        write_kubeconfig(path, self.url, self.ca_cert, user, pair)
        self._kubeconfigs[user] = path
        return path

    def check(self) -> None:
        """Raise `ControlPlaneError` (the process, its exit, its log's last lines) if any
        control-plane process has exited."""
        for process in self.processes:
            process.check()

    # -- life

    def start(
        self,
        before_controllers: Callable[[ControlPlane], None] | None = None,
    ) -> ControlPlane:
        """Start every process; `before_controllers` runs once the API server is ready and
        before the controller manager starts (CRDs installed then are known to its garbage
        collector at once, instead of after its next discovery, up to 30 s later)."""
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(
                f"{', '.join(missing)} not found in {self.bin_dir}: run `make setup`, which "
                "builds the control plane from its Go modules (scripts/build-control-plane.sh)"
            )
        if shutil.which("openssl") is None:
            raise ControlPlaneError(
                "openssl is not on PATH: the control plane's certificates are made with it"
            )
        try:
            self.pki = ClusterPki.create(self.workdir / "pki")
            self._start_etcd()
            self._start_apiserver()
            if before_controllers is not None:
                before_controllers(self)
            if self.controllers:
                self._start_controller_manager()
            if self.run_scheduler:
                self._start_scheduler()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for process in reversed(self.processes):
            process.stop()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the processes

    def _binary(self, name: str) -> str:
        return str(self.bin_dir / name)

    def _launch(self, name: str, argv: list[str], ports: dict[str, int]) -> Supervised:
        process = Supervised(name, argv, self.log_path(name), ports)
        process.start()
        self.processes.append(process)
        return process

    def _wait_healthy(
        self, process: Supervised, url: str, ca: Path, client: KeyPair | None = None
    ) -> None:
        context = ssl.create_default_context(cafile=str(ca))
        if client is not None:
            context.load_cert_chain(str(client.cert), str(client.key))

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=5, context=context) as response:
                    return bool(response.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        _wait(process, healthy, f"{process.name} to answer {url}")

    def _start_etcd(self) -> None:
        assert self.pki is not None
        ca = self.pki.etcd
        server = ca.issue("etcd-server", "etcd", server_names=("127.0.0.1", "localhost"))
        client, peer = (
            f"https://127.0.0.1:{self.ports['etcd']}",
            f"https://127.0.0.1:{self.ports['etcd-peer']}",
        )
        process = self._launch(
            "etcd",
            [
                self._binary("etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=default={peer}",
                f"--cert-file={server.cert}",
                f"--key-file={server.key}",
                f"--trusted-ca-file={ca.cert}",
                "--client-cert-auth=true",
                f"--peer-cert-file={server.cert}",
                f"--peer-key-file={server.key}",
                f"--peer-trusted-ca-file={ca.cert}",
                "--peer-client-cert-auth=true",
                # A throw-away store: no fsync (as envtest runs it), and a small quota.
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=1073741824",
                "--log-level=warn",
            ],
            {
                "--listen-client-urls": self.ports["etcd"],
                "--listen-peer-urls": self.ports["etcd-peer"],
            },
        )
        self.etcd_client = ca.issue("apiserver-etcd-client", "kube-apiserver-etcd-client")
        self._wait_healthy(process, f"{client}/health", ca.cert, self.etcd_client)

    def _start_apiserver(self) -> None:
        assert self.pki is not None
        pki = self.pki
        addresses = (
            "127.0.0.1",
            self.kubernetes_service_ip,
            *([self.advertise_address] if self.advertise_address else []),
        )
        serving = pki.cluster.issue(
            "apiserver", "kube-apiserver", server_names=(*addresses, *API_NAMES), client=False
        )
        if self.advertise_address:
            # Pods reach it there, through the `kubernetes` Service (kube-proxy).
            advertise = [
                f"--advertise-address={self.advertise_address}",
                "--bind-address=0.0.0.0",
            ]
        else:
            advertise = [
                "--advertise-address=127.0.0.1",
                "--bind-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
            ]
        # What it shows of a node's kubelet (logs, exec, port-forward) it asks as this user.
        kubelet_client = pki.cluster.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",)
        )
        proxy_client = pki.front_proxy.issue("front-proxy-client", "front-proxy-client")
        port = self.ports["kube-apiserver"]
        process = self._launch(
            "kube-apiserver",
            [
                self._binary("kube-apiserver"),
                f"--etcd-servers=https://127.0.0.1:{self.ports['etcd']}",
                f"--etcd-cafile={pki.etcd.cert}",
                f"--etcd-certfile={self.etcd_client.cert}",
                f"--etcd-keyfile={self.etcd_client.key}",
                *advertise,
                f"--secure-port={port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                f"--client-ca-file={pki.cluster.cert}",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={pki.service_account_pub}",
                f"--service-account-signing-key-file={pki.service_account_key}",
                f"--service-cluster-ip-range={self.service_cidr}",
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--requestheader-client-ca-file={pki.front_proxy.cert}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={proxy_client.cert}",
                f"--proxy-client-key-file={proxy_client.key}",
                f"--kubelet-client-certificate={kubelet_client.cert}",
                f"--kubelet-client-key={kubelet_client.key}",
                "--kubelet-preferred-address-types=InternalIP",
                "--profiling=false",
                *self.apiserver_flags,
            ],
            {"--secure-port": port},
        )
        self._wait_healthy(process, f"{self.url}/readyz", pki.cluster.cert)

    def _component_flags(self, name: str, user: str) -> tuple[list[str], Path]:
        """Kubeconfig, delegated authentication and serving flags of a component."""
        assert self.pki is not None
        kubeconfig = self.kubeconfig(user)
        serving = self.pki.cluster.issue(
            f"{name}-serving", name, server_names=("127.0.0.1", "localhost"), client=False
        )
        return [
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.ports[name]}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            "--leader-elect=false",
            "--profiling=false",
        ], serving.cert

    def _start_controller_manager(self) -> None:
        assert self.pki is not None
        name = "kube-controller-manager"
        flags, _ = self._component_flags(name, "system:kube-controller-manager")
        process = self._launch(
            name,
            [
                self._binary(name),
                *flags,
                f"--controllers={','.join(self.controllers)}",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={self.pki.service_account_key}",
                f"--root-ca-file={self.pki.cluster.cert}",
                f"--service-cluster-ip-range={self.service_cidr}",
                f"--horizontal-pod-autoscaler-sync-period={self.hpa_sync_period_s:g}s",
                *self.controller_manager_flags,
            ],
            {"--secure-port": self.ports[name]},
        )
        self._wait_healthy(
            process, f"https://127.0.0.1:{self.ports[name]}/healthz", self.pki.cluster.cert
        )

    def _start_scheduler(self) -> None:
        assert self.pki is not None
        name = "kube-scheduler"
        flags, _ = self._component_flags(name, "system:kube-scheduler")
        process = self._launch(
            name, [self._binary(name), *flags], {"--secure-port": self.ports[name]}
        )
        self._wait_healthy(
            process, f"https://127.0.0.1:{self.ports[name]}/healthz", self.pki.cluster.cert
        )


def _wait(
    process: Supervised, ready: Callable[[], bool], what: str, timeout_s: float = START_TIMEOUT_S
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        process.check()
        if time.monotonic() > deadline:
            raise ControlPlaneError(
                f"waited {timeout_s:g} s for {what}; the last lines of its log:\n"
                + "\n".join(process.log_path.read_text(errors="replace").splitlines()[-30:])
            )
        time.sleep(0.2)


def write_kubeconfig(
    path: Path, server: str, ca: Path, user: str, pair: KeyPair, namespace: str | None = None
) -> Path:
    context: dict[str, str] = {"cluster": "local", "user": user}
    if namespace:
        context["namespace"] = namespace
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "local",
                        "cluster": {"server": server, "certificate-authority": str(ca)},
                    }
                ],
                "users": [
                    {
                        "name": user,
                        "user": {"client-certificate": str(pair.cert), "client-key": str(pair.key)},
                    }
                ],
                "contexts": [{"name": "local", "context": context}],
                "current-context": "local",
            }
        )
    )
    path.chmod(0o600)
    return path
