"""Which pool pods a voice is loaded on: where it fits, and as many as it asks for.

A voice without `spec.replicas` is loaded on every ready pod of its pool where it fits. With
it (set by `kubectl scale ttsv` or by the voice's own HPA) the voice stays on the pods that
already serve it, as far as the count allows, and takes the least-loaded ready pods where it
fits for the rest: a pod's load is the number of voices it serves (its
`serving.voxfleet.io/<voice>` labels) unless the caller knows better (live streams, say).

"Fits" is by measured memory: each pod reports its memory (total, used, each voice's
footprint) on its health port (`PodRoom.from_report`), and a voice goes only where its
footprint plus `margin_mib` is free. A pod that does not report is taken to have room (its
voice host still refuses a load that would not fit, before it allocates anything). Where a
voice fits nowhere the pool needs more pods (`pods_for_memory` sizes it).

Pure: pods and reports in, pod names out.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from voxfleet_operator.names import (
    SCALED_VOICE_LABEL,
    SERVING_PREFIX,
    pool_selector,
    serving_label,
)

# A voice's footprint before any pod has reported one of its pool's (MiB): above the
# measured torch-cuda voice (43 MiB on the H200) and onnxruntime voice (about 80 MiB of RSS).
DEFAULT_VOICE_MIB = {"gpu": 100.0, "cpu": 150.0}
# Memory a pod keeps free on top of what placement puts there (MiB): its voice host keeps
# the same (engines.contract.names.MEMORY_MARGIN_MIB).
MARGIN_MIB = 512.0


@dataclass(frozen=True)
class Placement:
    """The ready pods the voice should be on (in order), the serving ones it should leave, and
    how many more pods it asked for than fit it (`unplaced`)."""

    serve: tuple[str, ...]
    release: tuple[str, ...]
    unplaced: int = 0


@dataclass(frozen=True)
class PodRoom:
    """A pod's memory as its report gives it (MiB), and its load where known.

    `streams` and `stream_capacity` bound a pod by compute as `used_mib` and `total_mib` do by
    memory (the fleet simulation sets them; the operator leaves the capacity unbounded)."""

    name: str
    total_mib: float
    used_mib: float
    voices: Mapping[str, float] = field(default_factory=dict)
    streams: float = 0.0
    stream_capacity: float = math.inf

    @classmethod
    def from_report(cls, name: str, report: Mapping[str, Any]) -> PodRoom:
        """From a pod's /memory report (engines.pod.voice_host.host.MemoryReport.to_dict)."""
        voices = {
            str(voice): float((entry or {}).get("mib", 0.0))
            for voice, entry in (report.get("voices") or {}).items()
        }
        return cls(name, float(report["total_mib"]), float(report["used_mib"]), voices)

    @property
    def free_mib(self) -> float:
        return self.total_mib - self.used_mib

    def fits(self, need_mib: float, margin_mib: float, demand: float = 0.0) -> bool:
        return (
            self.used_mib + need_mib + margin_mib <= self.total_mib
            and self.streams + demand <= self.stream_capacity
        )

    def with_voice(self, voice: str, need_mib: float, demand: float = 0.0) -> PodRoom:
        return PodRoom(
            self.name,
            self.total_mib,
            self.used_mib + need_mib,
            {**self.voices, voice: need_mib},
            self.streams + demand,
            self.stream_capacity,
        )


def voice_size_mib(voice: str, rooms: Iterable[PodRoom], device: str) -> float:
    """What `voice` will take on a pod: its own footprint where a pod reports it, else the
    median of its pool's reported voices (one architecture, one size), else the default."""
    rooms = list(rooms)
    own = [room.voices[voice] for room in rooms if voice in room.voices]
    if own:
        return max(own)
    others = [size for room in rooms for size in room.voices.values()]
    return statistics.median(others) if others else DEFAULT_VOICE_MIB[device]


