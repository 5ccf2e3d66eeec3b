"""The streaming core: per-stream state and the cross-stream window scheduler.

Nothing here knows about Triton: the Triton model (engines/triton_model/model.py) feeds
`StreamScheduler.submit` and turns `StreamSink` calls into decoupled responses, and the tests
drive the same scheduler in-process.

Per stream and sentence, the encoder runs once (ids → prior frames); then the flow and the
vocoder run in windows. A stream's windows grow from `first_window_frames` (short, for first
audio) by doubling up to `window_frames`, so the second chunk is due soon after the first and
steady windows keep the context overhead small. Window k decodes frames [start, end); its flow
chunk is computed one vocoder context ahead, so the vocoder always has real right context.
Every window carries context on both sides, zero-padded (mask 0) outside the sentence exactly as
a one-shot decode pads its edges, so a window's shape is one of a few sizes.

Each step picks windows earliest-deadline-first: a started stream's deadline is the moment its
buffered audio runs out, a new stream's is shortly after it arrived. Windows are added while the
step's estimated cost (a fixed part per call and a part per frame, per stage, learnt as it runs)
still lets every chosen stream get its audio before its deadline, then one batched flow call
and one batched vocoder call run per window size, and every decoded window is sent at once.
The frames themselves live in the backend's paged stores (engines/frames.py): host memory for
CPU runtimes, GPU memory for GPU runtimes.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from engines.frames import StreamBackend, stream_backend
from engines.frontend import Sentence
from engines.plan import WindowConfig
from engines.stages import StageRuntime

LOGGER = logging.getLogger(__name__)
# A new stream's first audio is due this long after it arrives (after its encoder call).
FIRST_AUDIO_TARGET_S = 0.05
# Never shrink a step below this on account of streams that are already late: a late stream
# is best helped by a step that still makes progress for everyone.
MIN_STEP_BUDGET_S = 0.03
# Where an encoder call has a large fixed cost (a GPU), a new stream waits up to this many
# such costs, never more than `WindowConfig.max_encoder_wait_ms`, for others to share its
# call; only on a busy scheduler (at least ENCODE_HOLD_MIN_STREAMS live), where others arrive.
ENCODE_HOLD_CALLS = 5.0
ENCODE_HOLD_MIN_STREAMS = 16
IDLE_WAIT_S = 0.002
MAX_FIRST_AUDIO_SAMPLES = 10_000
# How often each stream's sink is asked whether its client went away: for a Triton stream
# the question is a round trip to the server process, too dear to ask every step.
CANCEL_CHECK_S = 0.5


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

    def finish(self, error: Exception | None = None) -> None:
        raise NotImplementedError

    def cancelled(self) -> bool:
        return False


@dataclass
class _SentenceState:
    pages: np.ndarray  # page table of its prior and latent frames (engines.frames)
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
    current: _SentenceState | None = None
    audio_seconds_sent: float = 0.0
    first_audio_at: float | None = None
    window_ready_at: float | None = None
    windows_sent: int = 0
    cancel_checked_at: float = 0.0

    def buffered_seconds(self, now: float) -> float:
        """Audio sent but not yet played, if playback started with the first chunk."""
        if self.first_audio_at is None:
            return 0.0
        return self.audio_seconds_sent - (now - self.first_audio_at)

    def deadline(self) -> float:
        if self.first_audio_at is None:
            return self.arrived + FIRST_AUDIO_TARGET_S
        return self.first_audio_at + self.audio_seconds_sent


@dataclass
class _Window:
    """One stream's work in a step: a flow chunk (maybe empty) and a vocoder window."""

    stream: Stream
    flow: tuple[int, int]
    decode: tuple[int, int]


@dataclass
class SchedulerStats:
    live_streams: int = 0
    streams_total: int = 0
    first_audio_seconds_sum: float = 0.0
    first_audio_count: int = 0
    # Each new stream's first-audio time, until the metrics publisher takes them (a histogram
    # needs every observation); bounded, so a scheduler nobody publishes stays small.
    first_audio_samples: list[float] = field(default_factory=list)
    queue_seconds_sum: float = 0.0
    queue_count: int = 0
    underrun_risk_streams: int = 0
    vocoder_batches: dict[int, int] = field(default_factory=dict)


