"""Which pool pods a voice is loaded on, when its `spec.replicas` limits it to some of them.

A voice without `spec.replicas` is loaded on every ready pod of its pool. With it (set by
`kubectl scale ttsv` or by the voice's own HPA) the voice stays on the pods that already serve
it, as far as the count allows, and takes the least-loaded ready pods for the rest: a pod's
load is the number of voices it serves (its `serving.voxfleet.io/<voice>` labels) unless the
caller knows better (live streams, say). Pure: pods in, pod names out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from voxfleet_operator.names import SERVING_PREFIX, pool_selector, serving_label


@dataclass(frozen=True)
class Placement:
    """The ready pods the voice should be on (in order), and the serving ones it should leave."""

    serve: tuple[str, ...]
    release: tuple[str, ...]


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
) -> Placement:
    """Where `voice` goes among `ready_pods`; `replicas=None` means on all of them.

    Pods that serve the voice already are kept first (a move would cut their streams), the
    least-loaded of them when there are too many; new pods are the least-loaded of the rest,
    by `load` (pod name -> load) or else by the number of voices each serves; ties go by name.
    """
    if replicas is None:
        return Placement(tuple(sorted(_name(p) for p in ready_pods)), ())

    def weight(pod: Mapping[str, Any]) -> tuple[float, str]:
        if load is not None:
            return (load.get(_name(pod), 0.0), _name(pod))
        # The voice itself does not count against the pods that already hold it.
        return (float(voices_on(pod) - (1 if serves(pod, voice) else 0)), _name(pod))

    current = sorted((p for p in ready_pods if serves(p, voice)), key=weight)
    others = sorted((p for p in ready_pods if not serves(p, voice)), key=weight)
    chosen = (current + others)[:replicas]
    keep = {_name(p) for p in chosen}
    return Placement(
        tuple(_name(p) for p in chosen),
        tuple(_name(p) for p in current if _name(p) not in keep),
    )


def voice_selector(voice: str, pool: str) -> str:
    """The label selector of the pods serving `voice` (its scale subresource's selector)."""
    labels = {**pool_selector(pool), serving_label(voice): "true"}
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def scale_status(voice: str, pool: str, serving: int) -> dict[str, Any]:
    """The status fields behind the TTSVoice scale subresource."""
    return {"replicas": serving, "selector": voice_selector(voice, pool)}
