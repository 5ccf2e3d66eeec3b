"""The operator's configuration, all from the environment the chart sets."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from voxfleet_operator.pools import PoolsConfig, load_pools
from voxfleet_operator.speech_api import SPEECH_API_FILE_ENV, SpeechApiConfig, load_speech_api

WATCH_NAMESPACES_ENV = "VOXFLEET_WATCH_NAMESPACES"
ENGINE_CACHE_PVC_ENV = "VOXFLEET_ENGINE_CACHE_PVC"
DEFAULT_ENGINE_CACHE_PVC = "voxfleet-engine-cache"


class ConfigError(ValueError):
    """The operator's environment is wrong; the message says which variable and why."""


@dataclass(frozen=True)
class OperatorConfig:
    pools: PoolsConfig
    watch_namespaces: tuple[str, ...]
    engine_cache_pvc: str
    speech_api: SpeechApiConfig = field(default_factory=SpeechApiConfig)


def load_config(environ: dict[str, str] | None = None) -> OperatorConfig:
    env = dict(os.environ if environ is None else environ)
    namespaces = tuple(n.strip() for n in env.get(WATCH_NAMESPACES_ENV, "").split(",") if n.strip())
    return OperatorConfig(
        pools=load_pools(env.get("VOXFLEET_POOLS_FILE") or None),
        watch_namespaces=namespaces,
        engine_cache_pvc=env.get(ENGINE_CACHE_PVC_ENV) or DEFAULT_ENGINE_CACHE_PVC,
        speech_api=load_speech_api(env.get(SPEECH_API_FILE_ENV)),
    )