class _CostModel:
    """Each stage's call time as ``per_call + per_frame * frames`` (frames = rows x width:
    phoneme ids for the encoder), fitted by exponentially weighted least squares to the calls
    it has seen.

    The fixed part matters on a GPU, where one call of 128 windows costs little more than a
    call of one: a per-frame figure alone, measured on small calls, would forbid the big
    batches that make the GPU fast. With ``fixed_part=False`` (CPU backends) the model is
    proportional to frames, as the CPU data plane was tuned and measured with.
    """

    DECAY = 0.97  # weight of a call seen 100 calls ago: about 5 %

    def __init__(self, fixed_part: bool = True) -> None:
        self.fixed_part = fixed_part  # False: proportional to frames only (CPU backends)
        # Conservative starting points (a 2-core CPU); replaced as calls are seen.
        self.per_frame = {"encoder": 3e-4, "flow": 2e-4, "vocoder": 8e-4}
        self.per_call = dict.fromkeys(self.per_frame, 0.0)
        # Per stage: weighted n, sum x, sum x^2, sum y, sum x*y (x frames, y seconds).
        self._sums = {stage: np.zeros(5) for stage in self.per_frame}
        # Per stage: calls, seconds, rows, frames (rows x width) seen so far.
        self.totals = {stage: [0, 0.0, 0, 0] for stage in self.per_frame}

    def observe(self, stage: str, seconds: float, rows: int, width: int) -> None:
        frames = float(max(1, rows * width))
        total = self.totals[stage]
        total[0] += 1
        total[1] += seconds
        total[2] += rows
        total[3] += int(frames)
        sums = self._sums[stage]
        sums *= self.DECAY
        sums += (1.0, frames, frames * frames, seconds, frames * seconds)
        n, sx, sxx, sy, sxy = sums
        spread = n * sxx - sx * sx
        per_call, per_frame = 0.0, sy / sx
        if self.fixed_part and spread > 1e-6 * n * sxx:  # calls of different sizes seen
            slope = (n * sxy - sx * sy) / spread
            intercept = (sy - slope * sx) / n
            if slope > 0 and intercept >= 0:
                per_call, per_frame = intercept, slope
        self.per_call[stage], self.per_frame[stage] = per_call, per_frame

    def estimate(self, stage: str, frames: int, new_call: bool = True) -> float:
        """Seconds `frames` more frames add to a step: with the call's fixed part when they
        need a call of their own, without it when they join a call already planned."""
        return self.per_frame[stage] * frames + (self.per_call[stage] if new_call else 0.0)


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
        self.backend: StreamBackend = stream_backend(runtime)
        self.sample_rate = sample_rate
        self.hop = hop_length
        self.windows = windows or WindowConfig()
        self.batching = cross_stream_batching
        self.stats = SchedulerStats()
        # Only a device backend's calls have a fixed cost worth planning around; the CPU keeps
        # the proportional model its benchmark figures were measured with (docs/streaming.md).
        self.costs = _CostModel(fixed_part=getattr(self.backend, "fixed_call_costs", False))
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

    def warmup(self, max_phonemes: int = 640) -> int:
        """Prepare the backend for every call shape this scheduler sends (GPU runtimes capture
        their CUDA graphs here, before the first listener waits for them); returns how many
        shapes are prepared (0 where there is nothing to prepare)."""
        warm = getattr(self.backend, "warmup", None)
        if warm is None:
            return 0
        cfg, sizes = self.windows, self.windows.window_sizes()
        windows = cfg.max_batch_windows if self.batching else 1
        sentences = cfg.max_encoder_batch if self.batching else 1
        flow_frames = [2 * size + 2 * cfg.flow_context_frames for size in sizes]
        vocoder_frames = [size + 2 * cfg.vocoder_context_frames for size in sizes]
        shapes = int(
            warm(
                flow_frames=flow_frames,
                vocoder_frames=vocoder_frames,
                windows=windows,
                sentences=sentences,
                phonemes=range(32, max_phonemes + 1, 32),
            )
        )
        calibrate = getattr(self.backend, "calibrate", None)
        if calibrate is not None:
            # Seed the cost model with small and large calls of the steady shapes.
            samples = calibrate(vocoder_frames[-1], flow_frames[-1], 256, windows, sentences)
            for _ in range(3):
                for stage, seconds, rows, width in samples:
                    self.costs.observe(stage, seconds, rows, width)
        return shapes

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
                if not self.step():
                    # Only held new streams (see _plan_step): wait for them or for more.
                    with self._wake:
                        self._wake.wait(timeout=IDLE_WAIT_S)
            except Exception as error:  # a broken step must not take the model down
                LOGGER.exception("scheduler step failed")
                for stream in list(self._streams.values()):
                    self._close(stream, RuntimeError(f"synthesis failed: {error}"))
                self._publish_stats()

    def step(self) -> bool:
        """Plan and run one step; False when there was nothing to run yet."""
        self._drop_cancelled()
        encodes, windows = self._plan_step()
        if not encodes and not windows:
            self._publish_stats()
            return False
        # Streams already playing go first: an encoder call (the longest call there is) must
        # not stand between a stream and the window it needs before its buffer runs out.
        self._run(windows)
        self._encode_pending(encodes)
        self._run([self._next_window(stream) for stream in encodes if stream.current])
        self._publish_stats()
        return True

    def _run(self, windows: list[_Window]) -> None:
        flows = [w for w in windows if w.flow[1] > w.flow[0]]
        for batch in self._batches(flows, lambda w: self._shape(w)[0]):
            self._flow(batch)
        for batch in self._batches(windows, lambda w: self._shape(w)[1]):
            self._run_windows(batch)

    def _batches(
        self, windows: list[_Window], size: Callable[[_Window], int]
    ) -> list[list[_Window]]:
        """One call per size; one call per window when cross-stream batching is off."""
        if not self.batching:
            return [[window] for window in windows]
        groups: dict[int, list[_Window]] = {}
        for window in windows:
            groups.setdefault(size(window), []).append(window)
        return list(groups.values())

    def _close(self, stream: Stream, error: Exception | None = None) -> None:
        self._streams.pop(stream.stream_id, None)
        self._end_sentence(stream)
        try:
            stream.sink.finish(error)
        except Exception:  # the client may be gone already
            LOGGER.debug("finishing stream %s failed", stream.stream_id, exc_info=True)

    def _end_sentence(self, stream: Stream) -> None:
        if stream.current is not None:
            self.backend.pool.release(stream.current.pages)
            stream.current = None

    def _drop_cancelled(self) -> None:
        now = time.monotonic()
        for stream in list(self._streams.values()):
            if now - stream.cancel_checked_at < CANCEL_CHECK_S:
                continue
            stream.cancel_checked_at = now
            if stream.sink.cancelled():
                # The final flag still goes out: Triton holds a request (and will not unload
                # the model) until its stream is finished.
                self._close(stream, StreamCancelled("the client cancelled the stream"))

    # -- encoder: batches of sentences of similar length sharing scales ------------------------
    def _encode_pending(self, waiting: list[Stream]) -> None:
        groups: dict[tuple[float, float, float, int], list[Stream]] = {}
        for stream in waiting:
            key = (*stream.params.scales(), stream.params.speaker_id)
            groups.setdefault(key, []).append(stream)
        for (noise, length, noise_w, _), streams in groups.items():
            # Padding a short sentence to a long one costs the long one's time: split at 1.25x,
            # unless one more call costs more than the padding (a GPU's fixed cost per call).
            streams.sort(key=lambda s: len(s.sentences[0].ids))
            batch: list[Stream] = []
            for stream in streams:
                split = not self.batching
                if batch and not split:
                    shortest, size = len(batch[0].sentences[0].ids), len(stream.sentences[0].ids)
                    longest = len(batch[-1].sentences[0].ids)
                    padding = self.costs.estimate("encoder", (size - longest) * len(batch), False)
                    split = size > 1.25 * shortest and padding > self.costs.per_call["encoder"]
                if batch and split:
                    self._encode(batch, (noise, length, noise_w))
                    batch = []
                batch.append(stream)
            self._encode(batch, (noise, length, noise_w))

    def _encode(self, streams: list[Stream], scales: tuple[float, float, float]) -> None:
        sentences = [stream.sentences.popleft() for stream in streams]
        longest = max(len(s.ids) for s in sentences)
        ids = np.zeros((len(sentences), longest), dtype=np.int64)
        for row, sentence in enumerate(sentences):
            ids[row, : len(sentence.ids)] = sentence.ids
        lengths = np.array([len(s.ids) for s in sentences], dtype=np.int64)
        speakers = np.array([s.params.speaker_id for s in streams], dtype=np.int64)
        started = time.perf_counter()
        prior, frames = self.backend.encode(
            ids, lengths, np.array(scales, dtype=np.float32), speakers
        )
        tables = [self.backend.pool.allocate(int(count)) for count in frames]
        self.backend.store_prior(prior, tables, frames)
        # GPU backends may run the flow over the whole sentences here (engines/torch_cuda/
        # backend.py); the windows then need the vocoder only.
        flow_sentences = getattr(self.backend, "flow_sentences", None)
        flowed = bool(flow_sentences and flow_sentences(prior, tables, frames, speakers))
        self.backend.sync()
        self.costs.observe("encoder", time.perf_counter() - started, len(streams), longest)
        now = time.monotonic()
        for row, stream in enumerate(streams):
            count = int(frames[row])
            stream.current = _SentenceState(
                pages=tables[row], frames=count, flowed=count if flowed else 0
            )
            stream.window_ready_at = now

    # -- window selection ---------------------------------------------------------------------
    def _next_window(self, stream: Stream) -> _Window:
        cfg = self.windows
        state = stream.current
        assert state is not None
        size = min(cfg.window_frames, cfg.first_window_frames << min(stream.windows_sent, 16))
        start, end = state.vocoded, min(state.frames, state.vocoded + size)
        needed = min(state.frames, end + cfg.vocoder_context_frames)
        if state.flowed >= needed:
            return _Window(stream, (state.flowed, state.flowed), (start, end))
        flow_end = min(state.frames, max(needed, state.flowed + 2 * size))
        return _Window(stream, (state.flowed, flow_end), (start, end))

    def _shape(self, window: _Window) -> tuple[int, int]:
        flow_frames = window.flow[1] - window.flow[0]
        decode = self.windows.size_class(window.decode[1] - window.decode[0])
        return (self.windows.size_class(flow_frames, flow=True) if flow_frames else 0, decode)

    def _calls(self, window: _Window) -> list[tuple[str, int]]:
        """The (stage, width) calls a window takes part in; same-width windows share one."""
        flow_width, decode_width = self._shape(window)
        calls = [("vocoder", decode_width + 2 * self.windows.vocoder_context_frames)]
        if flow_width:
            calls.append(("flow", flow_width + 2 * self.windows.flow_context_frames))
        return calls

    def _cost(self, calls: list[tuple[str, int]], planned: set[tuple[str, int]]) -> float:
        return sum(
            self.costs.estimate(stage, width, (stage, width) not in planned)
            for stage, width in calls
        )

    def _plan_step(self) -> tuple[list[Stream], list[_Window]]:
        """Earliest deadline first over all work: sentences to encode and windows to decode.

        Work is added while every chosen stream still gets its audio before its deadline and
        the step stays under `max_step_ms` (both by the cost model), so a stream that arrives
        while others race ahead of playback waits one short step, not one long one. A playing
        stream that cannot wait a whole step is always served (its window runs before any
        encoder call), and nothing is added that would make a playing stream left for later
        run dry. A stream whose sentence is encoded this step also gets its first window.
        """
        now = time.monotonic()
        for stream in [s for s in self._streams.values() if s.current is None and not s.sentences]:
            self._close(stream)
        streams = sorted(self._streams.values(), key=Stream.deadline)
        cfg = self.windows
        encode_limit = cfg.max_encoder_batch if self.batching else len(streams)
        window_limit = cfg.max_batch_windows if self.batching else len(streams)
        encodes: list[Stream] = []
        windows: list[_Window] = []
        step_cost, budget = 0.0, cfg.max_step_ms / 1000
        waiting_slack = float("inf")  # the least slack of a playing stream left for later
        planned: set[tuple[str, int]] = set()  # calls the step makes so far
        hold = 0.0
        if self.batching and len(streams) >= ENCODE_HOLD_MIN_STREAMS:
            hold = min(
                cfg.max_encoder_wait_ms / 1000, ENCODE_HOLD_CALLS * self.costs.per_call["encoder"]
            )
            new = sum(1 for s in streams if s.first_audio_at is None and s.current is None)
            if new >= encode_limit:
                hold = 0.0  # a full encoder batch is waiting already
        for stream in streams:
            if stream.current is None:
                if len(encodes) >= encode_limit:
                    continue
                if stream.first_audio_at is None and now - stream.arrived < hold:
                    continue
                # New streams' encoder call (one per step is counted: they split by length
                # only) and first windows (a vocoder call of their own, after the encoder).
                calls = [("encoder", 0), ("first-window", 0)]
                cost = self.costs.estimate(
                    "encoder", len(stream.sentences[0].ids), calls[0] not in planned
                ) + self.costs.estimate(
                    "vocoder",
                    cfg.first_window_frames + 2 * cfg.vocoder_context_frames,
                    calls[1] not in planned,
                )
            else:
                if len(windows) >= window_limit:
                    continue
                window = self._next_window(stream)
                calls = self._calls(window)
                cost = self._cost(calls, planned)
            slack = max(stream.deadline() - now, MIN_STEP_BUDGET_S)
            playing = stream.first_audio_at is not None
            urgent = playing and stream.current is not None and slack < budget
            limit = min(budget, slack, waiting_slack)
            if not urgent and (encodes or windows) and step_cost + cost > limit:
                if playing:
                    waiting_slack = min(waiting_slack, slack)
                continue
            if stream.current is None:
                encodes.append(stream)
            else:
                windows.append(window)
            step_cost += cost
            planned.update(calls)
            budget = max(MIN_STEP_BUDGET_S, min(budget, slack))
        return encodes, windows

    # -- flow and vocoder calls for batches of same-sized windows --------------------------------
    def _run_windows(self, windows: list[_Window]) -> None:
        started = time.monotonic()
        for window in windows:
            if window.stream.window_ready_at is not None:
                self.stats.queue_seconds_sum += started - window.stream.window_ready_at
                self.stats.queue_count += 1
        audio = self._vocode(windows)
        now = time.monotonic()
        for window, pcm in zip(windows, audio, strict=True):
            stream, state = window.stream, window.stream.current
            assert state is not None
            state.vocoded = window.decode[1]
            if stream.first_audio_at is None:
                stream.first_audio_at = now
                self.stats.first_audio_seconds_sum += now - stream.arrived
                self.stats.first_audio_count += 1
                if len(self.stats.first_audio_samples) < MAX_FIRST_AUDIO_SAMPLES:
                    self.stats.first_audio_samples.append(now - stream.arrived)
            stream.audio_seconds_sent += len(pcm) / self.sample_rate
            stream.windows_sent += 1
            stream.window_ready_at = now
            try:
                stream.sink.audio(pcm)
            except Exception as error:
                LOGGER.debug("sending to stream %s failed; dropping it", stream.stream_id)
                self._close(stream, StreamCancelled(f"the stream could not be sent: {error}"))
                continue
            if state.vocoded >= state.frames:
                self._end_sentence(stream)
                if not stream.sentences:
                    self._close(stream)

    def _flow(self, windows: list[_Window]) -> None:
        if not windows:
            return
        context = self.windows.flow_context_frames
        width = 2 * context + max(
            self.windows.size_class(w.flow[1] - w.flow[0], flow=True) for w in windows
        )
        states = [self._state(w) for w in windows]
        ends = np.array([w.flow[1] for w in windows], dtype=np.int64)
        limits = np.minimum(np.array([s.frames for s in states], dtype=np.int64), ends + context)
        started = time.perf_counter()
        self.backend.flow(
            [s.pages for s in states],
            np.array([w.flow[0] - context for w in windows], dtype=np.int64),
            limits,
            width,
            context,
            ends,
            self._speakers(windows),
        )
        self.backend.sync()
        self.costs.observe("flow", time.perf_counter() - started, len(windows), width)
        for window, state in zip(windows, states, strict=True):
            state.flowed = window.flow[1]

    def _vocode(self, windows: list[_Window]) -> list[np.ndarray]:
        context = self.windows.vocoder_context_frames
        sizes = [w.decode[1] - w.decode[0] for w in windows]
        width = max(self.windows.size_class(size) for size in sizes) + 2 * context
        states = [self._state(w) for w in windows]
        ends = np.array([w.decode[1] for w in windows], dtype=np.int64)
        limits = np.minimum(np.array([s.frames for s in states], dtype=np.int64), ends + context)
        started = time.perf_counter()
        pcm = self.backend.vocode(
            [s.pages for s in states],
            np.array([w.decode[0] - context for w in windows], dtype=np.int64),
            limits,
            width,
            self._speakers(windows),
            (context * self.hop, (context + max(sizes)) * self.hop),
        )
        self.costs.observe("vocoder", time.perf_counter() - started, len(windows), width)
        batches = self.stats.vocoder_batches
        batches[len(windows)] = batches.get(len(windows), 0) + 1
        return [pcm[row, : size * self.hop] for row, size in enumerate(sizes)]

    @staticmethod
    def _state(window: _Window) -> _SentenceState:
        state = window.stream.current
        assert state is not None
        return state

    @staticmethod
    def _speakers(windows: list[_Window]) -> np.ndarray:
        return np.array([w.stream.params.speaker_id for w in windows], dtype=np.int64)

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
