"""The operator's configuration, all from the environment the chart sets."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from voxfleet_operator.metrics import PROMETHEUS_URL_ENV
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
    # Where each voice's streams, first-audio p95 and refusals are read for its status; None:
    # those status fields stay empty.
    prometheus_url: str | None = None


def load_config(environ: dict[str, str] | None = None) -> OperatorConfig:
    env = dict(os.environ if environ is None else environ)
    namespaces = tuple(n.strip() for n in env.get(WATCH_NAMESPACES_ENV, "").split(",") if n.strip())
    return OperatorConfig(
        pools=load_pools(env.get("VOXFLEET_POOLS_FILE") or None),
        watch_namespaces=namespaces,
        engine_cache_pvc=env.get(ENGINE_CACHE_PVC_ENV) or DEFAULT_ENGINE_CACHE_PVC,
        speech_api=load_speech_api(env.get(SPEECH_API_FILE_ENV)),
        prometheus_url=_prometheus_url(env.get(PROMETHEUS_URL_ENV, "")),
    )


def _prometheus_url(value: str) -> str | None:
    url = value.strip().rstrip("/")
    if not url:
        return None
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"{PROMETHEUS_URL_ENV} must be an http:// or https:// URL of Prometheus (the "
            f"chart's prometheus.url), got {value!r}"
        )
    return url
