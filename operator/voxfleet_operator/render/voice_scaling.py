"""A voice's own HorizontalPodAutoscaler (`autoscaling.perVoice: true`).

It scales the TTSVoice's scale subresource (`spec.replicas`, the pool pods the voice is loaded
on) on the voice's own first-audio p95: the adapter rule keyed by the stream model's `model`
label (`voxfleet_voice_first_audio_p95_seconds`, an Object metric of the TTSVoice) with a
`Value` target, so the desired count is `ceil(pods serving x p95 / target)`. Kubernetes' HPA
controller does the scaling; the operator only places the voice on that many pods, and the
pool HPA keeps at least as many pods as the most-replicated voice needs.
"""

from __future__ import annotations

from typing import Any

from voxfleet_operator.names import POOL_LABEL, VOICE_LABEL
from voxfleet_operator.plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import metadata
from voxfleet_operator.render.pool import VOICE_FIRST_AUDIO_METRIC
from voxfleet_operator.spec import GROUP, KIND, VERSION


def voice_hpa_name(voice: str) -> str:
    return f"{voice}-tts"


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
                {
                    "type": "Object",
                    "object": {
                        "metric": {"name": VOICE_FIRST_AUDIO_METRIC},
                        "describedObject": target,
                        "target": {
                            "type": "Value",
                            "value": f"{scaling.target_first_audio_p95_ms}m",
                        },
                    },
                }
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
