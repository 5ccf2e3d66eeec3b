"""`LocalCluster`: a real control plane and the node agent's nodes on this machine.

    with LocalCluster(tmp_path) as cluster:          # or start() / stop()
        cluster.kubeconfig                            # cluster-admin, for kubectl and helm
        cluster.resolve("joe-tts.default.svc:8001")   # -> "10.214.k.n:8001", from the host
        cluster.endpoints("default", "joe-tts", 8001) # -> ["10.213.k.2:8001", ...]
        cluster.logs("voxfleet-triton-cpu-...", "triton")  # a container's output so far
        cluster.runtime(namespace, pod)               # the pod's processes, to kill one
        cluster.check()                               # raises if a control-plane process died

Start order: the pod network's slot (network.py: bridge vxf{k}br, pods on 10.213.k.0/24),
then the control plane (controlplane.py) with Services on 10.214.k.0/24 and the `kubernetes`
Service's endpoint at the bridge's gateway, a forwarder from there to the API server's
loopback port, then, in a thread with an event loop of its own, the node agent's nodes
(nodeagent.py), the Service proxy (services.py) and the claims' provisioner
(provisioner.py). Pod output goes to `<workdir>/node/logs/<pod>_<container>.log`, the
control plane's to `<workdir>/control-plane/logs/<process>.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import aiohttp

from . import network as network_module
from .controlplane import CONTROLLERS, ControlPlane
from .cpus import CpuAllocator
from .kube import Informer, Kube
from .network import PodNetwork
from .node import NodeContext
from .nodeagent import AGENT_VERSION, NodeAgent, NodeSpec, VirtualNode
from .pod import PodRuntime
from .processes import ControlPlaneError
from .provisioner import CLUSTER_ROLE, Provisioner
from .provisioner import USER as PROVISIONER_USER
from .services import ServiceProxies

log = logging.getLogger("cluster")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_NODES = (NodeSpec("local-node-0"), NodeSpec("local-node-1"))


def default_image_paths() -> list[str]:
    """The files that stand for every container's image: the project (its sources, `.venv`
    and `.tools`) and the Python that runs it, outermost directories only."""
    project = Path(__file__).resolve().parents[2]
    found = {str(Path(p).resolve()) for p in (project, sys.prefix, sys.base_prefix)}
    return sorted(p for p in found if not any(p.startswith(q + "/") for q in found))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, RuntimeError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def forward(listen_host: str, listen_port: int, host: str, port: int) -> asyncio.Server:
    """Bytes from `listen_host:listen_port` to `host:port`, one connection each."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(handle, listen_host, listen_port, reuse_address=True)


