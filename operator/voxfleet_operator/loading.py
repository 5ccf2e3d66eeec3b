"""Loading a voice onto a Triton pod through the repository API, restricted by a key.

Triton runs in explicit model-control mode with the repository API restricted to calls that
carry the header `voxfleet-key: <key>` (HTTP). A load sends the model's config (JSON) and
its files in one request, so pods need nothing voice-specific on disk except the engine cache.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from voxfleet_operator.names import REPOSITORY_HEADER_KEY
from voxfleet_operator.plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.engine_job import ENGINE_CACHE_MOUNT

LOAD_TIMEOUT_SECONDS = 120


class LoadError(RuntimeError):
    """Triton refused or failed a load/unload; the message carries Triton's own error."""


def serving_plan(voice: Voice, pool: Pool, engine_key: str) -> dict[str, Any]:
    """The data plane's `VoicePlan` (as JSON-ready fields) for one voice on one pool.

    Layout of the engine cache volume (see docs/operator.md): the build Job publishes
    the voice's engines and its `.onnx.json` under `/engines/<engine key>/`.
    """
    spec = voice.spec
    engine_dir = f"{ENGINE_CACHE_MOUNT}/{engine_key}"
    return {
        "name": voice.name,
        "engine_dir": engine_dir,
        "voice_config_path": f"{engine_dir}/voice.onnx.json",
        "runtime": "tensorrt",
        "windows": {
            "first_window_frames": spec.streaming.first_window_frames,
            "window_frames": spec.streaming.steady_window_frames,
            "vocoder_context_frames": spec.streaming.context_frames,
            "max_batch_windows": spec.batching.max_batch_size,
        },
        "max_text_bytes": spec.limits.max_text_bytes,
        "max_streams": spec.limits.max_concurrent_streams,
        # The data plane's `speaking_rate` multiplies the length scale (larger is slower);
        # the API's speakingRate is a rate (larger is faster).
        "speaking_rate": round(1.0 / spec.speaking_rate, 6),
    }


def model_repository_files(plan: Mapping[str, Any]) -> dict[str, bytes]:
    """The stream model's files (relative path -> content) for one voice.

    The single wiring point to the data plane's repository builder.
    """
    from engines.repository import ServingPlan, build_model_repository
    from engines.voice_plan import VoicePlan

    return build_model_repository(ServingPlan((VoicePlan.from_json(json.dumps(plan)),)))


def load_request(model: str, files: Mapping[str, bytes]) -> dict[str, Any]:
    """The body of `POST /v2/repository/models/<model>/load` from a repository's files.

    `<model>/config.pbtxt` becomes the JSON `config` override; every other file under
    `<model>/` is sent as a `file:<path>` parameter (base64), as Triton's API expects.
    """
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    prefix = f"{model}/"
    config_path = f"{prefix}config.pbtxt"
    if config_path not in files:
        raise LoadError(f"the repository has no {config_path}")
    config = text_format.Parse(files[config_path].decode(), model_config_pb2.ModelConfig())
    parameters: dict[str, str] = {
        "config": json_format.MessageToJson(config, preserving_proto_field_name=True)
    }
    for path, content in sorted(files.items()):
        if path.startswith(prefix) and path != config_path:
            parameters[f"file:{path[len(prefix) :]}"] = base64.b64encode(content).decode()
    return {"parameters": parameters}


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
