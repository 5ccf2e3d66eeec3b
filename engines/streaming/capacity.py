"""What a scheduler holds: the real-time streams its device and its thread keep up with.

Predicted, not waited for: a real-time listener asks for one second of audio a second, and
what that second costs each stage follows from the serving plan's windows and from what the
scheduler has learnt of its calls (`CostModel`: a fixed cost per call and a cost per frame,
seeded at warmup by timed calls on a GPU and by a short stream on the CPU, then fitted to
every call it runs) and of its own thread (`host`: the thread's time per step and per
window). What the streams are like (`StreamPace`: phoneme ids and frames per sentence) is
learnt from the sentences it encodes. So a new pod knows what it holds from its first
second, at any load, and every call it runs refines the figure.

The model: with N real-time streams and steps of T seconds, a step carries N x T seconds of
audio: its windows, its sentences to encode and flow, in calls of at most the plan's batch
sizes, each with its fixed cost; where the live streams are of several voices, each running
with its own weights, a voice's rows make calls of their own, by its share of the streams
(`Layout.voice_shares`): on an H200 a packed pod that counted one voice's calls predicted
3,130 streams of ten voices, whose streams ran late at 145 (docs/gpu-runs.md). A step's
device time is those fixed costs plus the cost per frame of everything in it; the thread's,
its cost per step plus its cost per window. Where a GPU pads an encoder call's rows to one
width, each row costs as much as the call's longest sentence: the expected longest of that
many sentences like the last few hundred encoded (`longest_of`), which at 24 rows a call was
about twice the mean sentence on an H200. The streams are held where both fit in `FULL_BUSY`
of a step of `max_step_ms` (the longest step the planner makes; `paced_step_ms` where that
is shorter, the calls asynchronous and the streams paced: their steps come that often); with
the device's work asynchronous (a GPU) the two overlap, otherwise (the CPU) they add up.
Listeners that are not paced (no lead limit) make their audio sooner but need no more of it
per second: each counts as one real-time stream.

Measured where the prediction is wrong: a machine shared with other work, a burst of new
listeners whose first windows cost more than a steady stream's. A chunk sent after the
listener's audio ran out (by the scheduler's clock, playback from the first chunk on) is
late; where late chunks reach more than a few of the live streams (`Ceiling`), the pod holds
no more than a little under what was live then, whatever the model says, and raises that
figure slowly while its streams keep up, back to the prediction.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from engines.contract.plan import WindowConfig
from engines.streaming.costs import CostModel
from engines.streaming.frames import SENTENCE_FLOW_FRAMES

# The share of a step the device and the thread may be busy at the capacity: the rest is
# headroom for a burst of new listeners and for the cost model's error.
FULL_BUSY = 0.85
# Where a GPU pads an encoder call's phoneme ids (to a multiple of 32, CUDA graphs).
ENCODER_ID_MULTIPLE = 32
# The most streams the model considers (a bound for its search, not a limit).
MAX_STREAMS = 1_000_000
# Seeds for the thread's costs, before it has measured its own: per step and per window in a
# step (`python -m lab.scheduler_host`, 2,000 streams, 2026-11-29: about 1 ms a
# step and 25 us a window on the GPU path).
HOST_STEP_S = 1e-3
HOST_WINDOW_S = 25e-6
# How fast the pace and the thread's costs follow new observations.
PACE_DECAY = 0.98
# The recent sentences whose phoneme ids the pace keeps (`StreamPace.recent_ids`), and the
# fewest it judges an encoder call's width by (before that, the mean sentence's).
PACE_SAMPLE = 256
PACE_MIN_SAMPLE = 32


@dataclass
class StreamPace:
    """What a stream's sentences are like, learnt from the sentences encoded (exponentially
    weighted means): phoneme ids and latent frames per sentence, seeded with the joe voice's
    corpus figures (about 2.2 frames an id, 3 s sentences); and the phoneme ids of the last
    PACE_SAMPLE sentences, whose spread sets how wide an encoder call of many is."""

    ids_per_sentence: float = 118.0
    frames_per_sentence: float = 260.0
    recent_ids: deque[int] = field(default_factory=lambda: deque(maxlen=PACE_SAMPLE))

    def observe(self, ids: int, frames: int) -> None:
        keep = PACE_DECAY
        self.ids_per_sentence = keep * self.ids_per_sentence + (1 - keep) * max(1, ids)
        self.frames_per_sentence = keep * self.frames_per_sentence + (1 - keep) * max(1, frames)
        self.recent_ids.append(max(1, ids))

    def padded_ids(self, multiple: int) -> np.ndarray | None:
        """The recent sentences' ids padded up to `multiple`, sorted; None before
        PACE_MIN_SAMPLE sentences."""
        if len(self.recent_ids) < PACE_MIN_SAMPLE:
            return None
        ids = np.fromiter(self.recent_ids, float, len(self.recent_ids))
        return np.sort(np.ceil(ids / multiple) * multiple)


def longest_of(widths: np.ndarray, rows: float) -> float:
    """The expected longest of `rows` sentences drawn from `widths` (sorted): every row of an
    encoder call is as wide as its longest sentence. One row: the mean; many: near the
    widest. (For draws with replacement: P(longest <= the i-th of n) = (i / n) ** rows.)"""
    count = len(widths)
    below = (np.arange(count + 1) / count) ** max(1.0, rows)
    return float(widths @ np.diff(below))


@dataclass(frozen=True)
class Layout:
    """How a scheduler cuts its calls (from its plan, rules and backend)."""

    windows: WindowConfig
    ramp: float  # each window of a stream's ramp is this many times the one before
    fixed_widths: bool  # calls padded to size classes (CUDA graphs, TensorRT)
    sentence_flow: bool  # the flow runs over whole sentences after the encoder (a GPU)
    overlapped: bool  # the device's work runs beside the thread's (asynchronous calls)
    # The steps the model assumes, in ms (None: the plan's `max_step_ms`): shorter where the
    # streams are paced and steps come `paced_step_ms` apart, each paying its calls' fixed costs.
    step_ms: int | None = None
    # Each voice's share of the live streams, where each voice's rows run in calls of their
    # own (its own weights); (1.0,) for one voice, or where the backend groups voices.
    voice_shares: tuple[float, ...] = (1.0,)


@dataclass(frozen=True)
class StreamDemand:
    """One real-time stream's work per second of its audio: per stage, (rows, frames) a
    second, where frames are what the calls compute (context and padding included)."""

    rows: dict[str, float]
    frames: dict[str, float]
    windows: float  # vocoder windows a second (the thread's work per window)
    # Where encoder calls are padded to fixed widths and learnt sentences spread: their ids,
    # padded and sorted (`StreamPace.padded_ids`); a call of many rows is as wide as the
    # longest (`longest_of`), not as the mean in `frames`.
    encoder_widths: np.ndarray | None = None


def _ramp(first: int, steady: int, ramp: float, frames: int) -> list[int]:
    """The window sizes that decode a sentence of `frames` frames."""
    sizes: list[int] = []
    done, sent = 0, 0
    while done < frames:
        size = min(steady, int(first * ramp ** min(sent, 64)))
        size = min(size, frames - done)
        sizes.append(size)
        done += size
        sent += 1
    return sizes


def stream_demand(layout: Layout, pace: StreamPace, frames_per_s: float) -> StreamDemand:
    """What one real-time stream asks of each stage a second, by `layout` and `pace`."""
    cfg = layout.windows
    frames = max(1, round(pace.frames_per_sentence))
    sentences_per_s = frames_per_s / frames
    sizes = _ramp(cfg.first_window_frames, cfg.window_frames, layout.ramp, frames)
    vocoder_frames = sum(
        (cfg.size_class(size) if layout.fixed_widths else size) + 2 * cfg.vocoder_context_frames
        for size in sizes
    )
    if layout.sentence_flow:
        flow_rows = 1.0
        flow_frames = next((s for s in SENTENCE_FLOW_FRAMES if s >= frames), frames)
    else:
        chunks = _ramp(2 * cfg.first_window_frames, 2 * cfg.window_frames, layout.ramp, frames)
        flow_rows = float(len(chunks))
        flow_frames = sum(
            (cfg.size_class(chunk, flow=True) if layout.fixed_widths else chunk)
            + 2 * cfg.flow_context_frames
            for chunk in chunks
        )
    ids = pace.ids_per_sentence
    widths = None
    if layout.fixed_widths:
        ids = math.ceil(ids / ENCODER_ID_MULTIPLE) * ENCODER_ID_MULTIPLE
        widths = pace.padded_ids(ENCODER_ID_MULTIPLE)
    return StreamDemand(
        rows={
            "encoder": sentences_per_s,
            "flow": flow_rows * sentences_per_s,
            "vocoder": len(sizes) * sentences_per_s,
        },
        frames={
            "encoder": ids * sentences_per_s,
            "flow": flow_frames * sentences_per_s,
            "vocoder": vocoder_frames * sentences_per_s,
        },
        windows=len(sizes) * sentences_per_s,
        encoder_widths=widths,
    )


def _calls(rows: float, max_rows: int, widths: int, shares: np.ndarray) -> float:
    """Calls a step makes for `rows` rows of a stage spread over `widths` call widths and
    over voices by their `shares` (each voice's rows in calls of their own): at least one per
    width and voice with rows (a row where a voice has less than one a width), one more per
    `max_rows` beyond."""
    if rows <= 0:
        return 0.0
    per_width = rows * shares / widths
    return float(widths * np.maximum(np.minimum(per_width, 1.0), per_width / max_rows).sum())


def step_seconds(
    streams: float,
    step_s: float,
    demand: StreamDemand,
    costs: CostModel,
    host: CostModel,
    layout: Layout,
) -> tuple[float, float]:
    """(device seconds, thread seconds) of a step of `step_s` seconds at `streams` streams."""
    cfg = layout.windows
    audio = streams * step_s
    limits = {
        "encoder": cfg.max_encoder_batch,
        "flow": cfg.max_encoder_batch if layout.sentence_flow else cfg.max_batch_windows,
        "vocoder": cfg.max_batch_windows,
    }
    widths = {
        "encoder": 1,
        "flow": 1 if layout.sentence_flow else len(cfg.window_sizes()),
        "vocoder": len(cfg.window_sizes()),
    }
    shares = np.asarray(layout.voice_shares, float)
    device = 0.0
    for stage in ("encoder", "flow", "vocoder"):
        rows = audio * demand.rows[stage]
        calls = _calls(rows, limits[stage], widths[stage], shares)
        frames = audio * demand.frames[stage]
        if stage == "encoder" and demand.encoder_widths is not None and calls:
            frames = rows * longest_of(demand.encoder_widths, rows / calls)
        device += calls * costs.per_call[stage] + frames * costs.per_frame[stage]
    windows = audio * demand.windows
    thread = host.per_call["step"] + host.per_frame["step"] * windows
    return device, thread


def predicted_capacity(
    demand: StreamDemand, costs: CostModel, host: CostModel, layout: Layout
) -> int:
    """The most real-time streams whose steps (`Layout.step_ms`, else `max_step_ms`) keep the
    device and the thread within FULL_BUSY of the step (their sum, where they do not overlap)."""
    step_s = (layout.step_ms or layout.windows.max_step_ms) / 1000

    def fits(streams: float) -> bool:
        device, thread = step_seconds(streams, step_s, demand, costs, host, layout)
        busy = max(device, thread) if layout.overlapped else device + thread
        return busy <= FULL_BUSY * step_s

    if not fits(1):
        return 1  # one stream is always taken: a pod that holds none is of no use
    low, high = 1, 2
    while high < MAX_STREAMS and fits(high):
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def host_costs() -> CostModel:
    """The thread's cost model: seconds per step (`per_call`) and per window (`per_frame`) of
    the one pseudo-stage `step`, seeded with HOST_STEP_S and HOST_WINDOW_S."""
    model = CostModel(fixed_part=True, stages=("step",))
    model.per_call["step"], model.per_frame["step"] = HOST_STEP_S, HOST_WINDOW_S
    return model


# Where streams run late (`Ceiling`): the distinct streams late within LATE_WINDOW_S that mean
# the pod holds fewer than are live (this share of them, at least one).
LATE_WINDOW_S = 1.0
LATE_SHARE = 0.005
# What it holds then: this share of the streams live at the late chunk; cut again at most
# every CUT_INTERVAL_S (a cut acts on new listeners, the admitted ones stay), and raised by
# RAISE_SHARE (at least a stream) every RAISE_INTERVAL_S without late streams, until it meets
# the prediction again. A prediction above the highest of those given within REFERENCE_S
# before the cut (the streams' mix got cheaper: one voice's after ten voices') raises it in
# proportion; the highest, not the last, so that a cut at a dip of a noisy prediction is not
# lifted when the prediction comes back; and only of those made with at least
# REFERENCE_LIVE_SHARE of the streams live at the cut, so that an idle pod's prediction (no
# mix at all) or a few first streams' does not stand for the mix that ran late.
REFERENCE_S = 10.0
REFERENCE_LIVE_SHARE = 0.5
CUT_SHARE = 0.9
CUT_INTERVAL_S = 1.0
RAISE_INTERVAL_S = 2.0
RAISE_SHARE = 0.02
# "0" in the environment: the prediction alone (late chunks are still counted).
CEILING_ENV = "VOXFLEET_LATE_CEILING"


class Ceiling:
    """The most streams a scheduler holds by what its streams measured: none (the prediction
    stands) until late chunks reach more than LATE_SHARE of the live streams within
    LATE_WINDOW_S; then CUT_SHARE of the live streams, raised again while they keep up, and in
    proportion to the prediction where it rises above the highest of the REFERENCE_S before
    the cut. Late chunks while a voice loads (`loading`) do not count.
    Called from the scheduler's thread (`late`) and from the threads that admit streams
    (`held`)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.value: float | None = None
        self.live_at_cut = 0  # the live streams when it was last cut
        # (when, what `held` was given, the streams live then or None where not told)
        self._predictions: deque[tuple[float, int, int | None]] = deque()
        self._reference = 0  # the highest prediction within REFERENCE_S before the cut
        self._late: deque[tuple[float, int]] = deque()  # (when, stream id)
        self._cut_at = -math.inf
        self._raised_at = -math.inf
        self._loads = 0  # voices loading now
        self._loaded_at = -math.inf  # when the last load ended
        self._lock = threading.Lock()

    @contextmanager
    def loading(self) -> Iterator[None]:
        """A voice of the architecture loads meanwhile: late chunks then, and within
        LATE_WINDOW_S after, do not cut. A load stalls the streams for a moment, fewer streams
        would not have kept them in time, and a cut at the few hundred streams live then held
        the pod far under its prediction for minutes: on an H200 five loads under 200 streams
        cut a packed pod to 117 streams where it predicted about 2,100, and it refused 2,138
        of the next 250 listeners (docs/gpu-runs.md)."""
        with self._lock:
            self._loads += 1
        try:
            yield
        finally:
            with self._lock:
                self._loads -= 1
                self._loaded_at = time.monotonic()

    def late(self, now: float, stream_id: int, live: int) -> bool:
        """A chunk of stream `stream_id` went out late, `live` streams live; True where that
        cut what the scheduler holds."""
        if not self.enabled:
            return False
        with self._lock:
            if self._loads or now - self._loaded_at < LATE_WINDOW_S:
                return False
            self._late.append((now, stream_id))
            while self._late and now - self._late[0][0] > LATE_WINDOW_S:
                self._late.popleft()
            streams = len({stream for _, stream in self._late})
            if streams < max(1.0, LATE_SHARE * live) or now - self._cut_at < CUT_INTERVAL_S:
                return False
            cut = max(1, math.floor(CUT_SHARE * live))
            self.value = cut if self.value is None else min(self.value, cut)
            self.live_at_cut = live
            self._reference = max(
                (
                    predicted
                    for _, predicted, at in self._predictions
                    if at is None or at >= REFERENCE_LIVE_SHARE * live
                ),
                default=0,
            )
            self._cut_at = self._raised_at = now
            self._late.clear()
            return True

    @classmethod
    def from_environment(cls) -> Ceiling:
        """On, unless CEILING_ENV is "0"."""
        return cls(enabled=os.environ.get(CEILING_ENV, "1").strip() != "0")

    def held(self, now: float, predicted: int, live: int | None = None) -> int:
        """What the scheduler holds: `predicted`, or less where its streams ran late. A
        prediction that falls below the ceiling for a while does not end it: only raising it
        past the prediction does (else a dip in the prediction would forget what the streams
        measured). A prediction above the highest within REFERENCE_S before the cut (of
        those made with REFERENCE_LIVE_SHARE of the cut's streams live, where `live` says
        what was live) scales the ceiling by their ratio: the streams' mix got cheaper (on an
        H200 a cut at some 200 streams of 100 voices held a packed pod there for one voice's
        listeners, which it predicts some 2,000 of, and refused 1,467 requests of its 250
        unpaced listeners; docs/gpu-runs.md). A prediction that falls is not followed down:
        the ceiling is what the streams measured."""
        with self._lock:
            self._predictions.append((now, predicted, live))
            while now - self._predictions[0][0] > REFERENCE_S:
                self._predictions.popleft()
            if self.value is None:
                return predicted
            if not self._reference:
                self._reference = predicted
            scale = max(1.0, predicted / self._reference)
            raises = math.floor((now - self._raised_at) / RAISE_INTERVAL_S)
            for _ in range(max(0, raises)):
                self.value += max(1.0, self.value * RAISE_SHARE)
                if self.value * scale >= predicted:
                    self.value = None
                    break
            if raises > 0:
                self._raised_at += raises * RAISE_INTERVAL_S
            if self.value is None:
                return predicted
            return min(predicted, math.floor(self.value * scale))
