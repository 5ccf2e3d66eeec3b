"""The stream model's executor: one thread that steps all live streams of its voices.

Nothing here knows about Triton: the pod's voice host (engines/pod/voice_host) feeds
`StreamScheduler.submit` with each stream's voice, and its sinks carry the audio back to the
stream models, which send it as decoupled responses; the tests drive the same scheduler
in-process.

Per stream and sentence, the encoder runs once (ids → prior frames); then the flow and the
vocoder run in windows (engines/streaming/planner.py chooses them). Every window carries
context on both sides, zero-padded (mask 0) outside the sentence, so a window's shape is one
of a few sizes. The flow's layers mask those frames, so its edges are a one-shot decode's; the
vocoder's zero frames come close to its edges but not exactly. On onnxruntime, which takes
any width, a call at a sentence's edge takes no context past it instead, and both stages'
edges are the one-shot decode's.

Each step, the planner picks windows earliest-deadline-first by the cost model
(engines/streaming/costs.py); then one batched flow call and one batched vocoder call run per
window size and voice, and every decoded window is sent at once (by the delivery thread,
engines/streaming/delivery.py, where the backend's calls are asynchronous). The frames
themselves live in the backend's paged stores (engines/streaming/frames.py): host memory for CPU
runtimes, GPU memory for GPU runtimes. Nothing here imports a runtime library (an import
contract in pyproject.toml).
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from engines.contract.plan import WindowConfig
from engines.streaming.capacity import (
    Ceiling,
    Layout,
    StreamPace,
    host_costs,
    predicted_capacity,
    stream_demand,
)
from engines.streaming.costs import CostModel
from engines.streaming.delivery import AudioDelivery, LaunchedCall
from engines.streaming.frames import (
    SENTENCE_FLOW_FRAMES,
    DeviceCalls,
    StreamBackend,
    stream_backend,
)
from engines.streaming.planner import (
    ENCODE_UNPACED_SHARE,
    ENCODER_CALLS_A_STEP,
    VOCODER_LAUNCH_SHARE,
    StepPlan,
    WindowRules,
    call_key,
    cpu_rules,
    encoder_calls,
    group_calls,
    next_window,
    plan_step,
)
from engines.streaming.stages import StageRuntime
from engines.streaming.threads import NamedThread
from engines.streaming.types import (
    FirstAudioPaths,
    SchedulerStats,
    SentenceState,
    StepTimes,
    Stream,
    StreamCancelled,
    StreamSink,
    SynthesisParams,
    VoiceSlot,
    Window,
    call_voice,
)
from engines.text.frontend import Sentence

LOGGER = logging.getLogger(__name__)
# The scheduler thread's name (the kernel's: vf-scheduler): the benchmark's busiest-thread
# figure and the voice host's stack sampler find it by it.
SCHEDULER_THREAD = "voxfleet-scheduler"
IDLE_WAIT_S = 0.002
# The longest the loop waits for a stream resting on its lead (`WindowConfig.max_lead_ms`)
# when nothing else is to be done: new streams wake it at once, cancelled ones are looked for
# at the next step.
MAX_REST_WAIT_S = 0.05
MAX_FIRST_AUDIO_SAMPLES = 10_000
# How often each stream's sink is asked whether its client went away: for a Triton stream
# the question is a round trip to the server process, too dear to ask every step.
CANCEL_CHECK_S = 0.5
# With a backend whose vocoder calls return before their audio is on the host (a GPU), the
# scheduler plans and launches a step while the one before it still runs on the device, never
# further ahead than this many steps.
STEPS_IN_FLIGHT = 1
# The stream a CPU scheduler warms up with: a sentence of this many phoneme ids (about 3 s of
# audio: first, growing and lead windows) of one id; at most this many steps.
WARMUP_PHONEMES = 96
WARMUP_PHONEME_ID = 20
WARMUP_MAX_STEPS = 200
# With asynchronous calls the stats are read by a metrics thread (every 0.25 s in the Triton
# model): the streams at risk of an underrun, a pass over all of them, are counted no more
# often than this rather than every step.
RISK_COUNT_INTERVAL_S = 0.1
# The capacity (`StreamScheduler.capacity`) is worked out again at most this often.
CAPACITY_INTERVAL_S = 0.25
# "0" in the environment: a fixed-shape encoder's calls take a burst's new listeners in arrival
# order, not by length (`planner.MATCH_CALLS`); for comparing the two.
MATCH_LENGTHS_ENV = "VOXFLEET_MATCH_LENGTHS"
# "0" in the environment: the padding rows of busy unpaced steps (of several voices, or of one
# taking two encoder calls a step) stay padding (`planner.NEXT_WINDOW_PASSES`), for comparing.
NEXT_WINDOWS_ENV = "VOXFLEET_NEXT_WINDOWS"
# How many encoder calls' worth of new sentences a busy GPU step of one voice's unpaced
# listeners may take (`planner.ENCODER_CALLS_A_STEP`, the default); "1": one, for comparing.
ENCODER_CALLS_ENV = "VOXFLEET_ENCODER_CALLS"
# A vocoder launch's seconds weigh this much in their moving mean (`_vocode_launch`).
LAUNCH_WEIGHT = 0.05
# The share of a busy step's budget its vocoder launches may take where voices' calls split
# (`planner.VOCODER_LAUNCH_SHARE`, the default); "0": not held, for comparing.
LAUNCH_SHARE_ENV = "VOXFLEET_LAUNCH_SHARE"
# The share of a busy step's budget the fixed costs of its voices' encoder calls may take
# where voices' calls split and no stream is paced (`planner.ENCODE_UNPACED_SHARE`, the
# default); "0.25" plans them as paced streams' steps do, for comparing.
ENCODE_SHARE_ENV = "VOXFLEET_ENCODE_SHARE"


class _Discard(StreamSink):
    """The warmup stream's sink."""

    finished = False

    def audio(self, pcm: np.ndarray) -> None:
        return None

    def finish(self, error: Exception | None = None) -> None:
        self.finished = True


