"""A voice's own HorizontalPodAutoscaler (`autoscaling.perVoice: true`).

It scales the TTSVoice's scale subresource (`spec.replicas`, the pool pods the voice is loaded
on) on the voice's own load: `voxfleet_voice_load_pods`, an Object metric of the TTSVoice (the
adapter rule keyed by the stream model's `model` label): the voice's live streams on each pod
over that pod's measured capacity, summed over its pods, i.e. how many pods' worth of streams
it has. With an `AverageValue` target of `targetLoadPercent` the HPA proposes
ceil(load / target) pods, and needs no list of pods to do so.

That matters: Kubernetes' HPA controller refuses every HPA whose pods another HPA also selects
(`AmbiguousSelector`), and the pool's HPA selects every pod of the pool. So the TTSVoice's
scale subresource gives a selector of no pod (`placement.scale_selector`), and the voice's HPA
scales only on metrics that need none. Kubernetes' HPA controller does the scaling; the
operator only places the voice on that many pods, and the pool HPA keeps at least as many pods
as the most-replicated voice needs.
"""

from __future__ import annotations

from typing import Any

from voxfleet_operator.names import POOL_LABEL, VOICE_LABEL
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import metadata
from voxfleet_operator.render.pool import VOICE_LOAD_METRIC, load_target
from voxfleet_operator.spec import GROUP, KIND, VERSION


def voice_hpa_name(voice: str) -> str:
    return f"{voice}-tts"


def object_metric(name: str, described: dict[str, str], average: str) -> dict[str, Any]:
    """An Object metric of the TTSVoice with an AverageValue target: replicas =
    ceil(value / target), with no pod list needed."""
    return {
        "type": "Object",
        "object": {
            "metric": {"name": name},
            "describedObject": described,
            "target": {"type": "AverageValue", "averageValue": average},
        },
    }


def build_voice_hpa(voice: Voice, pool: Pool) -> dict[str, Any]:
    scaling = voice.spec.autoscaling
    max_replicas = min(scaling.max_replicas, pool.max_pods)
    target = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "name": voice.name}
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(
            voice_hpa_name(voice.name),
            voice.namespace,
            "autoscaler",
            {VOICE_LABEL: voice.name, POOL_LABEL: pool.name},
        ),
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": min(scaling.min_replicas, max_replicas),
            "maxReplicas": max_replicas,
            "metrics": [
                object_metric(VOICE_LOAD_METRIC, target, load_target(scaling.target_load_percent)),
            ],
            # Loading a voice on another pod takes seconds, not minutes: scale up at once,
            # one pod per 30 s; leave a pod only after five quiet minutes.
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 30}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }
