"""The streaming core: per-stream state and the cross-stream window scheduler.

Nothing here knows about Triton: the Triton model (engines/triton_model/model.py) feeds
`StreamScheduler.submit` and turns `StreamSink` calls into decoupled responses, and the tests
drive the same scheduler in-process.

Per stream and sentence, the encoder runs once (ids → prior frames), then the flow and the
vocoder run in windows. Window k of a sentence decodes frames [start_k, end_k); its flow chunk
is computed one vocoder context ahead, so the vocoder always has real right context. Each
window carries `flow_context_frames` / `vocoder_context_frames` of context on both sides,
zero-padded (mask 0) outside the sentence exactly as a one-shot decode pads its edges.
Every step takes the ready windows of all live streams (new streams' first windows first, then
the streams with the least audio buffered ahead of playback), runs one batched flow call and
one batched vocoder call, and sends every decoded window at once.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engines.frontend import Sentence
from engines.runtime import StageRuntime

LOGGER = logging.getLogger(__name__)
LATENT_CHANNELS = 192


@dataclass(frozen=True)
class WindowConfig:
    """Streaming windows in latent frames (one frame = hop samples, 256 at 22,050 Hz ≈ 11.6 ms).

    Defaults come from `voxfleet` measurements on the joe voice (docs/streaming.md): a small
    first window for first-audio latency, larger steady windows so the context overhead stays
    small, and enough context for > 40 dB SNR against a one-shot decode.
    """

    first_window_frames: int = 16
    window_frames: int = 128
    vocoder_context_frames: int = 8
    flow_context_frames: int = 24
    flow_chunk_frames: int = 256
    max_batch_windows: int = 64
    max_encoder_batch: int = 8

    def __post_init__(self) -> None:
        for name in (
            "flow_chunk_frames",
            "first_window_frames",
            "window_frames",
            "max_batch_windows",
            "max_encoder_batch",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("vocoder_context_frames", "flow_context_frames"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")


@dataclass(frozen=True)
class SynthesisParams:
    speaker_id: int = 0
    length_scale: float = 1.0
    noise_scale: float = 0.667
    noise_w: float = 0.8

    def scales(self) -> tuple[float, float, float]:
        return (self.noise_scale, self.length_scale, self.noise_w)


class StreamSink:
    """Where a stream's audio goes. Implementations must not block for long."""

    def audio(self, pcm: np.ndarray) -> None:  # int16 mono
        raise NotImplementedError

    def finish(self, error: Exception | None = None) -> None:
        raise NotImplementedError

    def cancelled(self) -> bool:
        return False


@dataclass
class _SentenceState:
    prior: np.ndarray  # [192, T]
    latent: np.ndarray  # [192, T], filled as the flow runs
    frames: int
    first_window_frames: int
    flowed: int = 0
    vocoded: int = 0

    def next_window(self, window_frames: int) -> tuple[int, int]:
        size = self.first_window_frames if self.vocoded == 0 else window_frames
        return self.vocoded, min(self.frames, self.vocoded + size)


@dataclass
class Stream:
    stream_id: int
    sentences: deque[Sentence]
    params: SynthesisParams
    sink: StreamSink
    arrived: float
    current: _SentenceState | None = None
    audio_seconds_sent: float = 0.0
    first_audio_at: float | None = None
    window_ready_at: float | None = None
    windows_sent: int = 0

    def buffered_seconds(self, now: float) -> float:
        """Audio sent but not yet played, if playback started with the first chunk."""
        if self.first_audio_at is None:
            return 0.0
        return self.audio_seconds_sent - (now - self.first_audio_at)


@dataclass
class SchedulerStats:
    live_streams: int = 0
    streams_total: int = 0
    first_audio_seconds_sum: float = 0.0
    first_audio_count: int = 0
    queue_seconds_sum: float = 0.0
    queue_count: int = 0
    underrun_risk_streams: int = 0
    vocoder_batches: dict[int, int] = field(default_factory=dict)


