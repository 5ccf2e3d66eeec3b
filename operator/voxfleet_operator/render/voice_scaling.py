"""A voice's own HorizontalPodAutoscaler (`autoscaling.perVoice: true`).

It scales the TTSVoice's scale subresource (`spec.replicas`, the pool pods the voice is loaded
on) on the voice's own latency, as the pool HPA does on its pods': the voice's first-audio p95
and the mean time its audio windows wait for the vocoder. Each is an Object metric of the
TTSVoice (the adapter rules keyed by the stream model's `model` label,
`voxfleet_voice_first_audio_p95_seconds` and `voxfleet_voice_queue_seconds`) with a `Value`
target, so each proposes `ceil(pods serving x value / target)` and the HPA takes the larger.
The queue time climbs as soon as a voice's pods fall behind, before the first listeners of a
load step have waited long enough to move the p95. Kubernetes' HPA controller does the scaling;
the operator only places the voice on that many pods, and the pool HPA keeps at least as many
pods as the most-replicated voice needs.
"""

from __future__ import annotations

from typing import Any

from voxfleet_operator.names import POOL_LABEL, VOICE_LABEL
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import metadata
from voxfleet_operator.render.pool import VOICE_FIRST_AUDIO_METRIC, VOICE_QUEUE_METRIC
from voxfleet_operator.spec import GROUP, KIND, VERSION


def voice_hpa_name(voice: str) -> str:
    return f"{voice}-tts"


def object_metric(name: str, described: dict[str, str], target_ms: int) -> dict[str, Any]:
    """An Object metric of the TTSVoice held to `target_ms` (a quantity in milliseconds)."""
    return {
        "type": "Object",
        "object": {
            "metric": {"name": name},
            "describedObject": described,
            "target": {"type": "Value", "value": f"{target_ms}m"},
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
                object_metric(VOICE_FIRST_AUDIO_METRIC, target, scaling.target_first_audio_p95_ms),
                object_metric(VOICE_QUEUE_METRIC, target, scaling.target_queue_ms),
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