def pods_for_memory(sizes_mib: Sequence[float], capacity_mib: float) -> int:
    """Pods a pool needs to hold voices of `sizes_mib` once each, with `capacity_mib` of
    room for voices per pod (first fit, largest first); at least 1."""
    if capacity_mib <= 0:
        return max(1, len(sizes_mib))
    bins: list[float] = []
    for size in sorted(sizes_mib, reverse=True):
        for index, left in enumerate(bins):
            if size <= left:
                bins[index] = left - size
                break
        else:
            bins.append(capacity_mib - size)
    return max(1, len(bins))


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def serves(pod: Mapping[str, Any], voice: str) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(serving_label(voice)) == "true"


def voices_on(pod: Mapping[str, Any]) -> int:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return sum(1 for k, v in labels.items() if k.startswith(SERVING_PREFIX) and v == "true")


def place_voice(
    voice: str,
    ready_pods: Sequence[Mapping[str, Any]],
    replicas: int | None,
    load: Mapping[str, float] | None = None,
    rooms: Mapping[str, PodRoom] | None = None,
    need_mib: float = 0.0,
    margin_mib: float = MARGIN_MIB,
    demand: float = 0.0,
    reserve_mib: float = 0.0,
) -> Placement:
    """Where `voice` goes among `ready_pods`; `replicas=None` means on all of them where it fits.

    Pods that serve the voice already are kept first (a move would cut their streams), the
    least-loaded of them when there are too many; new pods are those where `need_mib` (and
    `demand` streams) fit by `rooms` (pod name -> its report; a pod without one is taken to
    fit), the least-loaded first, by `load` (pod name -> load) or else by the number of voices
    each serves; ties go to the pod with the most free memory, then by name.

    A voice that is served somewhere already takes a further pod only where `reserve_mib`
    stays free as well: the memory of voices of the pool that fit no pod yet (and for which
    the pool is being scaled up), so that copies of placed voices do not take the room a new
    pod was added for.
    """
    rooms = rooms or {}
    placed = any(serves(p, voice) for p in ready_pods)
    extra = margin_mib + (reserve_mib if placed else 0.0)

    def fits(pod: Mapping[str, Any]) -> bool:
        room = rooms.get(_name(pod))
        return room is None or room.fits(need_mib, extra, demand)

    def weight(pod: Mapping[str, Any]) -> tuple[float, float, str]:
        room = rooms.get(_name(pod))
        free = -(room.free_mib if room is not None else math.inf)
        if load is not None:
            return (load.get(_name(pod), 0.0), free, _name(pod))
        # The voice itself does not count against the pods that already hold it.
        return (float(voices_on(pod) - (1 if serves(pod, voice) else 0)), free, _name(pod))

    current = sorted((p for p in ready_pods if serves(p, voice)), key=weight)
    others = sorted((p for p in ready_pods if not serves(p, voice) and fits(p)), key=weight)
    wanted = len(ready_pods) if replicas is None else replicas
    chosen = (current + others)[:wanted]
    keep = {_name(p) for p in chosen}
    if replicas is None:
        unplaced = 0 if chosen or not ready_pods else 1
    else:
        unplaced = max(0, replicas - len(chosen))
    return Placement(
        tuple(sorted(keep) if replicas is None else (_name(p) for p in chosen)),
        tuple(_name(p) for p in current if _name(p) not in keep),
        unplaced,
    )


def voice_selector(voice: str, pool: str) -> str:
    """The label selector of the pods serving `voice`."""
    labels = {**pool_selector(pool), serving_label(voice): "true"}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def scale_selector(voice: str) -> str:
    """The scale subresource's selector: a label no pod carries. The HPA controller lets only
    one HPA select a pod, and the pool's HPA selects all of them (render/voice_scaling.py)."""
    return f"{SCALED_VOICE_LABEL}={voice}"


def scale_status(voice: str, pool: str, serving: int) -> dict[str, Any]:
    """The status fields behind the TTSVoice scale subresource, and the serving pods'
    selector for people."""
    return {
        "replicas": serving,
        "selector": scale_selector(voice),
        "podSelector": voice_selector(voice, pool),
    }
