"""`LocalCluster`: the kubelet, the controllers and the Service proxies of a one-node local
cluster, driven by any Kubernetes API server URL, in a background thread of their own.

    with LocalCluster(api_url, tmp_path) as cluster:   # or `async with`, or start()/stop()
        ...  # create Deployments, Jobs, Services, Secrets, ConfigMaps through the API
        cluster.resolve("joe-tts.default.svc:8001")    # -> "127.77.0.1:8001", from the host
        cluster.endpoints("default", "joe-tts", 8001)  # -> ["10.213.0.2:8001", ...]
        cluster.logs("voxfleet-triton-cpu-...", "triton")  # the container's output so far
        cluster.container_pid(namespace, pod, container)   # its main process, to kill it
        cluster.pod_processes(namespace, pod)              # every process of the pod
        cluster.gateway, cluster.api_url_for_pods          # the host and the API, from pods

Each control loop round (every `tick_s`) lists Pods, Deployments, Jobs and Services and runs,
in order: garbage collection of orphaned pods, the Deployment and Job controllers, the kubelet
and the Service proxies. Pod output goes to `<workdir>/logs/<pod>_<container>.log`.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import ssl
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from . import network as network_module
from .api import KubeApi
from .cpus import CpuAllocator
from .deployments import reconcile_deployment
from .forward import forward
from .gc import collect_orphan_pods
from .jobs import JobController
from .kubelet import Kubelet
from .network import PodNetwork
from .node import Node
from .pki import make_api_certificates
from .services import ServiceProxies

log = logging.getLogger("cluster")
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def default_image_paths() -> list[str]:
    """The files that stand for every container's image: the project (its sources, `.venv`
    and `.tools`) and the Python that runs it, outermost directories only."""
    project = Path(__file__).resolve().parents[2]
    found = {str(Path(p).resolve()) for p in (project, sys.prefix, sys.base_prefix)}
    return sorted(p for p in found if not any(p.startswith(q + "/") for q in found))


class LocalCluster:
    """A one-node cluster of real processes for the API server at `api_url`.

    `token`: the bearer token for the API, also the pods' service-account token
    (default: "local-cluster").
    `ca_cert`: PEM for the pods' service-account `ca.crt` (default: the CA of the cluster's
    own https://kubernetes.default.svc, see forward.py).
    `env`: extra variables every container starts with (as an image's ENV).
    `stop_grace_s`: at stop(), the longest any pod gets between SIGTERM and SIGKILL.
    `image_paths`: host directories that stand for the image's own files (default: the
    project and its Python, `default_image_paths()`); a volume mounted above one of them
    (an emptyDir at /tmp over a checkout in /tmp) leaves it in place, as a real image keeps
    its files outside its volumes.
    """

    def __init__(
        self,
        api_url: str,
        workdir: Path | str,
        *,
        token: str | None = None,
        ca_cert: bytes = b"",
        env: dict[str, str] | None = None,
        tick_s: float = 0.2,
        job_backoff_s: float = 1.0,
        stop_grace_s: float = 5.0,
        image_paths: list[str] | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.workdir = Path(workdir).absolute()
        self.token = token
        self.ca_cert = ca_cert
        self.extra_env = dict(env or {})
        self.tick_s = tick_s
        self.job_backoff_s = job_backoff_s
        self.stop_grace_s = stop_grace_s
        self.image_paths = default_image_paths() if image_paths is None else list(image_paths)
        self.network = PodNetwork()
        self.services: ServiceProxies | None = None
        self.kubelet: Kubelet | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._error: BaseException | None = None

    # -- public API

    @property
    def gateway(self) -> str:
        """The host's address on the pod bridge (pods reach the host, and the API, here)."""
        return self.network.gateway

    @property
    def api_url_for_pods(self) -> str:
        """The API server with its own scheme as pods reach it, on the gateway address. Pods
        also reach it in-cluster at https://kubernetes.default.svc (KUBERNETES_SERVICE_HOST,
        the service account's token and ca.crt)."""
        parts = urlsplit(self.api_url)
        return f"{parts.scheme}://{self.gateway}:{parts.port or 443}"

    def resolve(self, address: str) -> str:
        """"name.namespace.svc:port" -> "127.77.k.n:port", the Service's proxy on the host."""
        if self.services is None:
            raise RuntimeError("the cluster is not running")
        return self.services.resolve(address)

    def cluster_ip(self, namespace: str, service: str) -> str | None:
        """The address pods reach a Service at (its name resolves to it in pods)."""
        return self.services.cluster_ip(namespace, service) if self.services else None

    def endpoints(self, namespace: str, service: str, port: int) -> list[str]:
        """"podIP:targetPort" of the Ready pods behind a Service port (headless or not), as
        the Service's Endpoints would list them (e.g. for Prometheus scrape targets)."""
        if self.services is None:
            return []
        return [f"{ip}:{target}" for ip, target in self.services.backends(namespace, service, port)]

    def container_pid(self, namespace: str, pod_name: str, container: str) -> int | None:
        """The pid of a running container's main process (to kill it, as a crash would)."""
        runtime = self.kubelet.runtime(namespace, pod_name) if self.kubelet else None
        for item in runtime.containers if runtime else []:
            process = item.process
            if item.name == container and process is not None and process.returncode is None:
                return process.pid
        return None

    def pod_processes(self, namespace: str, pod_name: str) -> list[int]:
        """Pids of every process running in a pod (its network namespace's)."""
        runtime = self.kubelet.runtime(namespace, pod_name) if self.kubelet else None
        if runtime is None or not runtime.netns:
            return []
        return network_module.namespace_pids(runtime.netns)

    def log_path(self, pod_name: str, container: str) -> Path:
        return self.workdir / "logs" / f"{pod_name}_{container}.log"

    def logs(self, pod_name: str, container: str) -> str:
        path = self.log_path(pod_name, container)
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> LocalCluster:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="local-cluster", daemon=True)
        self._thread.start()
        self._ready.wait(60)
        if self._error is not None:
            self._thread.join(30)
            raise RuntimeError("the local cluster failed to start") from self._error
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(self.stop_grace_s + 60)
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError("the local cluster failed") from error

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    async def __aenter__(self) -> LocalCluster:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, kind: type[BaseException] | None, value: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)

    # -- the background thread

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:  # reported by start() or stop()
            log.exception("local cluster failed")
            self._error = error
        finally:
            self._ready.set()

    def _base_env(self) -> dict[str, str]:
        port = "443"
        env = {
            "PATH": f"{Path(sys.executable).parent}:{SYSTEM_PATH}",
            "HOME": "/root",
            "LANG": "C.UTF-8",
            "KUBERNETES_SERVICE_HOST": self.gateway,
            "KUBERNETES_SERVICE_PORT": port,
            "KUBERNETES_SERVICE_PORT_HTTPS": port,
            "KUBERNETES_PORT": f"tcp://{self.gateway}:{port}",
        }
        env.update(self.extra_env)
        return env

    async def _main(self) -> None:
        await asyncio.to_thread(self.network.start)
        servers: list[asyncio.Server] = []
        try:
            parts = urlsplit(self.api_url)
            host, port = parts.hostname or "127.0.0.1", parts.port or 443
            upstream = None
            if parts.scheme == "https":  # the local API server's own certificate
                upstream = ssl.create_default_context()
                upstream.check_hostname = False
                upstream.verify_mode = ssl.CERT_NONE
            servers.append(await forward(self.gateway, port, host, port))
            ca_crt, crt, key = await asyncio.to_thread(
                make_api_certificates, self.workdir / "pki", self.gateway
            )
            serving = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            serving.load_cert_chain(crt, key)
            if port != 443 or parts.scheme == "https":
                servers.append(await forward(self.gateway, 443, host, port, serving, upstream))
            self.ca_cert = self.ca_cert or ca_crt.read_bytes()
            # Probes close their connections, as the kubelet's do: a kept-alive probe
            # connection holds up a server's graceful shutdown (tritonserver waits for it).
            connector = aiohttp.TCPConnector(force_close=True)
            async with aiohttp.ClientSession() as session, aiohttp.ClientSession(
                connector=connector
            ) as probe_session:
                api = KubeApi(session, self.api_url, self.token)
                node = Node(
                    api=api, session=probe_session, network=self.network, cpus=CpuAllocator(),
                    workdir=self.workdir, base_env=self._base_env(),
                    image_paths=self.image_paths,
                    service_account={"token": (self.token or "local-cluster").encode(),
                                     "ca.crt": self.ca_cert},
                )
                self.kubelet = Kubelet(node)
                self.services = ServiceProxies(self.network.slot, self.network.bridge)
                node.service_hosts = self.services.hosts_entries
                jobs = JobController(api, self.job_backoff_s)
                self._ready.set()
                try:
                    while not self._stopping.is_set():
                        await self._round(api, jobs)
                        await asyncio.sleep(self.tick_s)
                finally:
                    await self.kubelet.stop(self.stop_grace_s)
                    await self.services.stop()
        finally:
            for server in servers:
                server.close()
            await asyncio.to_thread(self.network.stop)
            self._remove_mount_points()

    async def _round(self, api: KubeApi, jobs: JobController) -> None:
        assert self.kubelet is not None and self.services is not None
        try:
            pods = await api.list("Pod")
            deployments = [{**d, "kind": "Deployment"} for d in await api.list("Deployment")]
            job_list = [{**j, "kind": "Job"} for j in await api.list("Job")]
            services = await api.list("Service")
        except (aiohttp.ClientError, OSError, RuntimeError) as error:
            log.warning("listing from %s: %s", self.api_url, error)
            return
        steps: list[tuple[str, Any]] = [
            ("garbage collection", collect_orphan_pods(api, pods, deployments + job_list)),
            *((f"deployment {d['metadata']['name']}", reconcile_deployment(api, d, pods))
              for d in deployments),
            *((f"job {j['metadata']['name']}", jobs.reconcile(j, pods)) for j in job_list),
            ("kubelet", self.kubelet.sync(pods)),
            ("services", self.services.sync(services, pods)),
        ]
        for name, step in steps:
            try:
                await step
            except (aiohttp.ClientError, OSError) as error:
                log.warning("%s: %r", name, error)
            except Exception:  # one object's trouble must not stop the node
                log.exception("%s failed", name)
        try:
            self.kubelet.update_hosts()
        except OSError as error:
            log.warning("hosts files: %r", error)

    def _remove_mount_points(self) -> None:
        """Remove the empty mount points pods created on the host, unless another local
        cluster runs (removing a directory detaches the mounts other namespaces have on it)."""
        path = self.workdir / "created-mount-points"
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