@dataclass
class _Encoding:
    """An encoder call running beside the windows (`StreamBackend.encode_launch`)."""

    call: Any
    streams: list[Stream]
    speakers: np.ndarray
    width: int
    ids: list[int]  # phoneme ids of each row's sentence
    # Windows were launched after it (on a backend whose encoder calls queue with the
    # windows, `encoder_queued`, the device then has work behind it while the host waits).
    followed: bool = False


class _PartClock:
    """One step's clock: `part` adds the wall and CPU time since the last mark to a part of
    `StepTimes`, `done` the thread's CPU time since the start (and the step, if it ran)."""

    def __init__(self, times: StepTimes) -> None:
        self._times = times
        self._cpu = self._cpu_last = time.thread_time()
        self._last = time.perf_counter()

    def part(self, name: str) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        self._times.wall[name] += now - self._last
        self._times.cpu_parts[name] += cpu - self._cpu_last
        self._last, self._cpu_last = now, cpu

    def done(self, ran: bool) -> bool:
        # (A step's last part is marked just before: its CPU is the parts' sum.)
        self._times.cpu += self._cpu_last - self._cpu
        self._times.steps += int(ran)
        return ran


class _SummedTiming:
    """Device times of the parts of one call (an encoder call beside the windows, then its
    sentences' prior and flow), observed as one."""

    def __init__(self, *parts: Any) -> None:
        self.parts = parts

    def done(self) -> bool:
        return all(part.done() for part in self.parts)

    def seconds(self) -> float:
        return sum(part.seconds() for part in self.parts)


def share_from_environment(name: str, default: float) -> float:
    """A share from 0 to 1 in the environment variable `name`, else `default`."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"{name} must be a share from 0 to 1, got {value!r}")
    return share


def encoder_calls_from_environment() -> int:
    """`ENCODER_CALLS_ENV`'s count of encoder calls a step (1 or more), else
    `ENCODER_CALLS_A_STEP`."""
    value = os.environ.get(ENCODER_CALLS_ENV, "").strip()
    if not value:
        return ENCODER_CALLS_A_STEP
    if not (value.isascii() and value.isdigit()) or int(value) < 1:
        raise ValueError(f"{ENCODER_CALLS_ENV} must be a whole number of at least 1, got {value!r}")
    return int(value)


def launch_share_from_environment() -> float:
    """`LAUNCH_SHARE_ENV`'s share (0: launches not held), else `VOCODER_LAUNCH_SHARE`."""
    return share_from_environment(LAUNCH_SHARE_ENV, VOCODER_LAUNCH_SHARE)


def _weights(voice: VoiceSlot | None) -> Any:
    """What the backend's calls take for `voice`'s weights (None: the runtime's own voice)."""
    return voice.weights if voice is not None else None


