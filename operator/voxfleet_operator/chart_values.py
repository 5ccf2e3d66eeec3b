"""What the chart gives the operator, worked out from a Helm values file.

`voxfleet render --values` uses it to render what the installed operator would: the pools
file the chart writes (`voxfleet.poolsFile` in `_helpers.tpl`: the values' pools, each
without a `tritonImage` given the chart's Triton image) and the engine-cache claim name.
Pass the release's complete values (`helm get values --all RELEASE`): a partial file
leaves out the chart's defaults, as Helm would not.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from typing import Any

from voxfleet_operator.pools import PoolsConfig, PoolsConfigError, parse_pools
from voxfleet_operator.speech_api import SpeechApiConfig, parse_speech_api


def _app_version() -> str:
    # The chart's appVersion is the package's version: both are released together.
    return metadata.version("voxfleet")


def triton_image(values: Mapping[str, Any], key: str = "tritonImage") -> str:
    """`voxfleet.image` of `tritonImage`: the digest wins, the tag defaults to appVersion."""
    image = values.get(key) or {}
    if not isinstance(image, Mapping) or not image.get("repository"):
        raise PoolsConfigError(f"values: {key}.repository is missing")
    if image.get("digest"):
        return f"{image['repository']}@{image['digest']}"
    return f"{image['repository']}:{image.get('tag') or _app_version()}"


def pools_from_values(values: Mapping[str, Any], source: str = "values") -> PoolsConfig:
    """The pools file the chart renders from `values`, parsed as the operator parses it."""
    pools = values.get("pools")
    if not isinstance(pools, list) or "defaultPool" not in values:
        raise PoolsConfigError(
            f"{source}: no `pools` list and `defaultPool`; give the release's complete values "
            "(helm get values --all RELEASE)"
        )
    filled = []
    for pool in pools:
        if not isinstance(pool, Mapping):
            raise PoolsConfigError(f"{source}: every entry of pools must be a mapping")
        entry = dict(pool)
        if not entry.get("tritonImage"):
            entry["tritonImage"] = triton_image(values)
        filled.append(entry)
    return parse_pools({"defaultPool": values["defaultPool"], "pools": filled}, source)


def engine_cache_claim(values: Mapping[str, Any]) -> str | None:
    cache = values.get("engineCache") or {}
    claim = cache.get("claimName") if isinstance(cache, Mapping) else None
    return str(claim) if claim else None


def speech_api_from_values(values: Mapping[str, Any]) -> SpeechApiConfig:
    """The speech API settings the chart writes (`voxfleet.speechApiFile`), parsed."""
    api = values.get("speechApi")
    if not isinstance(api, Mapping) or not api.get("enabled"):
        return SpeechApiConfig()
    settings: dict[str, Any] = {
        "enabled": True,
        "image": triton_image(api, "image"),
        "imagePullPolicy": (api.get("image") or {}).get("pullPolicy") or "IfNotPresent",
        "replicas": api.get("replicas", 1),
        "resources": api.get("resources") or {},
        "voiceAliases": api.get("voiceAliases") or {},
    }
    for key in ("defaultVoice", "apiKeysSecret"):
        if api.get(key):
            settings[key] = api[key]
    return parse_speech_api(settings, "values: speechApi")
