"""The node agent: virtual nodes that run the pods the scheduler binds to them as processes.

In the manner of virtual-kubelet, one agent serves several Node objects. For each node it:
- registers the Node (labels, capacity and allocatable, addresses, node info, conditions),
  with its own identity `system:node:<name>` (Node authorizer, NodeRestriction admission);
- renews the node's Lease in `kube-node-lease` every `LEASE_RENEW_S` and reports its status
  conditions every `STATUS_REPORT_S`, so the node lifecycle controller keeps it Ready (and
  lifts the `node.kubernetes.io/not-ready` taint it is created with);
- watches the pods bound to it (`spec.nodeName=<name>`) and runs each one as rendered
  (pod.py: network namespace, CPU set, volumes, env, probes, restarts, preStop, grace),
  writing its status; a pod being deleted is stopped and then deleted for good (the final,
  zero-grace delete); a pod removed from the API without that (forced) is killed.

The nodes share the host: one pod bridge and network (network.py), one CPU allocator
(cpus.py), one address (the bridge's gateway, reported as every node's InternalIP and as
pods' hostIP). A node's capacity is what it is configured to advertise, not measured: the
scheduler places pods by it, and CPU requests still become real CPU sets on the host's cores.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
import os
import platform
from collections.abc import Callable
from typing import Any

import aiohttp

from .kube import ApiError, Informer, Kube
from .node import NodeContext
from .objects import is_deleting
from .pod import PodRuntime, final_delete, grace_seconds

Obj = dict[str, Any]
log = logging.getLogger("cluster.node")
LEASE_DURATION_S = 40
LEASE_RENEW_S = 10.0
STATUS_REPORT_S = 30.0
AGENT_VERSION = "voxfleet-node-agent"


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """A node the agent registers: what it advertises to the scheduler."""

    name: str
    cpu: str = "4"
    memory: str = "16Gi"
    pods: int = 110
    labels: dict[str, str] = dataclasses.field(default_factory=dict)


def micro_time() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_object(spec: NodeSpec, address: str, kubelet_version: str) -> Obj:
    resources = {
        "cpu": spec.cpu,
        "memory": spec.memory,
        "pods": str(spec.pods),
        "ephemeral-storage": "100Gi",
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64" if platform.machine() == "x86_64" else "arm64",
                "type": "voxfleet-node-agent",
                **spec.labels,
            },
        },
        "spec": {},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": spec.name},
            ],
            "nodeInfo": {
                "kubeletVersion": kubelet_version,
                "operatingSystem": "linux",
                "architecture": "amd64" if platform.machine() == "x86_64" else "arm64",
                "containerRuntimeVersion": f"{AGENT_VERSION}://processes",
                "kernelVersion": platform.release(),
                "osImage": "host",
                "machineID": "",
                "systemUUID": "",
                "bootID": "",
                "kubeProxyVersion": "",
            },
            "conditions": node_conditions(),
        },
    }


def node_conditions() -> list[Obj]:
    now = micro_time()[:19] + "Z"

    def condition(kind: str, status: str, reason: str, message: str) -> Obj:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return [
        condition("Ready", "True", "AgentReady", "the node agent runs pods"),
        condition("MemoryPressure", "False", "AgentHasSufficientMemory", "not measured"),
        condition("DiskPressure", "False", "AgentHasNoDiskPressure", "not measured"),
        condition("PIDPressure", "False", "AgentHasSufficientPID", "not measured"),
    ]


class VirtualNode:
    """One registered node: its Lease, its status and the pods bound to it."""

    def __init__(
        self,
        spec: NodeSpec,
        context: NodeContext,
        kubelet_version: str,
        on_change: Callable[[], None],
    ) -> None:
        self.spec = spec
        self.context = context
        self.kubelet_version = kubelet_version
        self.pods: dict[str, PodRuntime] = {}
        self.finished: set[str] = set()  # uids of pods that ran to their end here
        self.informer = Informer(
            context.api, "Pod", None, on_change, field_selector=f"spec.nodeName={spec.name}"
        )
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def api(self) -> Kube:
        return self.context.api

    async def register(self) -> None:
        body = node_object(self.spec, self.context.host_ip, self.kubelet_version)
        try:
            await self.api.create("Node", None, body)
        except ApiError as error:
            if error.status != 409:
                raise
            await self._report_status()
        self.informer.start()
        self._tasks = [asyncio.ensure_future(self._heartbeat())]

    async def _report_status(self) -> None:
        await self.api.patch(
            "Node",
            None,
            self.spec.name,
            {"status": {"conditions": node_conditions()}},
            "status",
            "application/strategic-merge-patch+json",
        )

    async def _renew_lease(self) -> None:
        name, namespace = self.spec.name, "kube-node-lease"
        lease = await self.api.get("Lease", namespace, name)
        spec = {
            "holderIdentity": name,
            "leaseDurationSeconds": LEASE_DURATION_S,
            "renewTime": micro_time(),
        }
        if lease is None:
            node = await self.api.get("Node", None, name)
            owner = (
                [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node["metadata"]["uid"]}]
                if node
                else []
            )
            await self.api.create(
                "Lease",
                namespace,
                {"metadata": {"name": name, "ownerReferences": owner}, "spec": spec},
            )
        else:
            lease["spec"].update(spec)
            await self.api.replace("Lease", namespace, name, lease)

    async def _heartbeat(self) -> None:
        reported = 0.0
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._renew_lease()
                if loop.time() - reported >= STATUS_REPORT_S:
                    await self._report_status()
                    reported = loop.time()
            except (ApiError, OSError, aiohttp.ClientError, asyncio.TimeoutError) as error:
                log.warning("node %s heartbeat: %r", self.spec.name, error)
            await asyncio.sleep(LEASE_RENEW_S)

    def runtime(self, namespace: str, name: str) -> PodRuntime | None:
        for runtime in self.pods.values():
            if (runtime.namespace, runtime.name) == (namespace, name):
                return runtime
        return None

    async def sync(self) -> None:
        """Start what is new, stop what is deleted, finish what ended."""
        seen = set()
        for pod in self.informer.items():
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            runtime = self.pods.get(uid)
            if runtime is None:
                if is_deleting(pod):
                    # Deleted before it ran, or after it ran to its end here: nothing runs,
                    # so the deletion can finish now.
                    meta = pod["metadata"]
                    if not _final_sent(pod):
                        await final_delete(self.context, meta["namespace"], meta["name"], uid)
                    continue
                if uid in self.finished:
                    continue
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                runtime = self.pods[uid] = PodRuntime(self.context, pod)
                runtime.start()
            elif is_deleting(pod):
                runtime.request_termination(grace_seconds(pod))
        for uid, runtime in list(self.pods.items()):
            if uid not in seen:
                # Gone from the API without the final delete (a forced deletion): the
                # processes still get SIGTERM and the grace period they had.
                runtime.request_termination(runtime.grace_s)
            if runtime.task is not None and runtime.task.done():
                del self.pods[uid]
                self.finished.add(uid)

    def update_hosts(self) -> None:
        for runtime in self.pods.values():
            runtime.update_hosts()

    async def stop(self, grace_s: float) -> None:
        """Node shutdown: every pod gets SIGTERM and at most `grace_s` (no preStop)."""
        for task in self._tasks:
            task.cancel()
        await self.informer.stop()
        for runtime in self.pods.values():
            runtime.request_termination(min(grace_s, runtime.grace_s), pre_stop=False)
        tasks = [r.task for r in self.pods.values() if r.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=grace_s + 1)
            if pending:  # pods already terminating with a longer grace period
                for runtime in self.pods.values():
                    runtime.kill()
                await asyncio.wait(pending, timeout=15)
        self.pods.clear()


def _final_sent(pod: Obj) -> bool:
    return pod["metadata"].get("deletionGracePeriodSeconds") == 0


class NodeAgent:
    """The virtual nodes of one host; `sync()` runs whenever a watched pod changes."""

    def __init__(self, nodes: list[VirtualNode]) -> None:
        self.nodes = nodes
        self.changed = asyncio.Event()

    async def start(self) -> None:
        for node in self.nodes:
            await node.register()

    def runtime(self, namespace: str, name: str) -> PodRuntime | None:
        for node in self.nodes:
            found = node.runtime(namespace, name)
            if found is not None:
                return found
        return None

    async def sync(self) -> None:
        for node in self.nodes:
            try:
                await node.sync()
            except (ApiError, OSError, aiohttp.ClientError, asyncio.TimeoutError) as error:
                log.warning("node %s: %r", node.spec.name, error)
            except Exception:  # one pod's trouble must not stop the node
                log.exception("node %s failed to sync", node.spec.name)
        for node in self.nodes:
            with contextlib.suppress(OSError):
                node.update_hosts()

    async def stop(self, grace_s: float) -> None:
        await asyncio.gather(*(node.stop(grace_s) for node in self.nodes))


def host_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
