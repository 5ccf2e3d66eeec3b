"""The local node's kubelet: runs every pod the API holds, as real processes (see pod.py).

There is one node and no scheduler: every pod is run here, whatever its nodeName,
nodeSelector, tolerations or resources say (GPU requests included); `spec.nodeName` is not
set, and `status.hostIP` is the bridge's gateway address.
"""

from __future__ import annotations

import asyncio
from typing import Any

from .node import Node
from .objects import is_deleting
from .pod import FINALIZER, PodRuntime, grace_seconds

Obj = dict[str, Any]


class Kubelet:
    def __init__(self, node: Node) -> None:
        self.node = node
        self.pods: dict[str, PodRuntime] = {}

    def runtime(self, namespace: str, name: str) -> PodRuntime | None:
        for runtime in self.pods.values():
            if (runtime.namespace, runtime.name) == (namespace, name):
                return runtime
        return None

    async def sync(self, pods: list[Obj]) -> None:
        seen = set()
        for pod in pods:
            uid = pod["metadata"].get("uid")
            if not uid:
                continue
            seen.add(uid)
            runtime = self.pods.get(uid)
            if runtime is None:
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    continue
                if is_deleting(pod):
                    await self._release(pod)  # deleted before it ever ran here
                    continue
                runtime = self.pods[uid] = PodRuntime(self.node, pod)
                runtime.start()
            elif is_deleting(pod):
                runtime.request_termination(grace_seconds(pod))
        for uid, runtime in list(self.pods.items()):
            if uid not in seen:
                # Gone from the API without a graceful deletion (e.g. garbage-collected by
                # the emulator): the processes still get preStop, SIGTERM and the grace period.
                runtime.request_termination(runtime.grace_s)
                if runtime.task is not None and runtime.task.done():
                    del self.pods[uid]

    def update_hosts(self) -> None:
        for runtime in self.pods.values():
            runtime.update_hosts()

    async def _release(self, pod: Obj) -> None:
        finalizers = list(pod["metadata"].get("finalizers") or [])
        if FINALIZER in finalizers:
            finalizers.remove(FINALIZER)
            meta = pod["metadata"]
            await self.node.api.patch(
                "Pod", meta.get("namespace") or "default", meta["name"],
                {"metadata": {"finalizers": finalizers}},
            )

    async def stop(self, grace_s: float) -> None:
        """Node shutdown: every pod gets SIGTERM and at most `grace_s` (no preStop)."""
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
