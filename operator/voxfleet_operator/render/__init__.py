"""Pure render functions: plain inputs in, Kubernetes objects (dicts) out.

Nothing here imports kopf or a Kubernetes client; owner references are added by the handlers,
because only the live objects have uids.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from voxfleet_operator.pool_plan import PoolPlan, Voice, place_voices
from voxfleet_operator.pools import PoolsConfig
from voxfleet_operator.render.engine_job import build_engine_job
from voxfleet_operator.render.pool import (
    build_pool_deployment,
    build_pool_hpa,
    build_pool_metrics_service,
    build_pool_pdb,
    build_pool_service_monitor,
)
from voxfleet_operator.render.speech_api import build_voice_pods_service, render_speech_api
from voxfleet_operator.render.voice import build_repository_key_secret, build_voice_service
from voxfleet_operator.render.voice_scaling import build_voice_hpa
from voxfleet_operator.speech_api import SpeechApiConfig
from voxfleet_operator.voice_plan import voice_engine_key

__all__ = [
    "build_engine_job",
    "build_pool_deployment",
    "build_pool_hpa",
    "build_pool_metrics_service",
    "build_pool_pdb",
    "build_pool_service_monitor",
    "build_repository_key_secret",
    "build_voice_hpa",
    "build_voice_pods_service",
    "build_voice_service",
    "render_pool",
    "render_speech_api",
    "render_voice",
    "render_voices",
]


def render_pool(
    plan: PoolPlan, engine_cache_pvc: str, service_monitor: bool
) -> list[dict[str, Any]]:
    """The children shared by all voices of one pool in one namespace."""
    objects = [
        build_pool_deployment(plan.pool, plan.namespace, engine_cache_pvc),
        build_pool_metrics_service(plan.pool, plan.namespace),
        build_pool_hpa(plan),
        build_pool_pdb(plan.pool, plan.namespace),
    ]
    if service_monitor:
        objects.append(build_pool_service_monitor(plan.pool, plan.namespace))
    return objects


def render_voice(voice: Voice, pools: PoolsConfig, engine_cache_pvc: str) -> list[dict[str, Any]]:
    """The children of one voice alone: its engine-build Job, its Service and headless
    Service (the pods serving it, by DNS), and its HPA when it scales on its own
    (`autoscaling.perVoice`)."""
    pool = pools.get(voice.spec.pool)
    key = voice_engine_key(voice.spec, pool)
    objects = [
        build_engine_job(voice.name, voice.namespace, voice.spec, pool, key, engine_cache_pvc),
        build_voice_service(voice.name, voice.namespace, pool),
        build_voice_pods_service(voice.name, voice.namespace, pool),
    ]
    if voice.spec.autoscaling.per_voice:
        objects.append(build_voice_hpa(voice, pool))
    return objects


def render_voices(
    voices: Iterable[Voice],
    pools: PoolsConfig,
    engine_cache_pvc: str,
    *,
    service_monitor: bool = True,
    repository_key: str | None = None,
    speech_api: SpeechApiConfig | None = None,
) -> list[dict[str, Any]]:
    """Every object the operator would create for these voices, in apply order (with
    `speech_api` enabled, each namespace's gateway too)."""
    voices = list(voices)
    objects: list[dict[str, Any]] = []
    plans = place_voices(voices, pools)
    if repository_key is not None:
        for namespace in sorted({p.namespace for p in plans}):
            objects.append(build_repository_key_secret(namespace, repository_key))
    for plan in plans:
        objects.extend(render_pool(plan, engine_cache_pvc, service_monitor))
        for voice in plan.voices:
            objects.extend(render_voice(voice, pools, engine_cache_pvc))
    if speech_api is not None:
        for namespace in sorted({v.namespace for v in voices}):
            members = [v for v in voices if v.namespace == namespace]
            objects.extend(render_speech_api(namespace, members, speech_api))
    return objects