class StreamScheduler:
    """Owns all live streams of one voice and one thread that steps them."""

    def __init__(
        self,
        runtime: StageRuntime,
        sample_rate: int,
        hop_length: int = 256,
        windows: WindowConfig | None = None,
        cross_stream_batching: bool = True,
        on_step: Callable[[SchedulerStats], None] | None = None,
    ) -> None:
        self.runtime = runtime
        self.sample_rate = sample_rate
        self.hop = hop_length
        self.windows = windows or WindowConfig()
        self.batching = cross_stream_batching
        self.stats = SchedulerStats()
        self._on_step = on_step
        self._incoming: deque[Stream] = deque()
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count(1)
        self._wake = threading.Condition()
        self._running = False
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._loop, name="voxfleet-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._running = False
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for stream in [*self._incoming, *self._streams.values()]:
            stream.sink.finish(RuntimeError("the server is shutting down"))
        self._incoming.clear()
        self._streams.clear()

    def submit(self, sentences: list[Sentence], params: SynthesisParams, sink: StreamSink) -> int:
        stream = Stream(next(self._ids), deque(sentences), params, sink, time.monotonic())
        with self._wake:
            self._incoming.append(stream)
            self._wake.notify()
        return stream.stream_id

    def live_streams(self) -> int:
        return len(self._streams) + len(self._incoming)

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._wake:
                while self._running and not self._incoming and not self._streams:
                    self._wake.wait()
                if not self._running:
                    return
                while self._incoming:
                    stream = self._incoming.popleft()
                    self._streams[stream.stream_id] = stream
                    self.stats.streams_total += 1
            try:
                self.step()
            except Exception as error:  # a broken step must not take other voices down
                LOGGER.exception("scheduler step failed")
                for stream in list(self._streams.values()):
                    self._close(stream, RuntimeError(f"synthesis failed: {error}"))

    def step(self) -> None:
        self._drop_cancelled()
        self._encode_pending()
        selected = self._select_windows()
        if selected:
            if self.batching:
                self._run_windows(selected)
            else:
                for stream in selected:
                    self._run_windows([stream])
        self._publish_stats()

    def _close(self, stream: Stream, error: Exception | None = None) -> None:
        self._streams.pop(stream.stream_id, None)
        try:
            stream.sink.finish(error)
        except Exception:  # the client may be gone already
            LOGGER.debug("finishing stream %s failed", stream.stream_id, exc_info=True)

    def _drop_cancelled(self) -> None:
        for stream in list(self._streams.values()):
            if stream.sink.cancelled():
                self._streams.pop(stream.stream_id, None)

    # -- encoder: one call per group of sentences sharing scales ------------------------------
    def _encode_pending(self) -> None:
        waiting = [s for s in self._streams.values() if s.current is None]
        for stream in [s for s in waiting if not s.sentences]:
            self._close(stream)
        waiting = [s for s in waiting if s.sentences]
        # New streams (no audio yet) first: their first sentence is on the first-audio path.
        waiting.sort(key=lambda s: (s.first_audio_at is not None, s.arrived))
        waiting = waiting[: self.windows.max_encoder_batch if self.batching else 1]
        groups: dict[tuple[float, float, float, int], list[Stream]] = {}
        for stream in waiting:
            key = (*stream.params.scales(), stream.params.speaker_id)
            groups.setdefault(key, []).append(stream)
        for (noise, length, noise_w, _), streams in groups.items():
            sentences = [stream.sentences.popleft() for stream in streams]
            longest = max(len(s.ids) for s in sentences)
            ids = np.zeros((len(sentences), longest), dtype=np.int64)
            for row, sentence in enumerate(sentences):
                ids[row, : len(sentence.ids)] = sentence.ids
            lengths = np.array([len(s.ids) for s in sentences], dtype=np.int64)
            speakers = np.array([s.params.speaker_id for s in streams], dtype=np.int64)
            prior, mask = self.runtime.encode(
                ids, lengths, np.array([noise, length, noise_w], dtype=np.float32), speakers
            )
            frames = mask[:, 0, :].sum(axis=1).astype(np.int64)
            for row, stream in enumerate(streams):
                count = int(frames[row])
                first = (
                    self.windows.first_window_frames
                    if stream.first_audio_at is None and stream.windows_sent == 0
                    else self.windows.window_frames
                )
                stream.current = _SentenceState(
                    prior=np.ascontiguousarray(prior[row, :, :count]),
                    latent=np.zeros((LATENT_CHANNELS, count), dtype=np.float32),
                    frames=count,
                    first_window_frames=first,
                )
                stream.window_ready_at = time.monotonic()

    # -- window selection ---------------------------------------------------------------------
    def _select_windows(self) -> list[Stream]:
        now = time.monotonic()
        ready = [s for s in self._streams.values() if s.current is not None]
        limit = self.windows.max_batch_windows if self.batching else len(ready)
        return heapq.nsmallest(
            limit,
            ready,
            key=lambda s: (s.first_audio_at is not None, s.buffered_seconds(now), s.arrived),
        )

    # -- flow + vocoder for one batch of windows -----------------------------------------------
    def _run_windows(self, streams: list[Stream]) -> None:
        cfg = self.windows
        started = time.monotonic()
        for stream in streams:
            if stream.window_ready_at is not None:
                self.stats.queue_seconds_sum += started - stream.window_ready_at
                self.stats.queue_count += 1
        flow_ranges = []
        for stream in streams:
            state = stream.current
            assert state is not None
            _, end = state.next_window(cfg.window_frames)
            needed = min(state.frames, end + cfg.vocoder_context_frames)
            if state.flowed >= needed:
                flow_ranges.append((state.flowed, state.flowed))
            elif state.flowed == 0 and state.first_window_frames == cfg.first_window_frames:
                # The stream's very first chunk: only what the first window needs.
                flow_ranges.append((0, needed))
            else:
                target = min(state.frames, max(needed, state.flowed + cfg.flow_chunk_frames))
                flow_ranges.append((state.flowed, target))
        self._flow(streams, flow_ranges)
        windows = [s.current.next_window(cfg.window_frames) for s in streams if s.current]
        audio = self._vocode(streams, windows)
        now = time.monotonic()
        for stream, (_, end), pcm in zip(streams, windows, audio, strict=True):
            state = stream.current
            assert state is not None
            state.vocoded = end
            if stream.first_audio_at is None:
                stream.first_audio_at = now
                self.stats.first_audio_seconds_sum += now - stream.arrived
                self.stats.first_audio_count += 1
            stream.audio_seconds_sent += len(pcm) / self.sample_rate
            stream.windows_sent += 1
            stream.window_ready_at = now
            try:
                stream.sink.audio(pcm)
            except Exception:
                LOGGER.debug("sending to stream %s failed; dropping it", stream.stream_id)
                self._streams.pop(stream.stream_id, None)
                continue
            if state.vocoded >= state.frames:
                stream.current = None
                if not stream.sentences:
                    self._close(stream)

    def _flow(self, streams: list[Stream], ranges: list[tuple[int, int]]) -> None:
        context = self.windows.flow_context_frames
        todo = [(s, a, b) for s, (a, b) in zip(streams, ranges, strict=True) if b > a]
        if not todo:
            return
        width = max(b - a for _, a, b in todo) + 2 * context
        prior = np.zeros((len(todo), LATENT_CHANNELS, width), dtype=np.float32)
        mask = np.zeros((len(todo), 1, width), dtype=np.float32)
        for row, (stream, start, end) in enumerate(todo):
            state = stream.current
            assert state is not None
            lo, hi = max(0, start - context), min(state.frames, end + context)
            offset = lo - (start - context)
            prior[row, :, offset : offset + hi - lo] = state.prior[:, lo:hi]
            mask[row, 0, offset : offset + hi - lo] = 1.0
        speakers = np.array([s.params.speaker_id for s, _, _ in todo], dtype=np.int64)
        latent = self.runtime.flow(prior, mask, speakers)
        for row, (stream, start, end) in enumerate(todo):
            state = stream.current
            assert state is not None
            state.latent[:, start:end] = latent[row, :, context : context + end - start]
            state.flowed = end

    def _vocode(self, streams: list[Stream], windows: list[tuple[int, int]]) -> list[np.ndarray]:
        context = self.windows.vocoder_context_frames
        width = max(end - start for start, end in windows) + 2 * context
        latent = np.zeros((len(streams), LATENT_CHANNELS, width), dtype=np.float32)
        for row, (stream, (start, end)) in enumerate(zip(streams, windows, strict=True)):
            state = stream.current
            assert state is not None
            lo, hi = max(0, start - context), min(state.frames, end + context)
            offset = lo - (start - context)
            latent[row, :, offset : offset + hi - lo] = state.latent[:, lo:hi]
        speakers = np.array([s.params.speaker_id for s in streams], dtype=np.int64)
        audio = self.runtime.vocode(latent, speakers)
        self.stats.vocoder_batches[len(streams)] = (
            self.stats.vocoder_batches.get(len(streams), 0) + 1
        )
        out = []
        for row, (start, end) in enumerate(windows):
            samples = audio[row, context * self.hop : (context + end - start) * self.hop]
            out.append(to_pcm16(samples))
        return out

    def _publish_stats(self) -> None:
        now = time.monotonic()
        window_seconds = self.windows.window_frames * self.hop / self.sample_rate
        self.stats.live_streams = len(self._streams) + len(self._incoming)
        self.stats.underrun_risk_streams = sum(
            1
            for s in self._streams.values()
            if s.first_audio_at is not None and s.buffered_seconds(now) < window_seconds
        )
        if self._on_step is not None:
            self._on_step(self.stats)


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)
