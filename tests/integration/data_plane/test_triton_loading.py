"""Loading a voice the operator's way into a real tritonserver started with the pool's flags.

The server gets the Triton Deployment's own arguments (explicit model control, repository API
restricted to the `voxfleet-key` header), an empty model repository, and the joe voice's
onnxruntime engines on local disk in place of the cluster's TensorRT engine cache.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from voxfleet_operator import loading
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.render.pool import KEY_ENV, triton_args
from voxfleet_operator.voices import parse_voice

from engines.engine_build import build_engines
from engines.triton_server import TritonServer
from engines.voice import load_voice

pytestmark = pytest.mark.triton

KEY = "a-repository-key"
# TritonServer sets these itself (free ports, the test's repository, its exit timeout).
OWN_FLAGS = (
    "--model-repository",
    "--grpc-port",
    "--http-port",
    "--metrics-port",
    "--exit-timeout-secs",
)


def model_ready(server: TritonServer, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"{server.http_url}/v2/models/{model}/ready", timeout=5):
            return True
    except OSError:
        return False


async def test_voice_loads_only_with_the_key_and_then_streams(tmp_path: Path) -> None:
    joe = load_voice("joe")
    entry = build_engines(joe.model_path, "onnxruntime", None, tmp_path / "engines")
    pools = PoolsConfig(default_pool="t4", pools=[Pool(name="t4")])
    voice = parse_voice(
        "joe",
        "tts",
        {
            "source": {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32},
            "speakingRate": 1.25,
            "limits": {"maxTextBytes": 200},
        },
        pools,
    )
    plan = loading.serving_plan(voice, pools.get(None), "key")
    # What the engine Job publishes in the cluster lives on local disk here.
    plan.update(
        engine_dir=str(entry.path), voice_config_path=str(joe.config_path), runtime="onnxruntime"
    )
    body = loading.load_request("joe", loading.model_repository_files(plan))
    config = json.loads(body["parameters"]["config"])
    assert config["name"] == "joe" and config["model_transaction_policy"]["decoupled"] is True

    args = [a.replace(f"$({KEY_ENV})", KEY) for a in triton_args() if not a.startswith(OWN_FLAGS)]
    repository = tmp_path / "models"
    repository.mkdir()
    (tmp_path / "triton").mkdir()
    with TritonServer(repository, extra_args=args, work_dir=tmp_path / "triton") as server:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(loading.LoadError) as refused:
                await loading.load_voice(http, server.http_url, "joe", body, "wrong-key")
            assert "HTTP 403" in str(refused.value)
            assert not model_ready(server, "joe")

            await loading.load_voice(http, server.http_url, "joe", body, KEY)
            assert model_ready(server, "joe")

            from engines.client import SynthesisError, synthesize

            result = synthesize(server.grpc_url, "Loaded by the operator.", voice="joe")
            assert result.sample_rate == 22050 and result.audio_seconds > 0.5
            # The voice's limits came with the load: too long a text is refused.
            with pytest.raises(SynthesisError) as too_long:
                synthesize(server.grpc_url, "x" * 300, voice="joe")
            assert "200" in str(too_long.value)

            await loading.unload_voice(http, server.http_url, "joe", KEY)
            assert not model_ready(server, "joe")
