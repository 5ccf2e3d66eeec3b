"""The operator's configuration, all from the environment the chart sets."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from voxfleet_operator.pools import PoolsConfig, load_pools

WATCH_NAMESPACES_ENV = "VOXFLEET_WATCH_NAMESPACES"
REPOSITORY_KEY_FILE_ENV = "VOXFLEET_REPOSITORY_KEY_FILE"
ENGINE_CACHE_PVC_ENV = "VOXFLEET_ENGINE_CACHE_PVC"
DEFAULT_ENGINE_CACHE_PVC = "voxfleet-engine-cache"


class ConfigError(ValueError):
    """The operator's environment is wrong; the message says which variable and why."""


@dataclass(frozen=True)
class OperatorConfig:
    pools: PoolsConfig
    watch_namespaces: tuple[str, ...]
    repository_key: str
    engine_cache_pvc: str


def read_repository_key(path: str | None) -> str:
    if not path:
        raise ConfigError(
            f"{REPOSITORY_KEY_FILE_ENV} is not set; it must name the file holding the Triton "
            "repository-API key (the chart mounts it from a Secret)"
        )
    try:
        key = Path(path).read_text().strip()
    except OSError as error:
        raise ConfigError(f"cannot read repository key file {path}: {error.strerror}") from None
    if not key:
        raise ConfigError(f"repository key file {path} is empty")
    return key


def load_config(environ: dict[str, str] | None = None) -> OperatorConfig:
    env = dict(os.environ if environ is None else environ)
    namespaces = tuple(n.strip() for n in env.get(WATCH_NAMESPACES_ENV, "").split(",") if n.strip())
    return OperatorConfig(
        pools=load_pools(env.get("VOXFLEET_POOLS_FILE") or None),
        watch_namespaces=namespaces,
        repository_key=read_repository_key(env.get(REPOSITORY_KEY_FILE_ENV)),
        engine_cache_pvc=env.get(ENGINE_CACHE_PVC_ENV) or DEFAULT_ENGINE_CACHE_PVC,
    )
