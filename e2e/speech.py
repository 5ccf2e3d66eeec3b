"""Speech as a user measures it: `voxfleet say` against an endpoint, and piper's own length.

Each stream is one `voxfleet say` process, as a user or a client application runs it: one
gRPC connection per client, so a Service spreads clients over its pods the way kube-proxy
spreads connections (streams of one gRPC connection all go to the pod it reached).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

TEXT = (
    "The quick brown fox jumps over the lazy dog. Streaming speech starts before the "
    "sentence is over."
)
LONG_TEXT = " ".join(
    [
        "A rolling update replaces every pod of the pool, one at a time.",
        "Streams that started on an old pod must finish there, with every chunk delivered.",
        "New streams go to pods that hold the voice, and none of them may fail.",
    ]
)


class SayError(AssertionError):
    """`voxfleet say` failed: the stream did not deliver its audio."""


@dataclass(frozen=True)
class Speech:
    audio_seconds: float
    first_audio_s: float
    chunks: int
    started: float  # time.monotonic() when the client process started
    finished: float  # ... and when it exited
    stream_s: float  # the stream itself, request to last chunk (the client's own timing)

    @property
    def first_audio_at(self) -> float:
        """time.monotonic() at which the first chunk arrived (the client's exit time less
        the rest of the stream; process start-up and WAV writing are not counted)."""
        return self.finished - self.stream_s + self.first_audio_s


def _voxfleet() -> str:
    local = Path(sys.executable).parent / "voxfleet"
    return str(local) if local.exists() else shutil.which("voxfleet") or "voxfleet"


def say(address: str, voice: str, text: str = TEXT, timeout: float = 180) -> Speech:
    """`voxfleet say --url ADDRESS --voice VOICE -o FILE --json TEXT`: one stream."""
    with tempfile.TemporaryDirectory(prefix="say-") as folder:
        output = Path(folder) / "speech.wav"
        started = time.monotonic()
        result = subprocess.run(
            [
                _voxfleet(),
                "say",
                "--url",
                address,
                "--voice",
                voice,
                "-o",
                str(output),
                "--json",
                text,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        finished = time.monotonic()
        if result.returncode != 0:
            raise SayError(f"voxfleet say --voice {voice} via {address}: {result.stderr.strip()}")
        report = json.loads(result.stdout.strip().splitlines()[-1])
        with wave.open(str(output), "rb") as audio:
            seconds = audio.getnframes() / float(audio.getframerate())
    assert abs(seconds - report["audio_seconds"]) < 0.01, (seconds, report)
    return Speech(
        audio_seconds=seconds,
        first_audio_s=report["first_audio_ms"] / 1000.0,
        chunks=int(report["chunks"]),
        started=started,
        finished=finished,
        stream_s=float(report["rtf"]) * seconds,
    )


def say_many(address: str, voice: str, count: int, text: str = TEXT) -> list[Speech]:
    """`count` clients at once; raises the first failure."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(say, address, voice, text) for _ in range(count)]
        return [future.result() for future in futures]


@functools.cache
def piper_seconds(text: str = TEXT, speaking_rate: float = 1.0) -> float:
    """Length of piper-tts's own one-shot synthesis of `text` with the joe voice, at the
    same speaking rate (piper's length scale is 1 / speakingRate)."""
    from piper import PiperVoice, SynthesisConfig

    from engines.text.voice import load_voice

    voice = PiperVoice.load(str(load_voice("joe").model_path))
    config = SynthesisConfig(length_scale=voice.config.length_scale / speaking_rate)
    samples = sum(len(chunk.audio_float_array) for chunk in voice.synthesize(text, config))
    return samples / float(voice.config.sample_rate)
