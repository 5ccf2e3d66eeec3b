"""The operator's settings: every environment variable it reads is named here, once.

The chart sets them (docs/README.md lists them). `load_config(environ)` reads the mapping
it is given and nothing else, so a test or a caller with an environment of its own never
picks up the shell's; without one it reads the process's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from voxfleet_operator.pools import PoolsConfig, load_pools
from voxfleet_operator.speech_api import SpeechApiConfig, load_speech_api

POOLS_FILE_ENV = "VOXFLEET_POOLS_FILE"
SPEECH_API_FILE_ENV = "VOXFLEET_SPEECH_API_FILE"
WATCH_NAMESPACES_ENV = "VOXFLEET_WATCH_NAMESPACES"
ENGINE_CACHE_PVC_ENV = "VOXFLEET_ENGINE_CACHE_PVC"
RESYNC_SECONDS_ENV = "VOXFLEET_RESYNC_SECONDS"
PROMETHEUS_URL_ENV = "VOXFLEET_PROMETHEUS_URL"

DEFAULT_ENGINE_CACHE_PVC = "voxfleet-engine-cache"
# How often every voice is re-checked for drift: a safety net, as events repair at once.
DEFAULT_RESYNC_SECONDS = 30.0


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
    resync_seconds: float = DEFAULT_RESYNC_SECONDS


def load_config(environ: Mapping[str, str] | None = None) -> OperatorConfig:
    """The settings in `environ` (the process's environment when None); ConfigError, or the
    pools' or gateway settings' own error, naming what is wrong."""
    env = os.environ if environ is None else environ
    return OperatorConfig(
        pools=load_pools(env.get(POOLS_FILE_ENV) or None),
        watch_namespaces=watch_namespaces(env),
        engine_cache_pvc=engine_cache_pvc(env),
        speech_api=load_speech_api(env.get(SPEECH_API_FILE_ENV) or None),
        prometheus_url=_prometheus_url(env.get(PROMETHEUS_URL_ENV, "")),
        resync_seconds=_resync_seconds(env.get(RESYNC_SECONDS_ENV, "")),
    )


def watch_namespaces(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The namespaces to watch (comma-separated); none: every namespace."""
    raw = environ.get(WATCH_NAMESPACES_ENV, "")
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def engine_cache_pvc(environ: Mapping[str, str]) -> str:
    return environ.get(ENGINE_CACHE_PVC_ENV) or DEFAULT_ENGINE_CACHE_PVC


def _resync_seconds(raw: str) -> float:
    if not raw.strip():
        return DEFAULT_RESYNC_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(
            f"{RESYNC_SECONDS_ENV} must be a number of seconds, got {raw!r}"
        ) from None
    if value <= 0:
        raise ConfigError(f"{RESYNC_SECONDS_ENV} must be positive, got {value:g}")
    return value


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
