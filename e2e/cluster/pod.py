"""One pod on the local node: sandbox (network namespace, CPU set, volumes), containers in
order (init containers one by one, then the others together), status, and termination.

Before the containers start, the pod's references are read as its node may read them (the
Node authorizer allows a node what its own pods name, one object at a time): Secrets and
ConfigMaps by name, each claim's PersistentVolume (its hostPath is the volume), and a token
from the TokenRequest API for every projected `serviceAccountToken` source (the API server's
ServiceAccount admission adds one, with the `kube-root-ca.crt` ConfigMap, to every pod). A
reference that is missing keeps the containers waiting (CreateContainerConfigError) and is
read again each second, as the kubelet retries.

Status is written to the pod's `status` subresource with a strategic merge patch (conditions
by type, so the scheduler's PodScheduled stays): phase, Initialized, ContainersReady, Ready,
podIP(s), hostIP(s), startTime and every container's state.

Deletion as the kubelet does it: the pod leaves its Services' endpoints at once (Ready False),
then each container runs its preStop hook, gets SIGTERM, and SIGKILL when the grace period
(`deletionGracePeriodSeconds`, else `terminationGracePeriodSeconds`, default 30) ends; then the
sandbox is torn down and the pod object deleted for good with a zero grace period (the
final delete, preconditioned on the pod's uid), which is what removes it from the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp

from .container import Container
from .cpus import pod_cpu_request
from .env import ConfigError, container_argv, container_env
from .kube import STRATEGIC_MERGE_PATCH, ApiError
from .node import NodeContext
from .objects import now
from .volumes import PodVolumes, TokenKey, pod_references

Obj = dict[str, Any]
log = logging.getLogger("cluster.node")
FINAL_STATUS_S = 60.0


def grace_seconds(pod: Obj) -> float:
    meta_grace = pod["metadata"].get("deletionGracePeriodSeconds")
    if meta_grace is not None:
        return float(meta_grace)
    return float(pod["spec"].get("terminationGracePeriodSeconds", 30))


class PodRuntime:
    def __init__(self, node: NodeContext, pod: Obj) -> None:
        self.node = node
        self.pod = pod
        meta = pod["metadata"]
        self.uid: str = meta["uid"]
        self.namespace: str = meta.get("namespace") or "default"
        self.name: str = meta["name"]
        self.netns = ""
        self.ip = ""
        self.cpus: list[int] = []
        self.init_containers: list[Container] = []
        self.containers: list[Container] = []
        self.initialized = False
        self.phase = "Pending"
        self.waiting: Obj | None = None  # why containers cannot start yet
        self.terminating = False
        self.grace_s = grace_seconds(pod)
        self.pre_stop = True
        self._terminate = asyncio.Event()
        self._dirty = asyncio.Event()
        self._published: Obj | None = None
        self._final = False  # the pod's life is over: its next status is its last
        self._conditions: dict[str, Obj] = {}
        self.start_time = ""
        self.volumes: PodVolumes | None = None
        self.task: asyncio.Task[None] | None = None

    # -- what the kubelet calls

    def start(self) -> None:
        self.task = asyncio.ensure_future(self._run())

    def request_termination(self, grace_s: float, pre_stop: bool = True) -> None:
        if not self.terminating:
            self.terminating = True
            self.grace_s, self.pre_stop = grace_s, pre_stop
            for container in self.init_containers + self.containers:
                container.terminating = True
                container.ready = False
            self._terminate.set()
            self.changed()

    def update_hosts(self) -> None:
        """Rewrite /etc/hosts in place (the containers see the bind-mounted file change)."""
        if self.volumes is None or self.terminating:
            return
        text = self.volumes.hosts_base + self.node.service_hosts(self.namespace)
        path = self.volumes.hosts_path
        if path.exists() and path.read_text() != text:
            with open(path, "r+") as handle:
                handle.write(text)
                handle.truncate()

    def kill(self) -> None:
        """SIGKILL every process of the pod now."""
        for container in self.init_containers + self.containers:
            container.kill()

    def changed(self) -> None:
        self._dirty.set()

    # -- the pod's life

    async def _run(self) -> None:
        publisher = asyncio.ensure_future(self._publish_loop())
        try:
            await self._live()
        except Exception:
            log.exception("pod %s/%s failed in the kubelet", self.namespace, self.name)
        finally:
            # The last status (a finished pod's phase) must reach the API: the Job and
            # ReplicaSet controllers act on it. The one publisher sends it, retrying.
            self._final = True
            self.changed()
            try:
                await asyncio.wait_for(publisher, FINAL_STATUS_S)
            except asyncio.TimeoutError:
                log.error(
                    "pod %s/%s: its last status was not written in %g s",
                    self.namespace,
                    self.name,
                    FINAL_STATUS_S,
                )
            await self._teardown()

    async def _live(self) -> None:
        self.netns, self.ip = await asyncio.to_thread(self.node.network.add_pod, self.uid)
        self.cpus = self.node.cpus.allocate(self.uid, pod_cpu_request(self.pod))
        self.start_time = now()
        self.changed()
        if not await self._prepare():
            return
        tasks: list[asyncio.Future[None]] = []
        for container in self.init_containers:
            await self._race(container.run())
            if self.terminating:
                break
            if container.exit_code != 0:
                self.phase = "Failed"
                self.changed()
                return
        else:
            self.initialized = True
            self.changed()
            tasks = [asyncio.ensure_future(c.run()) for c in self.containers]
            await self._race(asyncio.gather(*tasks))
        if self.terminating:
            await asyncio.gather(
                *(
                    c.stop(self.grace_s, self.pre_stop)
                    for c in self.containers + self.init_containers
                )
            )
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            return
        codes = [c.exit_code for c in self.containers]
        self.phase = "Succeeded" if all(code == 0 for code in codes) else "Failed"
        self.changed()

    async def _race(self, work: Any) -> None:
        """Wait for `work`, or for termination to be asked (work goes on; stop() ends it)."""
        future = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self._terminate.wait())
        await asyncio.wait({future, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()

    async def _prepare(self) -> bool:
        """Volumes, env and argv of every container; retried while references are missing."""
        while not self.terminating:
            try:
                secrets, config_maps, claims, tokens = await self._read_references()
                self._build(secrets, config_maps, claims, tokens)
                self.waiting = None
                return True
            except ConfigError as error:
                self.waiting = {"reason": "CreateContainerConfigError", "message": str(error)}
                self.changed()
            except ApiError as error:
                log.warning("pod %s/%s: %s", self.namespace, self.name, error)
            await asyncio.sleep(1.0)
        return False

    async def _read_references(
        self,
    ) -> tuple[dict[str, Obj], dict[str, Obj], dict[str, str], dict[TokenKey, bytes]]:
        api, namespace = self.node.api, self.namespace
        wanted = pod_references(self.pod)
        secrets, config_maps, claims = {}, {}, {}
        for name in wanted.secrets:
            if (secret := await api.get("Secret", namespace, name)) is not None:
                secrets[name] = secret
        for name in wanted.config_maps:
            if (config_map := await api.get("ConfigMap", namespace, name)) is not None:
                config_maps[name] = config_map
        for name in wanted.claims:
            claim = await api.get("PersistentVolumeClaim", namespace, name)
            volume_name = ((claim or {}).get("spec") or {}).get("volumeName")
            if not claim or not volume_name:
                raise ConfigError(f'persistentvolumeclaim "{name}" is not bound')
            volume = await api.get("PersistentVolume", None, volume_name)
            path = (((volume or {}).get("spec") or {}).get("hostPath") or {}).get("path")
            if not path:
                raise ConfigError(f'persistentvolume "{volume_name}" has no hostPath here')
            claims[name] = path
        tokens = {}
        account = self.pod["spec"].get("serviceAccountName") or "default"
        for audience, seconds in wanted.tokens:
            spec: Obj = {
                "expirationSeconds": seconds,
                "boundObjectRef": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": self.name,
                    "uid": self.uid,
                },
            }
            if audience:
                spec["audiences"] = [audience]
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": spec,
            }
            answer = await api.create("ServiceAccount", namespace, request, "token", account)
            tokens[(audience, seconds)] = answer["status"]["token"].encode()
        return secrets, config_maps, claims, tokens

    def _build(
        self,
        secrets: dict[str, Obj],
        config_maps: dict[str, Obj],
        claims: dict[str, str],
        tokens: dict[TokenKey, bytes],
    ) -> None:
        pod = dict(self.pod)
        pod["status"] = {"podIP": self.ip, "podIPs": [{"ip": self.ip}], "hostIP": self.node.host_ip}
        volumes = PodVolumes(
            self.node.workdir,
            pod,
            secrets,
            config_maps,
            claims,
            tokens,
            self.node.service_hosts(self.namespace),
        )
        volumes.prepare()
        self.volumes = volumes
        pod_dir = volumes.pod_dir
        pod_dir.mkdir(parents=True, exist_ok=True)
        self.node.log_dir.mkdir(parents=True, exist_ok=True)
        base = dict(self.node.base_env)
        base["HOSTNAME"] = self.name
        policy = self.pod["spec"].get("restartPolicy", "Always")
        built: dict[str, list[Container]] = {"initContainers": [], "containers": []}
        for field in built:
            for spec in self.pod["spec"].get(field) or []:
                env, defined = container_env(pod, spec, secrets, config_maps, base)
                launch = {
                    "argv": container_argv(spec, defined),
                    "env": env,
                    "mounts": volumes.mounts(spec),
                    "image_paths": self.node.image_paths,
                    "cpus": self.cpus,
                    "working_dir": spec.get("workingDir", ""),
                    "created_file": str(self.node.created_file),
                    "hostname": self.name,
                    "grace_s": self.grace_s,
                }
                restart = (
                    policy
                    if field == "containers"
                    else ("Never" if policy == "Never" else "OnFailure")
                )
                built[field].append(
                    Container(
                        spec,
                        restart,
                        self.netns,
                        self.ip,
                        self.name,
                        pod_dir,
                        launch,
                        self.changed,
                        self.node.session,
                        self.node.log_dir,
                    )
                )
        self.init_containers, self.containers = built["initContainers"], built["containers"]

    async def _teardown(self) -> None:
        if self.netns:
            await asyncio.to_thread(self.node.network.remove_pod, self.uid)
        self.node.cpus.release(self.uid)
        if self.terminating:
            await final_delete(self.node, self.namespace, self.name, self.uid)

    async def _publish_loop(self) -> None:
        """The only writer of the pod's status: one PATCH at a time, each change written,
        a failed write retried; it ends once the final status (after `_final`) is written."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self._publish()
            except (ApiError, OSError, aiohttp.ClientError, asyncio.TimeoutError) as error:
                log.warning("pod %s/%s status: %r", self.namespace, self.name, error)
                self._dirty.set()
                await asyncio.sleep(0.5)
                continue
            if self._final and not self._dirty.is_set():
                return

    async def _publish(self) -> None:
        status = self.status()
        if status == self._published:
            return
        await self.node.api.patch(
            "Pod", self.namespace, self.name, {"status": status}, "status", STRATEGIC_MERGE_PATCH
        )
        self._published = status

    # -- status

    def _condition(self, kind: str, value: bool, reason: str = "") -> Obj:
        text = "True" if value else "False"
        previous = self._conditions.get(kind)
        if previous is None or previous["status"] != text:
            previous = {"type": kind, "status": text, "lastTransitionTime": now()}
            if reason:
                previous["reason"] = reason
            self._conditions[kind] = previous
        return previous

    def status(self) -> Obj:
        containers = self.containers
        ready = bool(containers) and all(c.ready for c in containers) and not self.terminating
        phase = self.phase
        if (
            phase == "Pending"
            and self.initialized
            and any(c.started or "running" in c.state or c.restart_count for c in containers)
        ):
            phase = "Running"
        terminal = phase in ("Succeeded", "Failed")
        reason = "PodCompleted" if terminal else ("" if ready else "ContainersNotReady")
        status: Obj = {
            "phase": phase,
            "conditions": [
                self._condition("Initialized", self.initialized or terminal),
                self._condition("ContainersReady", ready, reason),
                self._condition("Ready", ready, reason),
            ],
            "hostIP": self.node.host_ip,
            "hostIPs": [{"ip": self.node.host_ip}],
        }
        if self.ip:
            status.update(podIP=self.ip, podIPs=[{"ip": self.ip}])
        if self.start_time:
            status["startTime"] = self.start_time
        waiting = {"waiting": self.waiting} if self.waiting else None
        status["containerStatuses"] = [c.status() for c in containers] or [
            {
                "name": spec["name"],
                "image": spec.get("image", ""),
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": waiting or {"waiting": {"reason": "ContainerCreating"}},
            }
            for spec in self.pod["spec"].get("containers") or []
        ]
        if self.init_containers:
            status["initContainerStatuses"] = [c.status() for c in self.init_containers]
        return status


async def final_delete(node: NodeContext, namespace: str, name: str, uid: str) -> None:
    """The kubelet's last word on a deleted pod: delete it now, if it is still this pod."""
    try:
        await node.api.delete(
            "Pod",
            namespace,
            name,
            {
                "gracePeriodSeconds": 0,
                "preconditions": {"uid": uid},
            },
        )
    except ApiError as error:
        if error.status != 409:  # 409: a new pod of the same name, not ours to delete
            log.warning("final delete of pod %s/%s: %s", namespace, name, error)
    except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as error:
        log.warning("final delete of pod %s/%s: %r", namespace, name, error)
