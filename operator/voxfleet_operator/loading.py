"""Loading a voice onto a Triton pod through the repository API, restricted by a key.

Triton runs in explicit model-control mode with the repository API restricted to calls that
carry the header `voxfleet-key: <key>` (HTTP). A load sends the model's config (JSON, with
the voice's serving plan inside) and its files in one request, so pods need nothing
voice-specific on disk except the engine cache.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from engines.contract.plan import ServingPlan
from engines.contract.repository import load_request as repository_load_request
from voxfleet_operator.names import REPOSITORY_HEADER_KEY

LOAD_TIMEOUT_SECONDS = 120


class LoadError(RuntimeError):
    """Triton refused or failed a load/unload; the message carries Triton's own error."""


def load_request(plan: ServingPlan) -> dict[str, Any]:
    """The body of `POST /v2/repository/models/<voice>/load` (engines.contract.repository builds
    it)."""
    return repository_load_request(plan)


def load_digest(body: Mapping[str, Any]) -> str:
    """Identity of what a load sends: a pod that loaded the same digest needs no reload."""
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def _headers(key: str) -> dict[str, str]:
    return {REPOSITORY_HEADER_KEY: key, "Content-Type": "application/json"}


async def _post(session: aiohttp.ClientSession, url: str, body: Any, key: str) -> None:
    timeout = aiohttp.ClientTimeout(total=LOAD_TIMEOUT_SECONDS)
    try:
        async with session.post(
            url, data=json.dumps(body), headers=_headers(key), timeout=timeout
        ) as response:
            if response.status != 200:
                text = await response.text()
                try:
                    text = json.loads(text).get("error", text)
                except (ValueError, AttributeError):
                    pass
                raise LoadError(f"{url}: HTTP {response.status}: {text}")
    except (aiohttp.ClientError, TimeoutError) as error:
        raise LoadError(f"{url}: {type(error).__name__}: {error}") from None


async def load_voice(
    session: aiohttp.ClientSession, base_url: str, model: str, body: Mapping[str, Any], key: str
) -> None:
    await _post(session, f"{base_url}/v2/repository/models/{model}/load", dict(body), key)


async def unload_voice(session: aiohttp.ClientSession, base_url: str, model: str, key: str) -> None:
    await _post(session, f"{base_url}/v2/repository/models/{model}/unload", {}, key)
