"""Two real joe servers behind one gateway: a pod at its stream limit refuses
(RESOURCE_EXHAUSTED), the gateway retries the stream on the other pod and counts the
refusal; with no other pod the client gets OpenAI's 429."""

from __future__ import annotations

import contextlib
import re
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from gateway import running_gateway

from engines.client.tts import synthesize
from engines.pod.triton_server import TritonServer

pytestmark = pytest.mark.triton

HOLDING_TEXT = " ".join(["This long reading keeps the only stream slot of the pod busy."] * 3)


@contextlib.contextmanager
def held(server: TritonServer) -> Iterator[None]:
    """One stream kept open on `server` (directly over gRPC) while the block runs."""
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (synthesize(server.grpc_url, HOLDING_TEXT), done.set())
    )
    thread.start()
    try:
        # Its first audio means the server counts it as live.
        wait_live(server)
        yield
        assert not done.is_set(), "the held stream ended before the block did"
    finally:
        thread.join(timeout=60)


def wait_live(server: TritonServer) -> None:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
            text = response.read().decode()
        match = re.search(r'^voxfleet_live_streams\{model="joe"\} ([0-9.e+-]+)$', text, re.M)
        if match and float(match.group(1)) >= 1:
            return
        time.sleep(0.05)
    raise AssertionError("the held stream never went live")


def speak(base: str) -> bytes:
    sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    with sdk.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input="Short and sweet.", response_format="pcm"
    ) as response:
        return response.read()


def gateway_metric(base: str, name: str, endpoint: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf'^{name}{{endpoint="{re.escape(endpoint)}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_a_voice_at_its_limit_on_its_only_pod_is_429(
    busy_server: TritonServer, tmp_path: Path
) -> None:
    with running_gateway("--upstream", busy_server.grpc_url, log=tmp_path / "g.log") as base:
        with held(busy_server):
            with pytest.raises(openai.RateLimitError) as refused:
                speak(base)
        body = refused.value.response.json()["error"]
        assert body["code"] == "voice_at_capacity" and "stream limit" in body["message"]
        assert gateway_metric(base, "voxfleet_gateway_refusals_total", busy_server.grpc_url) == 1
        assert len(speak(base)) > 0  # the slot is free again: served


def test_a_refused_stream_is_retried_on_the_other_pod(
    server: TritonServer, busy_server: TritonServer, tmp_path: Path
) -> None:
    upstreams = ("--upstream", busy_server.grpc_url, "--upstream", server.grpc_url)
    with running_gateway(*upstreams, log=tmp_path / "g.log") as base:
        with held(busy_server):
            # One at a time: ties go round-robin, so the busy pod is asked first at least once.
            for _ in range(4):
                assert len(speak(base)) > 0
        refusals = gateway_metric(base, "voxfleet_gateway_refusals_total", busy_server.grpc_url)
        assert refusals >= 1
        assert gateway_metric(base, "voxfleet_gateway_streams_total", server.grpc_url) == 4
        assert gateway_metric(base, "voxfleet_gateway_streams_in_flight", server.grpc_url) == 0
