"""Placement: which voices share which pool, and the pool's size bounds and targets.

The voices of a pool in a namespace share its pods (each is loaded on the pods where it fits:
voxfleet_operator.placement); the pool's autoscaling follows the strictest of its voices'
targets, and never goes below the pods its voices need by memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.spec import TTSVoiceSpec


@dataclass(frozen=True)
class Voice:
    """One TTSVoice as the planner sees it: its identity and validated spec."""

    name: str
    namespace: str
    spec: TTSVoiceSpec


@dataclass(frozen=True)
class PoolPlan:
    namespace: str
    pool: Pool
    voices: tuple[Voice, ...]
    min_replicas: int
    max_replicas: int
    target_first_audio_ms: int
    target_load_percent: int


def plan_pool(
    pool: Pool, namespace: str, voices: Iterable[Voice], memory_pods: int = 0
) -> PoolPlan:
    """Size bounds and targets of one pool from the voices placed on it (at least one);
    `memory_pods`: the pods its voices need by memory (never fewer, up to its maxPods)."""
    members = tuple(sorted(voices, key=lambda v: v.name))
    if not members:
        raise ValueError(f"pool {pool.name!r} in {namespace!r} has no voices to plan for")
    scaling = [v.spec.autoscaling for v in members]
    max_replicas = min(max(s.max_replicas for s in scaling), pool.max_pods)
    min_replicas = min(max(*(s.min_replicas for s in scaling), memory_pods), max_replicas)
    return PoolPlan(
        namespace=namespace,
        pool=pool,
        voices=members,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        target_first_audio_ms=min(s.target_first_audio_p95_ms for s in scaling),
        target_load_percent=min(s.target_load_percent for s in scaling),
    )


def place_voices(voices: Iterable[Voice], pools: PoolsConfig) -> list[PoolPlan]:
    """Group voices by (namespace, pool); KeyError when a voice names an unknown pool."""
    groups: dict[tuple[str, str], list[Voice]] = {}
    for voice in voices:
        pool = pools.get(voice.spec.pool)
        groups.setdefault((voice.namespace, pool.name), []).append(voice)
    return [
        plan_pool(pools.get(pool_name), namespace, members)
        for (namespace, pool_name), members in sorted(groups.items())
    ]
