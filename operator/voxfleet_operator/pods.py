"""Pool pods: load a voice onto the ready ones through Triton, label them, unload on exit."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from voxfleet_operator import loading
from voxfleet_operator.context import PODS, Runtime
from voxfleet_operator.names import pool_selector, serving_label
from voxfleet_operator.placement import (
    MARGIN_MIB,
    PodRoom,
    place_voice,
    pods_for_memory,
    voice_size_mib,
)
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.voice_plan import serving_plan

LOADED_PREFIX = "loaded.voxfleet.io/"
# A load Triton refused is tried again after 5 s, 10 s, 20 s ... at most every 5 minutes.
LOAD_RETRY_FIRST_SECONDS = 5.0
LOAD_RETRY_MAX_SECONDS = 300.0


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _http_port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                return int(port["containerPort"])
    return 8000


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


def pod_load_marker(digest: str, pod: Mapping[str, Any]) -> str:
    """What a pod's annotation must say for the voice to count as loaded on it now.

    A restarted Triton container has lost its loaded models although the pod keeps its
    labels, so the restart count is part of the marker.
    """
    return f"{digest}.r{_restarts(pod)}"


def pods_failing_voice(pods: Sequence[Mapping[str, Any]], voice: str) -> list[str]:
    """Pods that had the voice loaded and are not ready now, one message each.

    A pool pod's readiness (`voxfleet triton`'s supervisor) fails while one of its voices
    cannot serve: its backend process died and the server is being restarted, or a restart
    could not bring it back (then the container restarts).
    """
    failing = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        had_voice = (meta.get("labels") or {}).get(serving_label(voice)) == "true"
        if had_voice and not pod_ready(pod) and not meta.get("deletionTimestamp"):
            failing.append(
                f"pod {meta.get('name')}: voice {voice} cannot serve there now (its backend "
                "is being restarted, or failed)"
            )
    return failing


@dataclass(frozen=True)
class PodSync:
    """What `sync_pods` found and did: ready pods, pods serving the voice, load errors, pods
    where the voice was loaded and cannot serve now, and where memory fell short."""

    ready: int
    serving: int
    errors: list[str]
    failing: list[str]
    shortfall: MemoryShortfall | None = None


async def pod_rooms(rt: Runtime, ready: Sequence[Mapping[str, Any]]) -> dict[str, PodRoom]:
    """The ready pods' memory, by pod name, for those that report it."""
    rooms = {}
    for pod in ready:
        report = await rt.pod_memory(pod)
        if report is not None:
            try:
                rooms[pod["metadata"]["name"]] = PodRoom.from_report(
                    pod["metadata"]["name"], report
                )
            except (KeyError, TypeError, ValueError):
                continue
    return rooms


async def sync_pods(rt: Runtime, voice: Voice, pool: Pool, key: str, engine_ready: bool) -> PodSync:
    """Load the voice on the ready pool pods it is placed on (all of them where it fits, or
    `spec.replicas` of them) and leave the others."""
    pods = await rt.pool_pods(voice.namespace, pool_selector(pool.name))
    failing = pods_failing_voice(pods, voice.name)
    body = loading.load_request(serving_plan(voice.name, voice.spec, pool, key))
    digest = loading.load_digest(body)
    ready = [p for p in pods if pod_ready(p)]
    rooms = await pod_rooms(rt, ready)
    device = "gpu" if pool.needs_gpu else "cpu"
    need = voice_size_mib(voice.name, rooms.values(), device)
    pending = rt.pending_memory.setdefault((voice.namespace, pool.name), {})
    reserve = sum(size for other, size in pending.items() if other != voice.name)
    placement = place_voice(
        voice.name, ready, voice.spec.replicas, rooms=rooms, need_mib=need, reserve_mib=reserve
    )
    shortfall = None
    if placement.unplaced and ready and engine_ready:
        pending[voice.name] = need
        shortfall = memory_shortfall(voice.name, need, rooms, len(ready), pool.max_pods)
    else:
        pending.pop(voice.name, None)
    rt.memory_pods[(voice.namespace, pool.name)] = pool_memory_pods(rooms, pending)
    serving = 0
    errors: list[str] = []
    for pod in ready:
        if pod["metadata"]["name"] in placement.release:
            error = await unload_from_pod(rt, voice.name, voice.namespace, pod)
            if error is not None:
                errors.append(error)
    for pod in ready:
        if pod["metadata"]["name"] not in placement.serve:
            continue
        meta = pod["metadata"]
        marker = pod_load_marker(digest, pod)
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if (
            annotations.get(LOADED_PREFIX + voice.name) == marker
            and labels.get(serving_label(voice.name)) == "true"
        ):
            serving += 1
            continue
        if not engine_ready:
            continue
        attempt = (voice.namespace, meta["name"], voice.name, marker)
        failures, retry_at, last_error = rt.load_failures.get(attempt, (0, 0.0, ""))
        if time.monotonic() < retry_at:
            errors.append(last_error)
            continue
        try:
            url = f"http://{pod['status']['podIP']}:{_http_port(pod)}"
            key = await rt.repository_key(voice.namespace)
            await loading.load_voice(rt.http, url, voice.name, body, key)
        except Exception as error:  # an import, a refusal or a network error: all reported
            message = f"pod {meta['name']}: {error}"
            delay = min(LOAD_RETRY_FIRST_SECONDS * 2**failures, LOAD_RETRY_MAX_SECONDS)
            rt.load_failures[attempt] = (failures + 1, time.monotonic() + delay, message)
            errors.append(message)
            continue
        rt.load_failures.pop(attempt, None)
        patched = await rt.client.patch(
            PODS,
            voice.namespace,
            meta["name"],
            {
                "metadata": {
                    "labels": {serving_label(voice.name): "true"},
                    "annotations": {LOADED_PREFIX + voice.name: marker},
                }
            },
        )
        rt.cache.seen(PODS.plural, patched)
        serving += 1
    return PodSync(len(ready), serving, errors, failing, shortfall)


