"""Speech as a user measures it: streams through `voxfleet say`'s client, and piper's length."""

from __future__ import annotations

import functools
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Speech:
    audio_seconds: float
    first_audio_s: float
    chunks: int
    sample_rate: int
    started: float  # time.monotonic() when the request was sent
    finished: float


def say(address: str, voice: str, text: str = TEXT) -> Speech:
    """One stream from a voice's gRPC endpoint, as `voxfleet say --url ADDRESS` sends it."""
    from engines.client import synthesize

    started = time.monotonic()
    result = synthesize(address, text, voice=voice)
    return Speech(
        audio_seconds=result.audio_seconds,
        first_audio_s=result.first_audio_s or 0.0,
        chunks=len(result.chunks),
        sample_rate=result.sample_rate,
        started=started,
        finished=time.monotonic(),
    )


def say_many(address: str, voice: str, count: int, text: str = TEXT) -> list[Speech]:
    """`count` concurrent streams; raises the first stream error."""
    with ThreadPoolExecutor(max_workers=count) as pool:
        futures = [pool.submit(say, address, voice, text) for _ in range(count)]
        return [future.result(timeout=300) for future in futures]


@functools.cache
def piper_seconds(text: str = TEXT) -> float:
    """Length of piper-tts's own one-shot synthesis of `text` with the joe voice."""
    from piper import PiperVoice

    from engines.voice import load_voice

    voice = PiperVoice.load(str(load_voice("joe").model_path))
    samples = sum(len(chunk.audio_float_array) for chunk in voice.synthesize(text))
    return samples / float(voice.config.sample_rate)
