"""The Deployment controller, without the ReplicaSet layer.

Pods are created straight from `spec.template`, named `<deployment>-<pod-template-hash>-<5
random>`, labelled `pod-template-hash` and owned (controller reference) by the Deployment
itself; no ReplicaSet objects exist. Otherwise the documented behaviour:
- `spec.replicas` missing means 1 (the API server's default);
- RollingUpdate (the default; maxSurge and maxUnavailable default to 25 %, surge rounded up,
  unavailable down, both 0 means maxUnavailable 1): new pods are added while the total stays
  within replicas + maxSurge; old pods are removed, unready ones first, while the available
  pods stay at least replicas - maxUnavailable (so with maxUnavailable 0 a new pod is Ready
  before an old one is deleted);
- Recreate: every old pod is gone before a new one is created;
- scaling removes unready pods first, then the newest;
- status: observedGeneration, replicas, updatedReplicas, readyReplicas, availableReplicas,
  unavailableReplicas and the Available and Progressing conditions.
`minReadySeconds`, `progressDeadlineSeconds`, `paused` and revision history are not
emulated: a pod is available as soon as it is Ready.
"""

from __future__ import annotations

from typing import Any

from .api import KubeApi
from .objects import (
    is_deleting,
    is_ready,
    key,
    now,
    owned_by,
    owner_reference,
    random_suffix,
    scaled_value,
    template_hash,
)

Obj = dict[str, Any]
HASH_LABEL = "pod-template-hash"


def _active(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase")
    return not is_deleting(pod) and phase not in ("Succeeded", "Failed")


def _removal_order(pods: list[Obj]) -> list[Obj]:
    """Unready before ready, then newest first."""
    newest_first = sorted(
        pods,
        key=lambda p: (p["metadata"].get("creationTimestamp", ""), p["metadata"]["name"]),
        reverse=True,
    )
    return sorted(newest_first, key=is_ready)


def new_pod(deployment: Obj, pod_hash: str) -> Obj:
    template = deployment["spec"]["template"]
    meta = template.get("metadata") or {}
    name = deployment["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{pod_hash}-{random_suffix()}",
            "labels": {**(meta.get("labels") or {}), HASH_LABEL: pod_hash},
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(deployment, "Deployment", "apps/v1")],
        },
        "spec": template["spec"],
    }


async def reconcile_deployment(api: KubeApi, deployment: Obj, pods: list[Obj]) -> None:
    if is_deleting(deployment):
        return
    namespace, _ = key(deployment)
    spec = deployment["spec"]
    desired = int(spec.get("replicas", 1))
    pod_hash = template_hash(spec["template"])
    owned = [p for p in pods if owned_by(p, deployment) and _active(p)]
    new = [p for p in owned if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == pod_hash]
    old = [p for p in owned if p not in new]
    strategy = spec.get("strategy") or {}

    async def create(count: int) -> None:
        for _ in range(count):
            await api.create("Pod", namespace, new_pod(deployment, pod_hash))

    async def delete(victims: list[Obj]) -> None:
        for pod in victims:
            await api.delete("Pod", namespace, pod["metadata"]["name"])

    max_unavailable = 0
    if strategy.get("type") == "Recreate":
        terminating_old = [
            p for p in pods if owned_by(p, deployment) and is_deleting(p)
            and (p["metadata"].get("labels") or {}).get(HASH_LABEL) != pod_hash
        ]
        if old:
            await delete(old)
        elif not terminating_old:
            await _scale(new, desired, create, delete)
    else:
        rolling = strategy.get("rollingUpdate") or {}
        surge = scaled_value(rolling.get("maxSurge", "25%"), desired, round_up=True)
        max_unavailable = scaled_value(rolling.get("maxUnavailable", "25%"), desired, False)
        if surge == 0 and max_unavailable == 0:
            max_unavailable = 1
        if not old:
            await _scale(new, desired, create, delete)
        else:
            room = desired + surge - len(owned)
            wanted_new = min(desired, len(new) + max(0, room))
            await create(wanted_new - len(new))
            min_available = desired - max_unavailable
            new_unavailable = sum(not is_ready(p) for p in new)
            budget = len(owned) - min_available - new_unavailable
            unhealthy = [p for p in old if not is_ready(p)][: max(0, budget)]
            await delete(unhealthy)
            healthy = [p for p in old if is_ready(p)]
            available = sum(is_ready(p) for p in new) + len(healthy)
            await delete(_removal_order(healthy)[: max(0, available - min_available)])
    await _publish_status(api, deployment, owned, new, desired, max_unavailable)


async def _scale(pods: list[Obj], desired: int, create: Any, delete: Any) -> None:
    if len(pods) < desired:
        await create(desired - len(pods))
    elif len(pods) > desired:
        await delete(_removal_order(pods)[: len(pods) - desired])


def _condition(previous: Obj, kind: str, value: bool, reason: str, message: str) -> Obj:
    status = "True" if value else "False"
    for item in previous.get("conditions") or []:
        if item.get("type") == kind and item.get("status") == status:
            changed = item.get("reason") != reason
            return {**item, "reason": reason, "message": message,
                    "lastUpdateTime": now() if changed else item.get("lastUpdateTime", now())}
    stamp = now()
    return {"type": kind, "status": status, "reason": reason, "message": message,
            "lastTransitionTime": stamp, "lastUpdateTime": stamp}


async def _publish_status(
    api: KubeApi, deployment: Obj, owned: list[Obj], new: list[Obj], desired: int,
    max_unavailable: int,
) -> None:
    namespace, name = key(deployment)
    previous = deployment.get("status") or {}
    ready = sum(is_ready(p) for p in owned)
    complete = len(new) == desired == len(owned) and all(is_ready(p) for p in new)
    available = ready >= desired - max_unavailable
    status = {
        "observedGeneration": deployment["metadata"].get("generation", 1),
        "replicas": len(owned),
        "updatedReplicas": len(new),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "unavailableReplicas": max(0, len(owned) - ready),
        "conditions": [
            _condition(previous, "Available", available,
                       "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
                       "Deployment has minimum availability." if available
                       else "Deployment does not have minimum availability."),
            _condition(previous, "Progressing", True,
                       "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
                       f'Pods of template hash "{template_hash(deployment["spec"]["template"])}" '
                       + ("are available." if complete else "are progressing.")),
        ],
    }
    if any(previous.get(k) != v for k, v in status.items() if k != "conditions") or [
        (c["type"], c["status"], c["reason"]) for c in status["conditions"]
    ] != [(c.get("type"), c.get("status"), c.get("reason"))
          for c in previous.get("conditions") or []]:
        await api.patch("Deployment", namespace, name, {"status": status}, "status")
