"""The speech API a voice agent speaks: OpenAI's `POST /v1/audio/speech` through the gateway
Service the operator renders for the namespace (`speechApi.enabled` in the e2e values), to
joe's pods, streamed, as long as piper's own synthesis of the text.

Runs after the first day's scenarios (test_kubectl_to_audio.py), which leave joe Ready.
"""

from __future__ import annotations

import io
import json
import urllib.error
import urllib.request
import wave
from typing import Any

from e2e_support import NAMESPACE, eventually
from installation import Installation
from speech import TEXT, piper_seconds
from voices import ready_voice, voice

GATEWAY = f"voxfleet-speech-api.{NAMESPACE}.svc:8080"


def test_joe_speaks_through_the_gateway_service(installation: Installation) -> None:
    kubectl = installation.kubectl
    if kubectl.get("ttsv", "joe") is None:
        kubectl.apply(voice("joe"))
    ready_voice(installation, "joe", timeout=300)
    eventually(
        lambda: (
            (kubectl.get("deployment", "voxfleet-speech-api") or {})
            .get("status", {})
            .get("availableReplicas")
        ),
        timeout=180,
        what="the speech API gateway is available",
    )

    body = {"model": "tts-1", "voice": "joe", "response_format": "wav", "input": TEXT}

    def speak() -> Any:
        with installation.reach_service(GATEWAY) as address:
            request = urllib.request.Request(
                f"http://{address}/v1/audio/speech",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            try:
                with urllib.request.urlopen(request, timeout=120) as reply:
                    return reply.headers.get("Content-Type"), reply.read()
            except (urllib.error.URLError, OSError) as error:  # not there yet: poll again
                detail = error.read().decode() if isinstance(error, urllib.error.HTTPError) else ""
                raise AssertionError(f"{error} {detail}") from None

    # The gateway finds joe's pods through its headless Service once they are in it.
    content_type, audio = eventually(speak, timeout=120, what="speech through the gateway")
    assert content_type.startswith("audio/wav"), content_type
    with wave.open(io.BytesIO(audio), "rb") as wav:
        rate, width, channels = wav.getframerate(), wav.getsampwidth(), wav.getnchannels()
    # A streamed WAV leaves its sizes unknown: its samples are what follows the data header.
    samples = len(audio) - (audio.index(b"data") + 8)
    seconds = samples / (width * channels * rate)
    assert rate == 24_000
    reference = piper_seconds(TEXT)
    assert abs(seconds - reference) <= 0.10 * reference, (seconds, reference)
