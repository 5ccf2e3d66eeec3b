"""`LocalCluster`: a real control plane and a real node on this machine.

    with LocalCluster(tmp_path) as cluster:          # or start() / stop()
        cluster.kubeconfig                            # cluster-admin, for kubectl and helm
        cluster.resolve("joe-tts.default.svc:8001")   # -> "10.217.0.n:8001", from the host
        cluster.endpoints("default", "joe-tts", 8001) # -> ["10.216.0.2:8001", ...]
        cluster.pod_processes(namespace, pod)         # pids of a pod's containers
        cluster.logs("voxfleet-triton-cpu-...", "triton")  # a container's output so far
        cluster.check()                               # raises if a process of the cluster died

Start order: the control plane (controlplane.py; Services on node.SERVICE_CIDR, the
`kubernetes` Service's endpoint at the node's address), the node (node.py: containerd with
the images, the kubelet, kube-proxy), cluster DNS (dns.py, CoreDNS as a pod), and, in a
thread with an event loop of its own, the claims' provisioner (provisioner.py). Logs:
`<workdir>/control-plane/logs/<process>.log`, `<workdir>/node/logs/<process>.log`; the pods'
own are the kubelet's (`kubectl logs`, or `logs()` here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from . import dns, leftovers
from .controlplane import BIN_DIR, CONTROLLERS, ControlPlane
from .images import Archive
from .kube import Informer, Kube
from .node import GATEWAY, SERVICE_CIDR, VAR, Node, NodeError
from .processes import ControlPlaneError
from .provisioner import CLUSTER_ROLE, Provisioner
from .provisioner import USER as PROVISIONER_USER

log = logging.getLogger("cluster")
DNS_READY_TIMEOUT_S = 120.0


class LocalCluster:
    """A control plane and one node on this machine, for one run.

    `hpa_sync_period_s`, `controller_manager_flags`: the controller manager's HPA period and
    extra flags. `archives`: the images the node imports (default: `make images`' product
    images, images.product_archives()).
    """

    def __init__(
        self,
        workdir: Path | str,
        *,
        controllers: Sequence[str] = CONTROLLERS,
        hpa_sync_period_s: float = 15.0,
        controller_manager_flags: Sequence[str] = (),
        archives: list[Archive] | None = None,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.controllers = list(controllers)
        self.hpa_sync_period_s = hpa_sync_period_s
        self.controller_manager_flags = list(controller_manager_flags)
        self.archives = archives
        self.control_plane: ControlPlane | None = None
        self.node: Node | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- public API

    @property
    def kubeconfig(self) -> Path:
        """cluster-admin (system:masters), as the suite's user."""
        assert self.control_plane is not None, "the cluster is not running"
        return self.control_plane.admin_kubeconfig

    @property
    def gateway(self) -> str:
        """The node's address, the host's on the pods' bridge."""
        return GATEWAY

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> str:
        """The real kubectl as cluster-admin; its output (RuntimeError where it fails)."""
        binary = shutil.which("kubectl") or str(BIN_DIR / "kubectl")
        result = subprocess.run(
            [binary, "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def _get(self, *args: str) -> dict[str, Any] | None:
        """`kubectl get ARGS -o json`; None where it fails (the object does not exist)."""
        try:
            return dict(json.loads(self.kubectl("get", *args, "-o", "json")))
        except RuntimeError:
            return None

    def resolve(self, address: str) -> str:
        """ "name.namespace.svc:port" -> "clusterIP:port", reachable from the host through
        kube-proxy."""
        match = re.match(r"^([a-z0-9-]+)\.([a-z0-9-]+)\.svc(?:\.[a-z.]+)?:(\d+)$", address)
        if not match:
            raise ValueError(f"{address!r} is not <service>.<namespace>.svc:<port>")
        service = self._get("service", "-n", match[2], match[1])
        if service is None:
            raise LookupError(f"no Service {match[2]}/{match[1]}")
        return f"{service['spec']['clusterIP']}:{match[3]}"

    def endpoints(self, namespace: str, service: str, port: int) -> list[str]:
        """ "address:port" of the ready endpoints behind a Service port, from its
        EndpointSlices (what a lookup of a headless Service's name answers)."""
        spec = (self._get("service", "-n", namespace, service) or {}).get("spec") or {}
        names = [p.get("name", "") for p in spec.get("ports") or [] if p.get("port") == port]
        if not names:
            return []
        slices = self._get(
            "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}"
        )
        found = []
        for item in (slices or {}).get("items") or []:
            target = next(
                (p["port"] for p in item.get("ports") or [] if p.get("name", "") == names[0]),
                None,
            )
            for endpoint in item.get("endpoints") or []:
                if target is not None and (endpoint.get("conditions") or {}).get("ready"):
                    found += [f"{address}:{target}" for address in endpoint["addresses"]]
        return sorted(found)

    def pod_uid(self, namespace: str, pod_name: str) -> str | None:
        pod = self._get("pod", "-n", namespace, pod_name)
        return pod["metadata"]["uid"] if pod else None

    def pod_processes(self, namespace: str, pod_name: str, uid: str | None = None) -> list[int]:
        """Pids of every process running in a pod's containers (its cgroups'); `uid`, the
        pod's where the caller knows it (else it is read)."""
        uid = uid or self.pod_uid(namespace, pod_name)
        if uid is None:
            return []
        pids: set[int] = set()
        for group in leftovers.node_cgroups():
            if group.name == f"pod{uid}":
                pids.update(leftovers.cgroup_pids(group))
        return sorted(pids)

    def logs(self, pod_name: str, container: str) -> str:
        """A container's output so far, every restart's, from the kubelet's log files."""
        text = []
        for path in sorted(
            (VAR / "pod-logs").glob(f"*_{pod_name}_*/{container}/*.log"),
            key=lambda p: int(p.stem) if p.stem.isdigit() else 0,
        ):
            for line in path.read_text(errors="replace").splitlines():
                # CRI's format: "<time> <stream> <P|F> <text>".
                parts = line.split(" ", 3)
                text.append(parts[3] if len(parts) == 4 else line)
        return "\n".join(text)

    def check(self) -> None:
        """Raise if a process of the cluster died or the provisioner failed."""
        if self.control_plane is not None:
            self.control_plane.check()
        if self.node is not None:
            self.node.check()
        if self._error is not None:
            raise RuntimeError("the claims provisioner failed") from self._error

    def start(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        try:
            self.control_plane = ControlPlane(
                self.workdir / "control-plane",
                service_cidr=SERVICE_CIDR,
                advertise_address=GATEWAY,
                controllers=self.controllers,
                hpa_sync_period_s=self.hpa_sync_period_s,
                controller_manager_flags=self.controller_manager_flags,
            )
            # The node first: its bridge holds the address the API server advertises.
            self.node = Node(self.workdir / "node", self.control_plane, archives=self.archives)
            self.node.prepare()
            self.control_plane.start()
            self.node.start()
            self._start_dns()
            self._thread = threading.Thread(target=self._run, name="provisioner", daemon=True)
            self._thread.start()
            self._ready.wait(120)
            if self._error is not None or not self._ready.is_set():
                raise RuntimeError("the claims provisioner failed to start") from self._error
        except BaseException:
            self.stop(raise_errors=False)
            raise
        return self

    def stop(self, raise_errors: bool = True) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self.node is not None:
            self.node.stop()
        if self.control_plane is not None:
            self.control_plane.stop()
        if self._error is not None and raise_errors:
            error, self._error = self._error, None
            raise RuntimeError("the claims provisioner failed") from error

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- cluster DNS

    def _start_dns(self) -> None:
        manifest = self.workdir / "coredns.yaml"
        manifest.write_text(yaml.safe_dump_all(dns.manifests()))
        self.kubectl("apply", "-f", str(manifest))
        deadline = time.monotonic() + DNS_READY_TIMEOUT_S
        while True:
            self.check()
            deployment = self._get("deployment", "-n", dns.NAMESPACE, dns.NAME) or {}
            if (deployment.get("status") or {}).get("readyReplicas"):
                return
            if time.monotonic() > deadline:
                pods = self._get("pods", "-n", dns.NAMESPACE, "-l", "k8s-app=kube-dns") or {}
                raise NodeError(
                    f"cluster DNS (CoreDNS) not ready in {DNS_READY_TIMEOUT_S:g} s: "
                    + json.dumps([p.get("status") for p in pods.get("items") or []])[:1500]
                )
            time.sleep(0.5)

    # -- the provisioner's thread

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # reported by start(), check() or stop()
            log.exception("the claims provisioner failed")
            self._error = error
        finally:
            self._ready.set()

    async def _main(self) -> None:
        assert self.control_plane is not None
        plane = self.control_plane
        changed = asyncio.Event()
        clients: list[Kube] = []
        informers: list[Informer] = []
        try:
            admin = await Kube.connect(plane.admin_kubeconfig)
            clients.append(admin)
            await _bind_cluster_role(
                admin, "voxfleet-e2e-provisioner", CLUSTER_ROLE, PROVISIONER_USER
            )
            storage_api = await Kube.connect(plane.kubeconfig(PROVISIONER_USER))
            clients.append(storage_api)
            claims = Informer(storage_api, "PersistentVolumeClaim", None, changed.set)
            volumes = Informer(storage_api, "PersistentVolume", None, changed.set)
            informers = [claims, volumes]
            for informer in informers:
                informer.start()
            provisioner = Provisioner(storage_api, claims, volumes, self.workdir / "node")
            for informer in informers:
                await asyncio.wait_for(informer.synced.wait(), 30)
            await _wait_for_default_account(admin)
            self._ready.set()
            while not self._stopping.is_set():
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), 0.5)
                changed.clear()
                try:
                    await provisioner.sync()
                except Exception:  # one claim's trouble must not stop the others
                    log.exception("provisioner failed")
        finally:
            for informer in informers:
                await informer.stop()
            for client in clients:
                await client.close()


async def _wait_for_default_account(admin: Kube, timeout_s: float = 60) -> None:
    """Pods can be created once the service account controller has made `default`."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while await admin.get("ServiceAccount", "default", "default") is None:
        if asyncio.get_running_loop().time() > deadline:
            raise RuntimeError(
                "no `default` ServiceAccount after 60 s: is the controller "
                "manager's serviceaccount-controller running?"
            )
        await asyncio.sleep(0.2)


async def _bind_cluster_role(admin: Kube, name: str, role: str, user: str) -> None:
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    await admin.call("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)


__all__ = ["ControlPlaneError", "LocalCluster", "NodeError"]