@dataclass(frozen=True)
class MemoryShortfall:
    """A voice that fits no ready pod: what it needs, and the most any pod has free."""

    voice: str
    need_mib: float
    best_free_mib: float
    total_mib: float
    ready_pods: int
    max_pods: int

    @property
    def at_max_pods(self) -> bool:
        return self.ready_pods >= self.max_pods

    def message(self) -> str:
        pods = f"{self.ready_pods} ready pod(s)"
        where = (
            f"the pool is at its maxPods ({self.max_pods})"
            if self.at_max_pods
            else f"the pool is being scaled up (maxPods {self.max_pods})"
        )
        return (
            f"voice {self.voice} needs {self.need_mib:.0f} MiB of memory plus {MARGIN_MIB:.0f} "
            f"MiB spare on a pod, and the most any of the pool's {pods} has free is "
            f"{self.best_free_mib:.0f} MiB of {self.total_mib:.0f} MiB; {where}"
        )


def memory_shortfall(
    voice: str, need_mib: float, rooms: Mapping[str, PodRoom], ready_pods: int, max_pods: int
) -> MemoryShortfall:
    best = max(rooms.values(), key=lambda room: room.free_mib, default=None)
    return MemoryShortfall(
        voice,
        need_mib,
        best.free_mib if best is not None else 0.0,
        best.total_mib if best is not None else 0.0,
        ready_pods,
        max_pods,
    )


def pool_memory_pods(rooms: Mapping[str, PodRoom], pending: Mapping[str, float]) -> int:
    """The pods the pool's voices need by memory: each voice once (those on the pods, and
    those that fit none yet), in pods of the reported room for voices; 0 where no pod
    reports (the HPA keeps its own floor)."""
    if not rooms:
        return 0
    sizes: dict[str, float] = {}
    for room in rooms.values():
        for voice, size in room.voices.items():
            sizes[voice] = max(size, sizes.get(voice, 0.0))
    sizes.update(pending)
    capacity = min(
        room.total_mib - (room.used_mib - sum(room.voices.values())) - MARGIN_MIB
        for room in rooms.values()
    )
    return pods_for_memory(list(sizes.values()), capacity)


async def unload_from_pods(rt: Runtime, name: str, namespace: str, pool: Pool) -> list[str]:
    errors = []
    for pod in await rt.pool_pods(namespace, pool_selector(pool.name)):
        error = await unload_from_pod(rt, name, namespace, pod)
        if error is not None:
            errors.append(error)
    return errors


async def unload_from_pod(
    rt: Runtime, name: str, namespace: str, pod: Mapping[str, Any]
) -> str | None:
    """Take the voice off one pod (if it is there); the error of the unload, if any."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    if serving_label(name) not in labels and LOADED_PREFIX + name not in annotations:
        return None
    # Unlabel first so that the Service stops routing new streams before the unload.
    patched = await rt.client.patch(
        PODS,
        namespace,
        meta["name"],
        {
            "metadata": {
                "labels": {serving_label(name): None},
                "annotations": {LOADED_PREFIX + name: None},
            }
        },
    )
    rt.cache.seen(PODS.plural, patched)
    if pod_ready(pod):
        url = f"http://{pod['status']['podIP']}:{_http_port(pod)}"
        try:
            key = await rt.repository_key(namespace)
            await loading.unload_voice(rt.http, url, name, key)
        except (loading.LoadError, LookupError) as error:
            return str(error)
    return None
