"""What the stream model's parts share: a request's parameters, where its audio goes, and the
state of each live stream and sentence."""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from engines.text.frontend import Sentence


class StreamCancelled(Exception):
    """The client went away; the stream is closed without audio."""


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

    def last_audio(self, pcm: np.ndarray) -> None:
        """The stream's last chunk; `finish(None)` follows it. A sink whose protocol can carry
        the end with the last chunk does so here (engines/pod/triton_model/responses.py)."""
        self.audio(pcm)

    def finish(self, error: Exception | None = None) -> None:
        raise NotImplementedError

    def cancelled(self) -> bool:
        return False

    def chunk_route(self) -> tuple[ChunkReceiver, Any] | None:
        """Where this stream's chunks may go together with other streams' (a receiver, and
        this stream's key there), so that a vocoder call's chunks leave in one message per
        receiver; None: chunk by chunk (`audio`, `last_audio`)."""
        return None


class ChunkReceiver(Protocol):
    """Takes several streams' chunks at once: (key, int16 PCM, whether it is the stream's
    last chunk) each, in order (engines/pod/voice_host/server.py, one message per call)."""

    def send_chunks(self, chunks: list[tuple[Any, np.ndarray, bool]]) -> None: ...


@dataclass(eq=False)
class VoiceSlot:
    """One of the voices a scheduler serves: its name, its weights as the stream backend
    knows them (`weights`, passed to every stage call of its streams; None: the runtime's own
    voice) and its own stats. Each voice's rows run with its own weights
    (engines/runtimes/torch_cuda/weights.py): streams of different voices share a vocoder call
    only where the backend groups voices (`BackendFeatures.groups_voices`), and no other
    stage call. Slots that hold the same weights (one voice's instances in the voice host)
    share calls as one voice, and each keeps its own stats (`call_voice`)."""

    name: str
    weights: Any = None
    stats: SchedulerStats = field(default_factory=lambda: SchedulerStats())
    # Its own lead limit (its plan's `max_lead_ms`), where the voices of a scheduler differ;
    # None: the scheduler's plan's.
    max_lead_ms: int | None = None


def call_voice(voice: VoiceSlot | None) -> Hashable:
    """What rows must share to share a stage call that splits by voice: the weights they run
    with, by identity, so that slots holding one voice's weights (its instances) share calls;
    a slot without weights is a voice of its own, and None the runtime's own voice."""
    if voice is None:
        return None
    return voice if voice.weights is None else id(voice.weights)


@dataclass
class SentenceState:
    pages: np.ndarray  # page table of its prior and latent frames (engines.streaming.frames)
    frames: int
    flowed: int = 0
    vocoded: int = 0


@dataclass
class Stream:
    stream_id: int
    sentences: deque[Sentence]
    params: SynthesisParams
    sink: StreamSink
    arrived: float
    current: SentenceState | None = None
    audio_seconds_sent: float = 0.0
    first_audio_at: float | None = None
    window_ready_at: float | None = None
    windows_sent: int = 0
    cancel_checked_at: float = 0.0
    # When the request reached the server, before its text was phonemised (`arrived` is when
    # the scheduler got it), and when its first sentence's frames were stored: the first
    # audio's path (`FirstAudioPaths`).
    received: float | None = None
    encoded_at: float | None = None
    # The voice it speaks with, where the scheduler serves several (None: its only voice).
    voice: VoiceSlot | None = None
    # The most audio it may have ahead of its listener, seconds (its voice's
    # `streaming.maxLeadMs`; None: the scheduler's plan's, 0: no limit).
    lead_limit_s: float | None = None

    @property
    def requested(self) -> float:
        """When the request reached the server (`received`, else when the scheduler got it):
        where its first-audio time (the `voxfleet_first_audio_seconds` histogram) starts."""
        return self.received if self.received is not None else self.arrived

    def buffered_seconds(self, now: float) -> float:
        """Audio sent but not yet played, if playback started with the first chunk."""
        if self.first_audio_at is None:
            return 0.0
        return self.audio_seconds_sent - (now - self.first_audio_at)

    def deadline(self, first_audio_s: float) -> float:
        """When the listener's audio runs out; a new stream's first audio is due
        `first_audio_s` after it arrived (the planner's `WindowRules.first_audio_s`)."""
        if self.first_audio_at is None:
            return self.arrived + first_audio_s
        return self.first_audio_at + self.audio_seconds_sent


