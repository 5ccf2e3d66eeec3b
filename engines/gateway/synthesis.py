"""A voice's speech as 24 kHz samples: voice resolution, pod choice, speed, long texts.

`Synthesizer.stream` takes a resolved voice and text, and yields int16 samples at the asked
rate as the pods send them. Each stream goes to the pod `engines.client.balancing` picks, and is
tried on another pod when one refuses before any audio. A text longer than a pod takes in
one request (`max_text_bytes`) is spoken in pieces cut between sentences, one after another.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np

from engines.client.balancing import Balancer, stream_balanced
from engines.contract.plan import DEFAULT_MAX_TEXT_BYTES
from engines.gateway.audio import StreamResampler
from engines.gateway.directory import Directory
from engines.gateway.errors import ApiError, UpstreamError
from engines.gateway.sentences import pack
from engines.gateway.upstream import Audio, Upstreams

RATE_TTL_S = 60.0
# How often the channels and counts of pods that are gone are let go.
PRUNE_INTERVAL_S = 30.0


def _code_of(error: BaseException) -> str | None:
    return error.code if isinstance(error, UpstreamError) else None


@dataclass
class Synthesizer:
    directory: Directory
    upstreams: Upstreams
    balancer: Balancer
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES

    def __post_init__(self) -> None:
        self._rates: dict[str, tuple[float, float]] = {}  # voice -> (rate, read at)
        self._pruned_at = time.monotonic()

    async def _prune(self) -> None:
        """Close the channels of pods no voice resolves to any more (and forget their counts),
        keeping those that still have streams in flight."""
        if time.monotonic() - self._pruned_at < PRUNE_INTERVAL_S:
            return
        self._pruned_at = time.monotonic()
        keep = {e for v in await self.directory.voices() for e in self.directory.endpoints_now(v)}
        keep |= {e for e, c in self.balancer.counts().items() if c.in_flight}
        self.balancer.forget(keep)
        self.upstreams.forget(keep)

    async def resolve(self, requested: str) -> str:
        """The voice a request names; ApiError 404 when none, 503 when none can be asked."""
        known = await self.directory.voices()
        if not known and not await self.directory.reachable():
            raise ApiError(
                503,
                "no voice server can be reached now; try again shortly",
                "service_unavailable",
                None,
                "no_ready_pod",
            )
        return self.directory.table.resolve(requested, known)

    async def length_scale(self, voice: str, speed: float) -> float | None:
        """LENGTH_SCALE for `speed` times the voice's own rate; None (the voice's default)
        at speed 1. The rate is the voice's serving plan's (TTSVoice speakingRate)."""
        if speed == 1.0:
            return None
        rate = 1.0
        cached = self._rates.get(voice)
        if cached is not None and time.monotonic() - cached[1] < RATE_TTL_S:
            rate = cached[0]
        else:
            for endpoint in self.directory.endpoints_now(voice)[:1]:
                try:
                    rate = await self.upstreams.speaking_rate(endpoint, voice)
                except UpstreamError:
                    break
                self._rates[voice] = (rate, time.monotonic())
        return self.directory.table.length_scale(voice) / (rate * speed)

    async def stream(
        self, voice: str, text: str, speed: float = 1.0, rate: int = 24000
    ) -> AsyncIterator[np.ndarray]:
        """int16 mono samples at `rate`, chunk by chunk; raises balancing's errors or
        UpstreamError."""
        await self.directory.endpoints(voice)  # fresh before the first choice
        await self._prune()
        scale = await self.length_scale(voice, speed)
        resampler = StreamResampler(rate)
        limit = self.directory.table.max_text_bytes(voice, self.max_text_bytes)
        for piece in pack(text, limit):

            def open_stream(endpoint: str, piece: str = piece) -> AsyncIterator[Audio]:
                return self.upstreams.stream(endpoint, voice, piece, scale)

            chunks = stream_balanced(
                self.balancer,
                voice,
                lambda: self.directory.endpoints_now(voice),
                open_stream,
                _code_of,
            )
            try:
                async for audio in chunks:
                    samples = resampler.push(audio.samples, audio.sample_rate)
                    if samples.size:
                        yield samples
            finally:
                await chunks.aclose()  # type: ignore[attr-defined]
        tail = resampler.finish()
        if tail.size:
            yield tail


def new_balancer() -> Balancer:
    return Balancer()