class StreamScheduler:
    """Owns all live streams of its voices and one thread that steps them.

    A scheduler made for one voice serves the runtime's own voice; one that serves several
    (a pod's voice host, engines/pod/voice_host) is given each stream's `VoiceSlot` at `submit`.
    Every step is planned over the streams of all voices, earliest deadline first, so a voice
    with one listener waits behind no voice with a thousand; the calls split by voice, since
    each voice's run with its own weights, except where the backend groups
    voices (`BackendFeatures.groups_voices`: one call a width, each voice's rows against its
    own weights, and the encoder's likewise); each voice keeps stats of its own."""

    def __init__(
        self,
        runtime: StageRuntime,
        sample_rate: int,
        hop_length: int = 256,
        windows: WindowConfig | None = None,
        cross_stream_batching: bool = True,
        on_step: Callable[[SchedulerStats], None] | None = None,
        exact_widths: bool | None = None,
    ) -> None:
        self.runtime = runtime
        self.backend: StreamBackend = stream_backend(runtime)
        self.sample_rate = sample_rate
        self.hop = hop_length
        self.windows = windows or WindowConfig()
        # onnxruntime runs a window of any width at the same cost per frame, so its calls are
        # as wide as their windows, take no context past a sentence's edges, and a stream's
        # windows grow by half; a sentence's short tail goes with the window or flow chunk
        # before it, and where the plan asks for them (`lead_windows`) a stream with a lead
        # takes windows twice the steady size and flow chunks of four steady windows; engines
        # built for fixed shapes (CUDA graphs, TensorRT profiles) keep the size classes, and
        # where their calls are padded to batch buckets (CUDA graphs) the padding rows take
        # windows that are not due yet. (planner.WindowRules)
        if exact_widths is None:
            exact_widths = runtime.name == "onnxruntime"
        lead = self.windows.window_frames if self.windows.lead_windows else 0
        self.rules = (
            cpu_rules(lead)
            if exact_widths
            else WindowRules(
                batch_buckets=self.backend.features.batch_buckets,
                grouped_voices=self.backend.features.groups_voices,
                match_lengths=os.environ.get(MATCH_LENGTHS_ENV, "1").strip() != "0",
                next_windows=os.environ.get(NEXT_WINDOWS_ENV, "1").strip() != "0",
                encoder_calls=encoder_calls_from_environment(),
            )
        )
        self.launch_share = launch_share_from_environment()
        self.unpaced_encode_share = share_from_environment(ENCODE_SHARE_ENV, ENCODE_UNPACED_SHARE)
        self.batching = cross_stream_batching
        self.stats = SchedulerStats()
        # Audio made so far, every voice's (seconds): the voice host's load measure.
        self.audio_seconds = 0.0
        # Read by profiling runs' call log (engines/pod/voice_host/host.py, VOXFLEET_COSTS_LOG_S).
        self.step_times = StepTimes()
        # Where new streams' first audio spends its time, when a profiling run asks for it
        # (the voice host's call log sets it; None: not recorded).
        self.first_audio_paths: FirstAudioPaths | None = None
        # Only a device backend's calls have a fixed cost worth planning around; the CPU keeps
        # the proportional model its benchmark figures were measured with (docs/streaming.md).
        self.costs = CostModel(fixed_part=self.backend.features.fixed_call_costs)
        # What the thread costs a step and a window, and what the streams' sentences are like:
        # with the cost model, what the scheduler holds (`capacity`).
        self.host_costs = host_costs()
        self.pace = StreamPace()
        self._capacity: tuple[float, int] | None = None  # (when, streams)
        # Below the prediction where its streams ran late (`capacity`).
        self.ceiling = Ceiling.from_environment()
        self._predicted = 0  # the last prediction, beside a ceiling below it
        self._sync_device_s = 0.0  # this step's synchronous stage calls (seconds)
        self._on_step = on_step
        self._on_step_error = ""
        self._incoming: deque[Stream] = deque()
        self._streams: dict[int, Stream] = {}
        self._ids = itertools.count(1)
        self._wake = threading.Condition()
        self._running = False
        self._thread: threading.Thread | None = None
        # Asynchronous vocoder calls (DeviceBackend on a GPU): their audio and the streams'
        # final responses leave from a delivery thread (engines/streaming/delivery.py), in the
        # order the scheduler queued them, and their device times come back to the cost model
        # through `_observed`.
        self._delivery: AudioDelivery | None = None
        self._observed: deque[tuple[str, float, int, int]] = deque()
        self._timings: deque[tuple[str, Any, int, int]] = (
            deque()
        )  # stage, DeviceTiming, rows, width
        self._in_flight: deque[Any] = deque()
        self._last_launched: Any = None
        self._risk_counted_at = time.monotonic()
        self._live_counted_at = self._risk_counted_at
        # The voices whose per-voice live and at-risk counts the last count set.
        self._voices_seen: set[VoiceSlot] = set()
        self._planned_at = time.monotonic()  # when the last step was planned
        # The host's seconds to launch a vocoder call, a moving mean (`_vocode_launch`): the
        # planner holds a busy step's launches to a share of it (`VOCODER_LAUNCH_SHARE`).
        self._launch_s = 0.0
        self._cancel_scanned_at = 0.0  # when the streams were last asked about cancels
        self._rest_until: float | None = None  # the last plan's (StepPlan.rest_until)
        # The next step starts no sooner than this (`WindowConfig.paced_step_ms`, `_paced_until`).
        self._not_before = 0.0
        # Encoder calls running beside the windows, in launch order, with their streams (which
        # the planner leaves alone until their sentence is taken up, `_take_up_encoded`).
        self._encoding: deque[_Encoding] = deque()

    @property
    def _device(self) -> DeviceCalls:
        """The backend's own calls, where its features say it has them."""
        return cast(DeviceCalls, self.backend)

    @property
    def _async(self) -> bool:
        # Read from the backend in use (a benchmark may swap in host frame stores).
        return self.backend.features.async_calls

    @property
    def _beside(self) -> bool:
        return self.backend.features.encodes_beside

    @property
    def _queued(self) -> bool:
        # The encoder calls launched go behind the windows on their stream (`BackendFeatures`).
        return self.backend.features.encoder_queued

    @property
    def _encoder_calls_in_flight(self) -> int:
        # A backend may allow more than one (engines/runtimes/torch_cuda/stages.py: an encoder
        # queued on the windows' own stream, whose calls do not slow each other down).
        return self.backend.features.encoder_calls_in_flight

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        self._running = True
        if self._async:
            self._delivery = AudioDelivery(
                self._count_first_audio,
                lambda *observed: self._observed.append(observed),
            )
            self._delivery.start()
        self._thread = NamedThread(target=self._loop, name=SCHEDULER_THREAD, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._running = False
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for stream in [*self._incoming, *self._streams.values()]:
            self._finish(stream, RuntimeError("the server is shutting down"))
        self._incoming.clear()
        self._streams.clear()
        self._encoding.clear()  # their streams are closed
        if self._delivery is not None:
            self._delivery.stop()

    def warmup(self, max_phonemes: int = 640) -> int:
        """Prepare the backend for every call shape this scheduler sends (GPU runtimes capture
        their CUDA graphs here, before the first listener waits for them); returns how many
        shapes are prepared (0 where there is nothing to prepare)."""
        if not self.backend.features.prepares_shapes:
            self._warm_with_a_stream()
            return 0
        cfg, sizes = self.windows, self.windows.window_sizes()
        windows = cfg.max_batch_windows if self.batching else 1
        sentences = cfg.max_encoder_batch if self.batching else 1
        flow_frames = [2 * size + 2 * cfg.flow_context_frames for size in sizes]
        vocoder_frames = [size + 2 * cfg.vocoder_context_frames for size in sizes]
        shapes = int(
            self._device.warmup(
                flow_frames=flow_frames,
                vocoder_frames=vocoder_frames,
                windows=windows,
                sentences=sentences,
                phonemes=range(32, max_phonemes + 1, 32),
                # The longest whole-sentence flow (over 1,024 frames, 12 s of audio: one
                # sentence in 15 of the corpus) runs eagerly rather than cost the warmup its
                # largest graphs.
                sentence_frames=SENTENCE_FLOW_FRAMES[:-1],
            )
        )
        # Seed the cost model with small and large calls of the steady shapes.
        samples = self._device.calibrate(
            vocoder_frames[-1], flow_frames[-1], 256, windows, sentences
        )
        for _ in range(3):
            for stage, seconds, rows, width in samples:
                self.costs.observe(stage, seconds, rows, width)
        return shapes

    def _warm_with_a_stream(self) -> None:
        """Stages with no shapes to prepare (onnxruntime) still run their first calls slowly
        (allocations), and the cost model starts from guesses: the first listeners after a
        start then got late chunks, and a pod would hold fewer streams than it does. One short
        stream runs through every stage here, twice, before the scheduler starts: the first
        pays the allocations and is forgotten, the second seeds the cost model and the
        thread's costs (what the scheduler holds, `capacity`, is predicted from them). Its
        audio is dropped and nothing else of it is counted."""
        if self._async or self._thread is not None:
            return
        on_step, self._on_step = self._on_step, None
        # Its stream has no listener: late or not, it says nothing of what the pod holds.
        ceiling, self.ceiling = self.ceiling, Ceiling(enabled=False)
        # Every window at once: a lead limit would end the warmup at its first rest.
        windows, self.windows = self.windows, replace(self.windows, max_lead_ms=0)
        try:
            for run in range(2):
                if run:  # the first run's calls paid for their allocations: not a cost
                    self.costs = CostModel(fixed_part=self.costs.fixed_part)
                    self.host_costs = host_costs()
                sink = _Discard()
                ids = [WARMUP_PHONEME_ID] * WARMUP_PHONEMES
                stream = Stream(0, deque([Sentence("warmup", ids)]), SynthesisParams(), sink, 0.0)
                self._streams[stream.stream_id] = stream
                try:
                    for _ in range(WARMUP_MAX_STEPS):
                        stream.arrived = time.monotonic()  # never late: a fresh listener
                        if sink.finished or not self.step():
                            break
                finally:
                    self._close(stream)
        finally:
            self.windows = windows
            self._on_step = on_step
            self.ceiling = ceiling
            self.stats = SchedulerStats()
            self.pace = StreamPace()  # one sentence of one id repeated is no listener's

    def submit(
        self,
        sentences: list[Sentence],
        params: SynthesisParams,
        sink: StreamSink,
        received: float | None = None,
        voice: VoiceSlot | None = None,
    ) -> int:
        """Start a stream; `received`: when its request reached the server (time.monotonic()),
        if earlier than now (its text was phonemised meanwhile); `voice`: the voice it speaks
        with, where the scheduler serves several."""
        stream = Stream(next(self._ids), deque(sentences), params, sink, time.monotonic())
        stream.received = received
        stream.voice = voice
        if voice is not None and voice.max_lead_ms is not None:
            stream.lead_limit_s = voice.max_lead_ms / 1000
        with self._wake:
            self._incoming.append(stream)
            self._wake.notify()
        return stream.stream_id

    def live_streams(self) -> int:
        return len(self._streams) + len(self._incoming)

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            self._wait_for_pace()
            with self._wake:
                while self._running and not self._incoming and not self._streams:
                    self._wake.wait()
                if not self._running:
                    return
                while self._incoming:
                    stream = self._incoming.popleft()
                    self._streams[stream.stream_id] = stream
                    self.stats.streams_total += 1
                    if stream.voice is not None:
                        stream.voice.stats.streams_total += 1
            try:
                if not self.step():
                    # Only held new streams or streams resting on their lead (see
                    # planner.plan_step): wait for them or for more.
                    idle = time.perf_counter()
                    with self._wake:
                        self._wake.wait(timeout=self._idle_wait_s())
                    self.step_times.wall["idle"] += time.perf_counter() - idle
            except Exception as error:  # a broken step must not take the model down
                LOGGER.exception("scheduler step failed")
                for stream in list(self._streams.values()):
                    self._close(stream, RuntimeError(f"synthesis failed: {error}"))
                self._encoding.clear()
                self._publish_stats()

    def _wait_for_pace(self) -> None:
        """Wait until the next step may start (`_paced_until`): new streams do not cut the wait
        short (arrivals would otherwise start a step each), a stop does. An encoder call
        launched beside or queued that ends meanwhile has its streams' first windows run at
        once (`_first_windows_now`), as an inline call's run in its own step: waiting for the
        next step put a new stream's first audio 61 ms after its request, not 13 ms, with 10
        paced listeners on an H200 (docs/gpu.md)."""
        while self._running and (left := self._not_before - time.monotonic()) > 0:
            idle = time.perf_counter()
            with self._wake:
                # (While an encoder call is out, its end is polled for: a device does not
                # wake the loop.)
                self._wake.wait(timeout=min(left, IDLE_WAIT_S) if self._encoding else left)
            self.step_times.wall["idle"] += time.perf_counter() - idle
            if self._encoding and self._encoding[0].call.done():
                self._first_windows_now()

    def _first_windows_now(self) -> None:
        """Take up the encoder calls whose frame counts are on the host and run their streams'
        first windows, between steps."""
        self._run(self._first_windows(self._take_up_encoded(wait_for_followed=False)))
        self._keep_in_flight()

    def _first_windows(self, streams: list[Stream]) -> list[Window]:
        """The first windows of the streams whose sentence was just started (a stream closed
        meanwhile has none)."""
        return [next_window(s, self.windows, self.rules) for s in streams if s.current]

    def _paced_until(self, plan: StepPlan) -> float:
        """When the step after `plan` may start. Where streams rest on their lead, the backend's
        calls are asynchronous and the step left no work waiting: `paced_step_ms` (at most a
        quarter of the least resting lead) after the step was planned, so the streams falling
        under their lead meanwhile share one step's calls; else at once. Without it, paced
        streams came due one by one and a step ran for each: at 2,000 paced listeners on an
        H200 the vocoder's calls carried 6.5 to 9.6 windows, against 26.7 unpaced (docs/gpu.md)."""
        pace = self.windows.paced_step_ms / 1000
        if not pace or not self._async or plan.full or not plan.rest_lead_s:
            return 0.0
        return self._planned_at + min(pace, plan.rest_lead_s / 4)

    def _idle_wait_s(self) -> float:
        """How long the loop waits after a step with nothing to run: IDLE_WAIT_S while a new
        stream is held back or an encoder call beside the windows is out, else until the first
        stream resting on its lead is due again (at most MAX_REST_WAIT_S)."""
        rest_until = self._rest_until
        if (
            rest_until is None
            or self._encoding
            or any(s.first_audio_at is None for s in self._streams.values())
        ):
            return IDLE_WAIT_S
        return min(max(rest_until - time.monotonic(), IDLE_WAIT_S), MAX_REST_WAIT_S)

    def step(self) -> bool:
        """Plan and run one step; False when there was nothing to run yet."""
        clock = _PartClock(self.step_times)
        started = time.perf_counter()
        self._sync_device_s = 0.0
        self._observe_timings()
        self._drop_cancelled()
        self._take_up_encoded()
        clock.part("prepare")
        plan = self._plan()
        self._rest_until = plan.rest_until
        clock.part("plan")
        if not plan:
            self._publish_stats()
            clock.part("publish")
            return clock.done(ran=False)
        self._not_before = self._paced_until(plan)
        # Streams already playing go first: an encoder call (the longest call there is) must
        # not stand between a stream and the window it needs before its buffer runs out.
        self._run(plan.windows)
        clock.part("windows")
        calls = encoder_calls(
            plan.encodes,
            self.costs,
            self.batching,
            self.rules.grouped_voices,
            self.windows.max_encoder_batch,
        )
        if self.backend.features.launches_encoder and not self._beside:
            self._encode_launched(list(calls))
        else:
            for scales, streams in calls:
                self._encode(streams, scales)
        clock.part("encode")
        first_windows = self._first_windows(plan.encodes)
        self._run(first_windows)
        clock.part("windows")
        self._publish_stats()
        clock.part("publish")
        # The thread's own time in this step (its waits for the device's calls left out).
        host_s = time.perf_counter() - started - self._sync_device_s
        self.host_costs.observe("step", host_s, len(plan.windows) + len(first_windows), 1)
        self._keep_in_flight()
        clock.part("wait")
        return clock.done(ran=True)

    def _keep_in_flight(self) -> None:
        """With asynchronous calls, the next step is planned while this one runs on the
        device: wait for the one before it, so the device's queue stays short and new
        streams' calls come soon."""
        if not self._async:
            return
        if self._last_launched is not None:
            self._in_flight.append(self._last_launched)
            self._last_launched = None
        while len(self._in_flight) > STEPS_IN_FLIGHT:
            self._in_flight.popleft().wait()

    def _observe_sync(self, stage: str, seconds: float, rows: int, width: int) -> None:
        """A synchronous call's time, into the cost model (and out of the thread's own)."""
        self._sync_device_s += seconds
        self.costs.observe(stage, seconds, rows, width)

    def layout(self) -> Layout:
        """How this scheduler cuts its calls, for the capacity model: with paced steps
        (`_paced_until`) where its streams are paced, steps of `paced_step_ms`."""
        features = self.backend.features
        step_ms = self.windows.max_step_ms
        if self._async and self.windows.paced_step_ms and self._paced():
            step_ms = min(step_ms, self.windows.paced_step_ms)
        return Layout(
            windows=self.windows,
            ramp=self.rules.ramp,
            fixed_widths=not self.rules.exact_widths,
            sentence_flow=features.sentence_flow,
            overlapped=features.async_calls,
            step_ms=step_ms,
            voice_shares=(1.0,) if self.rules.grouped_voices else self._voice_shares(),
        )

    def _voice_shares(self) -> tuple[float, ...]:
        """Each voice's share of the live streams, by the weights they run with (`call_voice`:
        a voice's instances share its calls); (1.0,) with none live."""
        streams = list(self._streams.values()) + list(self._incoming)
        counts = Counter(call_voice(stream.voice) for stream in streams)
        if len(counts) <= 1:
            return (1.0,)
        return tuple(count / len(streams) for count in sorted(counts.values(), reverse=True))

    def _paced(self) -> bool:
        """Whether its streams have a lead limit (the plan's, or a live stream's own)."""
        if self.windows.max_lead_ms:
            return True
        return any(stream.lead_limit_s for stream in list(self._streams.values()))

    def capacity(self, now: float | None = None) -> int:
        """The real-time streams this scheduler holds, predicted from its cost model, its
        thread's costs and its streams' pace (engines/streaming/capacity.py); worked out
        again at most every CAPACITY_INTERVAL_S."""
        now = time.monotonic() if now is None else now
        cached = self._capacity
        if cached is not None and now - cached[0] < CAPACITY_INTERVAL_S:
            return cached[1]
        layout = self.layout()
        demand = stream_demand(layout, self.pace, self.sample_rate / self.hop)
        self._predicted = predicted_capacity(demand, self.costs, self.host_costs, layout)
        streams = self.ceiling.held(now, self._predicted, self.live_streams())
        self._capacity = (now, streams)
        return streams

    def capacity_source(self) -> str:
        """Where `capacity`'s figure comes from, in words for a refusal."""
        if self.ceiling.value is None:
            return "predicted from what its calls cost"
        return (
            f"its streams ran late with {self.ceiling.live_at_cut} live; "
            f"predicted {self._predicted}"
        )

    def _observe_timings(self) -> None:
        """Device times of asynchronous calls that have finished, into the cost model."""
        while self._observed:
            self.costs.observe(*self._observed.popleft())
        while self._timings and self._timings[0][1].done():
            stage, timing, rows, width = self._timings.popleft()
            self.costs.observe(stage, timing.seconds(), rows, width)

    def _plan(self) -> StepPlan:
        encoding = {s.stream_id for call in self._encoding for s in call.streams}
        # Sentences to encode wait while the encoder calls beside the windows are at their
        # limit; the planner sees only streams it can serve this step. (One pass over the
        # streams: at thousands of them, each pass is a share of the thread's step.)
        encoder_busy = self._beside and len(self._encoding) >= self._encoder_calls_in_flight
        streams: list[Stream] = []
        ended: list[Stream] = []
        for stream in self._streams.values():
            if encoding and stream.stream_id in encoding:
                continue
            if stream.current is None:
                if not stream.sentences:
                    ended.append(stream)
                    continue
                if encoder_busy:
                    continue
            streams.append(stream)
        for stream in ended:
            self._close(stream)
        now = time.monotonic()
        interval, self._planned_at = now - self._planned_at, now
        return plan_step(
            streams,
            self.windows,
            self.costs,
            self.batching,
            now,
            self.rules,
            encoder_beside=self._beside,
            step_interval_s=interval,
            encoder_queued=self._queued,
            launch_s=self._launch_s if self._async else 0.0,
            launch_share=self.launch_share,
            unpaced_encode_share=self.unpaced_encode_share,
            encoder_streams=self.backend.features.encoder_streams,
            # (Calls beside the windows: no more than may be in flight, with those out now.)
            encoder_calls=(
                self._encoder_calls_in_flight - len(self._encoding) if self._beside else None
            ),
        )

    def _run(self, windows: list[Window]) -> None:
        flows = [w for w in windows if w.flow[1] > w.flow[0]]
        for batch in group_calls(
            flows,
            lambda w: (
                call_key(w, self.windows, self.rules, flow=True),
                call_voice(w.stream.voice),
            ),
            self.batching,
        ):
            self._flow(batch)
        grouped = self.rules.grouped_voices
        for batch in group_calls(
            windows,
            lambda w: (
                call_key(w, self.windows, self.rules),
                None if grouped else call_voice(w.stream.voice),
            ),
            self.batching,
        ):
            self._run_windows(batch)

    def _close(self, stream: Stream, error: Exception | None = None) -> None:
        self._streams.pop(stream.stream_id, None)
        self._end_sentence(stream)
        self._finish(stream, error)

    def _finish(self, stream: Stream, error: Exception | None) -> None:
        if self._delivery is not None:
            self._delivery.finish(stream, error)
            return
        try:
            stream.sink.finish(error)
        except Exception:  # the client may be gone already
            LOGGER.debug("finishing stream %s failed", stream.stream_id, exc_info=True)

    def _check_late(self, stream: Stream, now: float) -> None:
        """A playing stream's chunk going out after its audio ran out (by this clock) is late:
        counted (`late_chunks`) and told to the ceiling on what the scheduler holds."""
        if stream.first_audio_at is None or stream.buffered_seconds(now) >= 0:
            return
        for counted in self._stats_of(stream):
            counted.late_chunks += 1
        if self.ceiling.late(now, stream.stream_id, self.live_streams()):
            self._capacity = None  # worked out again at the next admission
            LOGGER.warning(
                "streams ran late with %d live: holding at most %d until they keep up "
                "(predicted %d)",
                self.ceiling.live_at_cut,
                self.ceiling.value or 0,
                self._predicted,
            )

    def _stats_of(self, stream: Stream) -> tuple[SchedulerStats, ...]:
        """The stats a stream counts in: the scheduler's, and its voice's where it has one."""
        if stream.voice is None:
            return (self.stats,)
        return (self.stats, stream.voice.stats)

    def _count_first_audio(self, stream: Stream, now: float) -> None:
        """A stream's first audio at `now`: its time from the request (`Stream.requested`) into
        the stats (the first-audio metric), and its path where a profiling run records it."""
        if self.first_audio_paths is not None:
            self.first_audio_paths.add(stream, now)
        waited = now - stream.requested
        for counted in self._stats_of(stream):
            counted.first_audio_seconds_sum += waited
            counted.first_audio_count += 1
            if len(counted.first_audio_samples) < MAX_FIRST_AUDIO_SAMPLES:
                counted.first_audio_samples.append(waited)

    def _end_sentence(self, stream: Stream) -> None:
        if stream.current is not None:
            self.backend.pool.release(stream.current.pages)
            stream.current = None

    def _drop_cancelled(self) -> None:
        now = time.monotonic()
        # Each stream is asked every CANCEL_CHECK_S; the streams are looked over five times
        # as often, not every step.
        if now - self._cancel_scanned_at < CANCEL_CHECK_S / 5:
            return
        self._cancel_scanned_at = now
        for stream in list(self._streams.values()):
            if now - stream.cancel_checked_at < CANCEL_CHECK_S:
                continue
            stream.cancel_checked_at = now
            if stream.sink.cancelled():
                # The final flag still goes out: Triton holds a request (and will not unload
                # the model) until its stream is finished.
                self._close(stream, StreamCancelled("the client cancelled the stream"))

    @staticmethod
    def _encoder_inputs(
        streams: list[Stream], scales: tuple[float, float, float]
    ) -> tuple[list[Sentence], np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """(sentences, ids, lengths, scales, speakers, longest) of an encoder call for the
        streams' next sentences, which it takes from them."""
        sentences = [stream.sentences.popleft() for stream in streams]
        longest = max(len(s.ids) for s in sentences)
        ids = np.zeros((len(sentences), longest), dtype=np.int64)
        for row, sentence in enumerate(sentences):
            ids[row, : len(sentence.ids)] = sentence.ids
        lengths = np.array([len(s.ids) for s in sentences], dtype=np.int64)
        speakers = np.array([s.params.speaker_id for s in streams], dtype=np.int64)
        return sentences, ids, lengths, np.array(scales, dtype=np.float32), speakers, longest

    def _encode_launched(
        self, calls: list[tuple[tuple[float, float, float], list[Stream]]]
    ) -> None:
        """A step's encoder calls on a backend that launches them (`launches_encoder`): all of
        them queued first, then each one's sentences started as its frame counts come; one
        wait for the device, not one per call (per voice)."""
        launched = [self._launch_encoding(streams, scales) for scales, streams in calls]
        for encoding in launched:
            self._finish_encoding(encoding)

    def _launch_encoding(
        self, streams: list[Stream], scales: tuple[float, float, float]
    ) -> _Encoding:
        """Queue an encoder call on the device, to be finished later (`_finish_encoding`)."""
        sentences, ids, lengths, scale_array, speakers, longest = self._encoder_inputs(
            streams, scales
        )
        voice = self._stream_voices(streams)  # planner.encoder_calls
        call = self._device.encode_launch(ids, lengths, scale_array, speakers, voice)
        return _Encoding(call, streams, speakers, longest, [len(s.ids) for s in sentences])

    def _encode(self, streams: list[Stream], scales: tuple[float, float, float]) -> None:
        if self._beside:
            # The call runs beside this step's windows and the next steps'; its streams are
            # taken up once their frame counts are on the host (`_take_up_encoded`).
            self._encoding.append(self._launch_encoding(streams, scales))
            return
        sentences, ids, lengths, scale_array, speakers, longest = self._encoder_inputs(
            streams, scales
        )
        voice = self._stream_voices(streams)  # planner.encoder_calls
        started = time.perf_counter()
        # With asynchronous calls the device may still be decoding an earlier call: time the
        # encoder's own device work, not the wait for that one.
        timing = self._device.timer() if self._async else None
        prior, frames = self.backend.encode(ids, lengths, scale_array, speakers, voice)
        self._start_sentences(streams, prior, frames, speakers, [len(s.ids) for s in sentences])
        if timing is not None:
            # No wait here: the cost is read once the device is done (`_observe_timings`),
            # and the next windows and step are planned while the flow runs.
            self._timings.append(("encoder", timing.stop(), len(streams), longest))
        else:
            self.backend.sync()
            self._observe_sync("encoder", time.perf_counter() - started, len(streams), longest)

    def _finish_encoding(self, encoding: _Encoding) -> None:
        """Wait for an encoder call, start its streams' sentences and time it."""
        timing = self._device.timer()
        prior, frames = encoding.call.finish()
        self._start_sentences(encoding.streams, prior, frames, encoding.speakers, encoding.ids)
        self._timings.append(
            (
                "encoder",
                _SummedTiming(encoding.call, timing.stop()),
                len(encoding.streams),
                encoding.width,
            )
        )

    def _take_up_encoded(self, wait_for_followed: bool = True) -> list[Stream]:
        """Start the sentences of the encoder calls beside the windows whose frame counts are
        on the host (in launch order): their prior (and flow) is queued behind the calls, and
        the planner plans their first windows from this step on. The streams taken up."""
        started: list[Stream] = []
        while self._encoding and (
            self._encoding[0].call.done()
            or (wait_for_followed and self._queued and self._encoding[0].followed)
        ):
            # (A queued call with windows behind it is waited for: it ends soon after the
            # windows before it, and checking only whether it is done put its sentences' first
            # windows a step later, behind the windows launched meanwhile.)
            encoding = self._encoding.popleft()
            self._finish_encoding(encoding)
            started.extend(encoding.streams)
        return started

    def _start_sentences(
        self,
        streams: list[Stream],
        prior: Any,
        frames: np.ndarray,
        speakers: np.ndarray,
        ids: list[int],
    ) -> None:
        """Store encoded sentences' latents (GPU backends, flowed whole) or else their prior
        frames, and make them the streams' current sentences; a stream closed meanwhile gets
        none."""
        for count, sentence_ids in zip(frames, ids, strict=True):
            self.pace.observe(sentence_ids, int(count))
        tables = [self.backend.pool.allocate(int(count)) for count in frames]
        # GPU backends may run the flow over the whole sentences here
        # (engines/runtimes/device_frames.py); the windows then need the vocoder only, and
        # the prior is not kept.
        voice = self._stream_voices(streams)
        flowed = self.backend.features.sentence_flow and self._device.flow_sentences(
            prior, tables, frames, speakers, voice
        )
        if not flowed:
            self.backend.store_prior(prior, tables, frames)
        now = time.monotonic()
        for row, stream in enumerate(streams):
            if stream.stream_id not in self._streams:  # cancelled while it was encoded
                self.backend.pool.release(tables[row])
                continue
            count = int(frames[row])
            stream.current = SentenceState(
                pages=tables[row], frames=count, flowed=count if flowed else 0
            )
            stream.window_ready_at = now
            if stream.encoded_at is None:
                stream.encoded_at = now

    # -- flow and vocoder calls for batches of same-sized windows --------------------------------
    def _run_windows(self, windows: list[Window]) -> None:
        started = time.monotonic()
        for window in windows:
            if window.stream.window_ready_at is not None:
                waited = started - window.stream.window_ready_at
                self.stats.queue_seconds_sum += waited
                self.stats.queue_count += 1
                voice = window.stream.voice
                if voice is not None:
                    voice.stats.queue_seconds_sum += waited
                    voice.stats.queue_count += 1
        if self._async:
            self._launch_windows(windows)
            return
        audio = self._vocode(windows)
        now = time.monotonic()
        for window, pcm in zip(windows, audio, strict=True):
            stream, state = window.stream, window.stream.current
            assert state is not None
            state.vocoded = window.decode[1]
            self._check_late(stream, now)
            if stream.first_audio_at is None:
                stream.first_audio_at = now
                self._count_first_audio(stream, now)
            stream.audio_seconds_sent += len(pcm) / self.sample_rate
            self.audio_seconds += len(pcm) / self.sample_rate
            stream.windows_sent += 1
            stream.window_ready_at = now
            last = state.vocoded >= state.frames and not stream.sentences
            if last:
                # Out of the live count before its end reaches the client (it goes with this
                # audio, StreamSink.last_audio): a listener that asks again at once must not
                # find its finished stream still counted against the stream limit.
                self._streams.pop(stream.stream_id, None)
            try:
                if last:
                    stream.sink.last_audio(pcm)
                else:
                    stream.sink.audio(pcm)
            except Exception as error:
                LOGGER.debug("sending to stream %s failed; dropping it", stream.stream_id)
                self._close(stream, StreamCancelled(f"the stream could not be sent: {error}"))
                continue
            if last:
                self._close(stream)  # its sentence's frames go back too
            elif state.vocoded >= state.frames:
                self._end_sentence(stream)

    def _launch_windows(self, windows: list[Window]) -> None:
        """`_run_windows` with an asynchronous vocoder call: the streams' state moves on now
        (the next step plans from it), their audio leaves from the delivery thread."""
        pending, sizes, width = self._vocode_launch(windows)
        now = time.monotonic()
        delivery = LaunchedCall(pending, [], width)
        ended: list[Stream] = []
        for row, (window, size) in enumerate(zip(windows, sizes, strict=True)):
            stream, state = window.stream, window.stream.current
            assert state is not None
            state.vocoded = window.decode[1]
            self._check_late(stream, now)
            first = stream.first_audio_at is None
            if first:
                # Playback is taken to start at the launch, a little before the audio arrives:
                # the planner then thinks a stream's buffer a little shorter than it is.
                stream.first_audio_at = now
            last = state.vocoded >= state.frames and not stream.sentences
            delivery.windows.append((stream, row, size * self.hop, first, last))
            stream.audio_seconds_sent += size * self.hop / self.sample_rate
            self.audio_seconds += size * self.hop / self.sample_rate
            stream.windows_sent += 1
            stream.window_ready_at = now
            if state.vocoded >= state.frames:
                self._end_sentence(stream)
            if last:
                ended.append(stream)
        assert self._delivery is not None
        self._delivery.audio(delivery)
        self._last_launched = pending
        for encoding in self._encoding:
            encoding.followed = True
        for stream in ended:
            self._close(stream)  # its final response follows its audio

    def _vocoder_call(self, windows: list[Window]) -> tuple[list[int], int, tuple[Any, ...]]:
        """The windows' sizes, the call's width, and the backend's vocode arguments (the
        synchronous and the asynchronous call take the same ones)."""
        context = self.windows.vocoder_context_frames
        sizes = [w.decode[1] - w.decode[0] for w in windows]
        # The windows of one call share its width and its context before them (`_run` groups
        # them by `call_key`).
        width, before = call_key(windows[0], self.windows, self.rules)
        states = [w.state for w in windows]
        ends = np.array([w.decode[1] for w in windows], dtype=np.int64)
        limits = np.minimum(np.array([s.frames for s in states], dtype=np.int64), ends + context)
        args = (
            [s.pages for s in states],
            np.array([w.decode[0] - before for w in windows], dtype=np.int64),
            limits,
            width,
            self._speakers(windows),
            (before * self.hop, (before + max(sizes)) * self.hop),
            self._call_voices(windows),
        )
        return sizes, width, args

    def _call_voices(self, windows: list[Window]) -> Any:
        """The call's voice argument: the voice's weights where its windows share one, else
        (`WindowRules.grouped_voices`) each window's voice's, a row each."""
        return self._stream_voices([w.stream for w in windows])

    def _stream_voices(self, streams: list[Stream]) -> Any:
        """`_call_voices` for a call of these streams' rows (an encoder call's). Calls split
        by voice unless the backend groups voices: only then are the rows looked at."""
        first = streams[0].voice
        if not self.rules.grouped_voices:
            return _weights(first)
        key = call_voice(first)
        if all(call_voice(stream.voice) == key for stream in streams):
            return _weights(first)
        return [_weights(stream.voice) for stream in streams]

    def _count_vocoder_batch(self, windows: list[Window]) -> None:
        """The call's windows into the scheduler's batch sizes, and each voice's share of
        them into its own (a grouped call carries several voices' windows)."""
        batches = self.stats.vocoder_batches
        batches[len(windows)] = batches.get(len(windows), 0) + 1
        # A voice's windows in the call, counted once on one of its slots: the slots of one
        # voice's instances share its calls, and their series add up to the voice's calls.
        shares: dict[Hashable, tuple[VoiceSlot, int]] = {}
        for window in windows:
            voice = window.stream.voice
            if voice is not None:
                key = call_voice(voice)
                slot, count = shares.get(key, (voice, 0))
                shares[key] = (slot, count + 1)
        for slot, count in shares.values():
            slot.stats.vocoder_batches[count] = slot.stats.vocoder_batches.get(count, 0) + 1

    def _vocode_launch(self, windows: list[Window]) -> tuple[Any, list[int], int]:
        started = time.perf_counter()
        sizes, width, args = self._vocoder_call(windows)
        pending = self._device.vocode_async(*args)
        self._count_vocoder_batch(windows)
        seconds = time.perf_counter() - started
        self._launch_s += (seconds - self._launch_s) * (LAUNCH_WEIGHT if self._launch_s else 1.0)
        return pending, sizes, width

    def _flow(self, windows: list[Window]) -> None:
        if not windows:
            return
        context = self.windows.flow_context_frames
        width, before = call_key(windows[0], self.windows, self.rules, flow=True)  # as above
        states = [w.state for w in windows]
        ends = np.array([w.flow[1] for w in windows], dtype=np.int64)
        limits = np.minimum(np.array([s.frames for s in states], dtype=np.int64), ends + context)
        started = time.perf_counter()
        timing = self._device.timer() if self._async else None
        self.backend.flow(
            [s.pages for s in states],
            np.array([w.flow[0] - before for w in windows], dtype=np.int64),
            limits,
            width,
            before,
            ends,
            self._speakers(windows),
            _weights(windows[0].stream.voice),
        )
        if timing is not None:
            self._timings.append(("flow", timing.stop(), len(windows), width))
        else:
            self.backend.sync()
            self._observe_sync("flow", time.perf_counter() - started, len(windows), width)
        for window, state in zip(windows, states, strict=True):
            state.flowed = window.flow[1]

    def _vocode(self, windows: list[Window]) -> list[np.ndarray]:
        sizes, width, args = self._vocoder_call(windows)
        started = time.perf_counter()
        pcm = self.backend.vocode(*args)
        self._observe_sync("vocoder", time.perf_counter() - started, len(windows), width)
        self._count_vocoder_batch(windows)
        return [pcm[row, : size * self.hop] for row, size in enumerate(sizes)]

    @staticmethod
    def _speakers(windows: list[Window]) -> np.ndarray:
        return np.array([w.stream.params.speaker_id for w in windows], dtype=np.int64)

    def _publish_stats(self) -> None:
        now = time.monotonic()
        window_seconds = self.windows.window_frames * self.hop / self.sample_rate
        live = len(self._streams) + len(self._incoming)
        # Each count held since the last step (the voices' since they were last counted).
        self.stats.stream_seconds += self.stats.live_streams * (now - self._live_counted_at)
        self._live_counted_at = now
        self.stats.live_streams = live
        # Counted every step while nothing is live, so that an idle loop leaves no stale count.
        if not self._async or not live or now - self._risk_counted_at >= RISK_COUNT_INTERVAL_S:
            for voice in self._voices_seen:
                voice.stats.stream_seconds += voice.stats.live_streams * (
                    now - self._risk_counted_at
                )
            self._risk_counted_at = now
            self.stats.underrun_risk_streams = 0
            voices: dict[VoiceSlot, list[int]] = {}
            for stream in [*self._streams.values(), *list(self._incoming)]:
                risk = int(
                    stream.first_audio_at is not None
                    and stream.buffered_seconds(now) < window_seconds
                )
                self.stats.underrun_risk_streams += risk
                if stream.voice is not None:
                    counts = voices.setdefault(stream.voice, [0, 0])
                    counts[0] += 1
                    counts[1] += risk
            for voice in self._voices_seen | set(voices):
                voice.stats.live_streams, voice.stats.underrun_risk_streams = voices.get(
                    voice, (0, 0)
                )
            self._voices_seen = set(voices)
        if self._on_step is not None:
            try:
                self._on_step(self.stats)
            except Exception as error:  # a metrics failure must not end anyone's stream
                self._report_on_step_error(error)

    def _report_on_step_error(self, error: Exception) -> None:
        """Log a failing `on_step` once per distinct error, not once per step."""
        text = f"{type(error).__name__}: {error}"
        if text != self._on_step_error:
            self._on_step_error = text
            LOGGER.error("publishing the scheduler's stats failed (streams go on): %s", text)
