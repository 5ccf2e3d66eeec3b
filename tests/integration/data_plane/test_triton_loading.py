"""Loading voices the operator's way into a real tritonserver started with the pool's flags.

The server gets the Triton Deployment's own arguments (explicit model control, repository API
restricted to the `voxfleet-key` header) and an empty model repository; the voices are planned
for a CPU pool (onnxruntime), their engines published in a local engine cache that stands in
for the cluster's engine-cache volume.
"""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiohttp
import psutil
import pytest
from voxfleet_operator import loading
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.render.pool import KEY_ENV, triton_args
from voxfleet_operator.voice_plan import serving_plan, voice_engine_key
from voxfleet_operator.voices import parse_voice

from engines.build.engine_build import build_engines, publish_entry
from engines.client.tts import SynthesisError, synthesize
from engines.contract.names import PLAN_PARAMETER
from engines.contract.plan import ServingPlan
from engines.pod.supervisor import stub_of
from engines.pod.triton_server import TritonServer
from engines.text.voice import load_voice

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


CPU_POOL = Pool(name="cpu", runtime="onnxruntime")
SOURCE = {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32}
TEXT = "The quick brown fox jumps over the lazy dog, and the dog does not mind at all."


def published_plan(name: str, spec: dict[str, object], cache: Path) -> ServingPlan:
    """A voice's serving plan on a CPU pool, its engines built and published as the engine
    Job would publish them, in a local engine cache standing in for the PVC."""
    voice = parse_voice(name, "tts", spec, PoolsConfig(default_pool="cpu", pools=[CPU_POOL]))
    key = voice_engine_key(voice.spec, CPU_POOL)
    entry = build_engines(load_voice("joe").model_path, "onnxruntime", None, cache)
    publish_entry(entry.path, key)
    return serving_plan(name, voice.spec, CPU_POOL, key, mount=str(cache))


async def test_spec_values_reach_the_stream_model_unchanged_through_a_real_load(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "engines"
    fast = published_plan(
        "joe-fast",
        {
            "source": SOURCE,
            "speakingRate": 1.25,
            "limits": {"maxTextBytes": 1000, "maxConcurrentStreams": 1},
            "batching": {"maxBatchSize": 1},
        },
        cache,
    )
    # Two stream-model instances, as a large GPU's pool would run it.
    plain = published_plan("joe", {"source": SOURCE, "batching": {"instances": 2}}, cache)

    args = [a.replace(f"$({KEY_ENV})", KEY) for a in triton_args() if not a.startswith(OWN_FLAGS)]
    repository = tmp_path / "models"
    repository.mkdir()
    (tmp_path / "triton").mkdir()
    with TritonServer(repository, extra_args=args, work_dir=tmp_path / "triton") as server:
        async with aiohttp.ClientSession() as http:
            body = loading.load_request(fast)
            with pytest.raises(loading.LoadError) as refused:
                await loading.load_voice(http, server.http_url, "joe-fast", body, "wrong-key")
            assert "HTTP 403" in str(refused.value)
            assert not model_ready(server, "joe-fast")

            for plan in (fast, plain):
                await loading.load_voice(
                    http, server.http_url, plan.name, loading.load_request(plan), KEY
                )
                assert model_ready(server, plan.name)

            # The model reports the plan it was given: the spec's values, unchanged.
            with urllib.request.urlopen(f"{server.http_url}/v2/models/joe-fast/config") as reply:
                config = json.loads(reply.read())
            loaded = ServingPlan.from_json(config["parameters"][PLAN_PARAMETER]["string_value"])
            assert loaded == fast
            assert (loaded.max_text_bytes, loaded.max_streams_per_pod) == (1000, 1)
            assert loaded.speaking_rate == 1.25

            # batching.instances: Triton runs that many stream-model processes for the voice.
            assert plain.instances == 2 and fast.instances == 1
            assert server.process is not None
            stubs = [stub_of(child) for child in psutil.Process(server.process.pid).children()]
            served = sorted(stub.model for stub in stubs if stub is not None)
            assert served == ["joe", "joe", "joe-fast"]

            # ... and behaves by them: rate, text limit and stream limit.
            # Without noise, durations are deterministic: the fast voice's default pace is the
            # plain voice asked for Piper's length scale 1 / 1.25 (joe's own scale is 1).
            quiet = {"noise_scale": 0.0, "noise_w": 0.0}
            faster = synthesize(server.grpc_url, TEXT, voice="joe-fast", **quiet)
            asked = synthesize(server.grpc_url, TEXT, voice="joe", length_scale=0.8, **quiet)
            normal = synthesize(server.grpc_url, TEXT, voice="joe", **quiet)
            assert faster.sample_rate == 22050
            assert abs(faster.audio_seconds - asked.audio_seconds) < 0.02
            assert faster.audio_seconds < 0.95 * normal.audio_seconds
            with pytest.raises(SynthesisError) as too_long:
                synthesize(server.grpc_url, "x" * 1001, voice="joe-fast")
            assert too_long.value.code == "INVALID_ARGUMENT"
            assert "the limit is 1000 bytes" in str(too_long.value)
            with ThreadPoolExecutor(2) as pool:
                # About 40 s of speech: live for seconds while it is decoded.
                first = pool.submit(synthesize, server.grpc_url, TEXT * 12, voice="joe-fast")
                time.sleep(0.3)
                with pytest.raises(SynthesisError) as busy:
                    # (Asked once: the client would otherwise ask again until the first ends.)
                    synthesize(
                        server.grpc_url, "A second listener.", voice="joe-fast", refused_retry_s=0
                    )
                assert first.result().audio_seconds > 20
            assert busy.value.code == "RESOURCE_EXHAUSTED"
            assert "limit of 1 streams" in str(busy.value)

            await loading.unload_voice(http, server.http_url, "joe-fast", KEY)
            assert not model_ready(server, "joe-fast")
            assert model_ready(server, "joe")