class LocalCluster:
    """A control plane and `nodes` on this machine, for one run.

    `hpa_sync_period_s`, `controller_manager_flags`: the controller manager's HPA period
    and extra flags. `env`: extra variables every container starts with (as an image's
    ENV). `stop_grace_s`: at stop(), the longest any pod gets between SIGTERM and SIGKILL.
    `image_paths`: host directories that stand for the image's own files (default: the
    project and its Python, `default_image_paths()`).
    """

    def __init__(
        self,
        workdir: Path | str,
        *,
        nodes: Sequence[NodeSpec] = DEFAULT_NODES,
        controllers: Sequence[str] = CONTROLLERS,
        hpa_sync_period_s: float = 15.0,
        controller_manager_flags: Sequence[str] = (),
        env: dict[str, str] | None = None,
        stop_grace_s: float = 5.0,
        image_paths: list[str] | None = None,
    ) -> None:
        self.workdir = Path(workdir).absolute()
        self.node_specs = list(nodes)
        self.controllers = list(controllers)
        self.hpa_sync_period_s = hpa_sync_period_s
        self.controller_manager_flags = list(controller_manager_flags)
        self.extra_env = dict(env or {})
        self.stop_grace_s = stop_grace_s
        self.image_paths = default_image_paths() if image_paths is None else list(image_paths)
        self.network = PodNetwork()
        self.control_plane: ControlPlane | None = None
        self.services: ServiceProxies | None = None
        self.agent: NodeAgent | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._log_handler: logging.Handler | None = None

    # -- public API

    @property
    def kubeconfig(self) -> Path:
        """cluster-admin (system:masters), as the suite's user."""
        assert self.control_plane is not None, "the cluster is not running"
        return self.control_plane.admin_kubeconfig

    @property
    def gateway(self) -> str:
        """The host's address on the pod bridge (every node's InternalIP)."""
        return self.network.gateway

    def resolve(self, address: str) -> str:
        """ "name.namespace.svc:port" -> "clusterIP:port", reachable from the host."""
        if self.services is None:
            raise RuntimeError("the cluster is not running")
        return self.services.resolve(address)

    def endpoints(self, namespace: str, service: str, port: int) -> list[str]:
        """ "address:port" of the ready endpoints behind a Service port, from its
        EndpointSlices (e.g. for Prometheus scrape targets)."""
        if self.services is None:
            return []
        return [f"{ip}:{target}" for ip, target in self.services.backends(namespace, service, port)]

    def runtime(self, namespace: str, pod_name: str) -> PodRuntime | None:
        return self.agent.runtime(namespace, pod_name) if self.agent else None

    def container_pid(self, namespace: str, pod_name: str, container: str) -> int | None:
        """The pid of a running container's main process (to kill it, as a crash would)."""
        runtime = self.runtime(namespace, pod_name)
        for item in runtime.containers if runtime else []:
            process = item.process
            if item.name == container and process is not None and process.returncode is None:
                return process.pid
        return None

    def claim_path(self, namespace: str, claim: str) -> Path:
        """The directory behind a claim's volume (provisioner.py)."""
        return self.workdir / "node" / "claims" / namespace / claim

    def pod_processes(self, namespace: str, pod_name: str) -> list[int]:
        """Pids of every process running in a pod (its network namespace's)."""
        runtime = self.runtime(namespace, pod_name)
        if runtime is None or not runtime.netns:
            return []
        return network_module.namespace_pids(runtime.netns)

    def log_path(self, pod_name: str, container: str) -> Path:
        return self.workdir / "node" / "logs" / f"{pod_name}_{container}.log"

    def logs(self, pod_name: str, container: str) -> str:
        path = self.log_path(pod_name, container)
        return path.read_text(errors="replace") if path.exists() else ""

    def check(self) -> None:
        """Raise if a control-plane process died or the node agent failed."""
        if self.control_plane is not None:
            self.control_plane.check()
        if self._error is not None:
            raise RuntimeError("the node agent failed") from self._error

    def start(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        # The node agent's own log (warnings of its pods, watches and proxy), for failures.
        self._log_handler = logging.FileHandler(self.workdir / "node-agent.log")
        self._log_handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
        )
        log.addHandler(self._log_handler)
        try:
            self.network.start()
            slot = self.network.slot
            self.control_plane = ControlPlane(
                self.workdir / "control-plane",
                service_cidr=f"10.214.{slot}.0/24",
                advertise_address=self.gateway,
                controllers=self.controllers,
                hpa_sync_period_s=self.hpa_sync_period_s,
                controller_manager_flags=self.controller_manager_flags,
            )
            self.control_plane.start()
            self._thread = threading.Thread(target=self._run, name="node-agent", daemon=True)
            self._thread.start()
            self._ready.wait(120)
            if self._error is not None or not self._ready.is_set():
                raise RuntimeError("the node agent failed to start") from self._error
        except BaseException:
            self.stop(raise_errors=False)
            raise
        return self

    def stop(self, raise_errors: bool = True) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.stop_grace_s + 60)
            self._thread = None
        if self.control_plane is not None:
            self.control_plane.stop()
        self.network.stop()
        self._remove_mount_points()
        if self._log_handler is not None:
            log.removeHandler(self._log_handler)
            self._log_handler.close()
            self._log_handler = None
        if self._error is not None and raise_errors:
            error, self._error = self._error, None
            raise RuntimeError("the node agent failed") from error

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- the node agent's thread

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # reported by start(), check() or stop()
            log.exception("the node agent failed")
            self._error = error
        finally:
            self._ready.set()

    def _base_env(self) -> dict[str, str]:
        assert self.control_plane is not None
        host, port = self.control_plane.kubernetes_service_ip, "443"
        env = {
            "PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "KUBERNETES_SERVICE_HOST": host,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{host}:{port}",
        }
        env.update(self.extra_env)
        return env

    async def _connect(self, user: str, groups: Sequence[str] = ()) -> Kube:
        assert self.control_plane is not None
        return await Kube.connect(self.control_plane.kubeconfig(user, groups))

    async def _main(self) -> None:
        assert self.control_plane is not None
        plane = self.control_plane
        api_port = plane.ports["kube-apiserver"]
        forwarder = await forward(self.gateway, api_port, "127.0.0.1", api_port)
        clients: list[Kube] = []
        changed = asyncio.Event()
        informers: list[Informer] = []
        try:
            admin = await self._connect("voxfleet-e2e-admin", ("system:masters",))
            clients.append(admin)
            await _bind_cluster_role(
                admin, "voxfleet-e2e-provisioner", CLUSTER_ROLE, PROVISIONER_USER
            )
            proxy_api = await self._connect("system:kube-proxy")
            storage_api = await self._connect(PROVISIONER_USER)
            clients += [proxy_api, storage_api]
            services = Informer(proxy_api, "Service", None, changed.set)
            slices = Informer(proxy_api, "EndpointSlice", None, changed.set)
            claims = Informer(storage_api, "PersistentVolumeClaim", None, changed.set)
            volumes = Informer(storage_api, "PersistentVolume", None, changed.set)
            informers = [services, slices, claims, volumes]
            for informer in informers:
                informer.start()
            self.services = ServiceProxies(services, slices, self.network.bridge)
            provisioner = Provisioner(storage_api, claims, volumes, self.workdir / "node")
            # Probes close their connections, as the kubelet's do: a kept-alive probe
            # connection holds up a server's graceful shutdown (tritonserver waits for it).
            async with aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True)
            ) as probe_session:
                cpus = CpuAllocator()
                version = f"v1.35.4-{AGENT_VERSION}"
                nodes = []
                for spec in self.node_specs:
                    api = await self._connect(f"system:node:{spec.name}", ("system:nodes",))
                    clients.append(api)
                    context = NodeContext(
                        name=spec.name,
                        api=api,
                        session=probe_session,
                        network=self.network,
                        host_ip=self.gateway,
                        cpus=cpus,
                        workdir=self.workdir / "node",
                        base_env=self._base_env(),
                        image_paths=self.image_paths,
                        service_hosts=self.services.hosts_entries,
                    )
                    nodes.append(VirtualNode(spec, context, version, changed.set))
                self.agent = NodeAgent(nodes)
                await self.agent.start()
                for informer in informers:
                    await asyncio.wait_for(informer.synced.wait(), 30)
                await _wait_for_default_account(admin)
                self._ready.set()
                try:
                    while not self._stopping.is_set():
                        with contextlib.suppress(asyncio.TimeoutError):
                            await asyncio.wait_for(changed.wait(), 0.5)
                        changed.clear()
                        await self._round(provisioner)
                finally:
                    await self.agent.stop(self.stop_grace_s)
                    await self.services.stop()
        finally:
            for informer in informers:
                await informer.stop()
            for client in clients:
                await client.close()
            forwarder.close()

    async def _round(self, provisioner: Provisioner) -> None:
        assert self.agent is not None and self.services is not None
        for name, step in (
            ("node agent", self.agent.sync()),
            ("service proxy", self.services.sync()),
            ("provisioner", provisioner.sync()),
        ):
            try:
                await step
            except (aiohttp.ClientError, OSError) as error:
                log.warning("%s: %r", name, error)
            except Exception:  # one object's trouble must not stop the node
                log.exception("%s failed", name)

    def _remove_mount_points(self) -> None:
        """Remove the empty mount points pods created on the host, unless another local
        cluster runs (removing a directory detaches the mounts other namespaces have on it)."""
        path = self.workdir / "node" / "created-mount-points"
        if not path.exists() or _other_cluster_running():
            return
        created = sorted(set(path.read_text().split("\n")) - {""}, key=len, reverse=True)
        for item in created:
            with contextlib.suppress(OSError):
                if os.path.isdir(item) and not os.path.ismount(item):
                    os.rmdir(item)
                elif os.path.isfile(item) and os.path.getsize(item) == 0:
                    os.unlink(item)
        path.unlink()


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


def _other_cluster_running() -> bool:
    for slot in range(network_module.SLOTS):
        lock = network_module.LOCK_DIR / f"{slot}.lock"
        if not lock.exists():
            continue
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


__all__ = ["ControlPlaneError", "LocalCluster", "NodeSpec"]
