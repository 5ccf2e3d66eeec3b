"""Garbage collection of pods whose owners are gone, as Kubernetes' garbage collector does
(background propagation): a pod whose every ownerReference names a Deployment or Job that no
longer exists (or exists with another uid) is deleted, gracefully. Owners of other kinds are
left to the API server (the harness's emulator collects every kind on DELETE).
"""

from __future__ import annotations

from typing import Any

from .api import KubeApi
from .objects import is_deleting, key

Obj = dict[str, Any]
COLLECTED_OWNER_KINDS = ("Deployment", "Job")


async def collect_orphan_pods(api: KubeApi, pods: list[Obj], owners: list[Obj]) -> None:
    alive = {(o.get("kind"), *key(o), o["metadata"].get("uid")) for o in owners}
    for pod in pods:
        refs = pod["metadata"].get("ownerReferences") or []
        if not refs or is_deleting(pod):
            continue
        if any(ref.get("kind") not in COLLECTED_OWNER_KINDS for ref in refs):
            continue
        namespace, name = key(pod)
        if not any(
            (ref.get("kind"), namespace, ref.get("name"), ref.get("uid")) in alive for ref in refs
        ):
            await api.delete("Pod", namespace, name)