@dataclass
class Window:
    """One stream's work in a step: a flow chunk (maybe empty) and a vocoder window. `size`:
    the window size its vocoder call is cut for, where it rides a call of its voice wider than
    its own frames need (`planner.widened`); 0: their size class."""

    stream: Stream
    flow: tuple[int, int]
    decode: tuple[int, int]
    size: int = 0

    @property
    def state(self) -> SentenceState:
        state = self.stream.current
        assert state is not None
        return state


STEP_PARTS = ("prepare", "plan", "windows", "encode", "publish", "wait", "idle")


@dataclass
class StepTimes:
    """Where the scheduler thread's wall time goes, summed over its steps (seconds): taking up
    finished calls and cancelled streams (prepare), planning, launching or running windows,
    encoding (with its wait for the frame counts), publishing stats, waiting for the step in
    flight on the device (wait), and waiting for work (idle); with the thread's own CPU time
    over its steps (cpu), and by part (`cpu_parts`, all but idle). Wall time a part spends off
    the CPU is a wait: for the device, or for the GIL."""

    steps: int = 0
    cpu: float = 0.0
    wall: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STEP_PARTS, 0.0))
    cpu_parts: dict[str, float] = field(
        default_factory=lambda: {part: 0.0 for part in STEP_PARTS if part != "idle"}
    )

    def busy_seconds(self) -> float:
        """Wall time spent on steps, waits for the device included: all but `idle`."""
        return sum(seconds for part, seconds in self.wall.items() if part != "idle")

    def report(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "cpu_s": round(self.cpu, 3),
            **{f"{part}_s": round(seconds, 3) for part, seconds in self.wall.items()},
            **{f"{part}_cpu_s": round(seconds, 3) for part, seconds in self.cpu_parts.items()},
        }


FIRST_AUDIO_PARTS = ("frontend", "admission", "first_window", "delivery")


class FirstAudioPaths:
    """Where each new stream's first audio spent its time, for profiling runs (the call log,
    VOXFLEET_COSTS_LOG_S): from the request to the scheduler (the phonemiser: `frontend`),
    to its first sentence's frames stored (waiting for and running an encoder call:
    `admission`), to its first window launched (`first_window`), to its audio handed to its
    sink (`delivery`). Bounded: the oldest are dropped when nobody takes them (`take`)."""

    def __init__(self, limit: int = 20_000) -> None:
        self._paths: deque[tuple[float, ...]] = deque(maxlen=limit)

    def add(self, stream: Stream, delivered: float) -> None:
        arrived, launched, received = stream.arrived, stream.first_audio_at, stream.requested
        if launched is None:
            return
        encoded = stream.encoded_at if stream.encoded_at is not None else launched
        self._paths.append(
            (arrived - received, encoded - arrived, launched - encoded, delivered - launched)
        )

    def take(self) -> dict[str, Any]:
        """Milliseconds, p50 and p95 of each part and of their sum, over the paths added since
        the last call (which it takes): {"n": count, part: [p50, p95], ..., "total": [...]}."""
        paths = [self._paths.popleft() for _ in range(len(self._paths))]
        summary: dict[str, Any] = {"n": len(paths)}
        if not paths:
            return summary
        table = np.array(paths) * 1000.0
        columns = {**dict(zip(FIRST_AUDIO_PARTS, table.T, strict=True)), "total": table.sum(axis=1)}
        for name, values in columns.items():
            summary[name] = [round(float(np.percentile(values, q)), 1) for q in (50, 95)]
        return summary


@dataclass
class SchedulerStats:
    live_streams: int = 0
    # Live streams integrated over time (stream-seconds): its rate over a window is the mean
    # number of live streams in it, every moment counted, not the few a scrape samples.
    stream_seconds: float = 0.0
    streams_total: int = 0
    first_audio_seconds_sum: float = 0.0
    first_audio_count: int = 0
    # Each new stream's first-audio time, until the metrics publisher takes them (a histogram
    # needs every observation); bounded, so a scheduler nobody publishes stays small.
    first_audio_samples: list[float] = field(default_factory=list)
    queue_seconds_sum: float = 0.0
    queue_count: int = 0
    underrun_risk_streams: int = 0
    # Chunks sent to a playing stream after its audio ran out, by the scheduler's clock
    # (playback from the first chunk on): underruns as the server sees them.
    late_chunks: int = 0
    vocoder_batches: dict[int, int] = field(default_factory=dict)
    # Set by the voice host for every voice of an architecture: its live streams over the
    # real-time streams it holds (1.0: full), those streams by its own measurement (0: not
    # measured yet), and the voice's streams it refused for being full.
    load_ratio: float = 0.0
    capacity_streams: int = 0
    refused_streams: int = 0
