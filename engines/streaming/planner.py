"""Choosing a step's work: which sentences to encode and which windows to decode.

Pure: the planner reads streams, the window settings and the cost model, and calls no stage,
so it is tested without a runtime. The scheduler (engines/streaming/scheduler.py) runs what
it plans.

A stream's windows grow from `first_window_frames` (short, for first audio) by a fixed ratio
(`WindowRules.ramp`: doubling where engines are built for fixed sizes, 1.5 on the CPU) up to
`window_frames`, so the second chunk is due soon after the first and steady windows keep the
context overhead small. Window k decodes frames [start, end); its flow chunk is computed one
vocoder context ahead, so the vocoder always has real right context.
"""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np

from engines.contract.plan import WindowConfig
from engines.streaming.costs import CostModel
from engines.streaming.types import Stream, Window, call_voice

# Never shrink a step below this on account of streams that are already late: a late stream
# is best helped by a step that still makes progress for everyone.
MIN_STEP_BUDGET_S = 0.03
# Where an encoder call has a large fixed cost (a GPU), a new stream waits up to this many
# such costs, never more than `WindowConfig.max_encoder_wait_ms`, for others to share its
# call; only on a busy scheduler (at least ENCODE_HOLD_MIN_STREAMS live), where others arrive,
# and only where steps are shorter than that wait: the streams that arrived during a step at
# least as long share its call already, and one held back then waits a whole step more.
# Through Triton on the H100 (two instances, 45 ms steps, 500 streams), a new stream took 81
# to 84 ms to be encoded (p50) with the hold and 49 to 50 without (docs/history.md,
# 2026-11-25).
ENCODE_HOLD_CALLS = 5.0
ENCODE_HOLD_MIN_STREAMS = 16
# Where voices' encoder calls split (each voice's own weights), a busy step opens another
# voice's encoder call only while the fixed costs of the step's encoder calls stay within this
# share of its budget; that voice's sentences wait for a later step, and every sentence of a
# voice whose call is open joins it at the cost of its row. Without it, a step of ten busy
# voices went to two to five encoder calls of one or two sentences each, whose fixed costs
# took most of the step, and the windows of playing streams the rest: 20 to 39 windows a
# step against 118 for one voice (`python -m lab.scheduler_host --voices 10`, H200 and H100
# call costs), and on the H200 29 windows a step in 14 calls of two rows (docs/gpu-runs.md).
# With it the same probe planned 120 to 139 windows and 21 sentences a step, in fewer and
# fuller calls; on the H200 ten voices made 0.51 of one voice's audio, not 0.20, and 100
# voices by Zipf(1.1) 0.33, not 0.17 (three packing pods each; first audio p95 at ten voices
# rose from 194 to 389 ms, with no listener refused). One voice's steps are as before: its
# first call always opens.
ENCODE_VOICES_SHARE = 0.25
# The same share where the step's streams are of several voices and none is paced (no lead
# limit, `_unpaced_voices`): such listeners want their audio as fast as it comes, and
# a packed pod that serves them is bound by its device, which spends an encoder call's fixed
# cost (3 to 4 ms on an H200) for every voice's call however few sentences it carries. With a
# tenth of the step's budget a busy step opens about one voice's encoder call and the voices
# take turns, each call fuller. On an H200 pool pod (12 voices, 16 GiB MPS limit, 250
# unpaced listeners over ten voices, three fresh pods each, side by side) ten voices made
# 3,277 (3,260) audio-s/s with it against 2,778 (2,749) with a quarter, 0.856 of one voice's
# 3,830; first audio p95 rose from 241 to 354 ms; none refused, no stream late
# (docs/gpu-runs.md). Paced listeners, whose next sentence is due within their lead, keep
# the quarter.
ENCODE_UNPACED_SHARE = 0.1
# Where the host launches the vocoder's calls (asynchronous calls: a GPU), a busy step
# (`ENCODE_HOLD_MIN_STREAMS` live) whose streams are of several voices, none of them paced (a
# lead limit), launches one vocoder call a voice, cut for its widest window: a narrower window
# takes as much more of its sentence as that call's rows hold (`_one_call_a_voice`), so the row
# the device computes anyway carries audio. And it opens another voice's call for windows that
# can wait only while launching its calls takes the host at most this share of the step's
# budget (`plan_step`'s `launch_s`: a launch as the scheduler measures it); that voice's
# windows wait for a later step, the one running dry first going first, and a window whose
# audio runs out within a step is always served. A launch costs the host about the same for 5
# windows as for 30 (610 and 823 us of the thread's CPU on an H200, `python -m
# lab.call_host_costs`), and a packed pod's ten voices took 20 to 22 calls of about 5 windows a
# step, a call for each voice and window size, where one voice took 4 of about 30: the
# scheduler thread spent two thirds of its step launching them (docs/gpu-runs.md). On an H200
# pool pod (three pods each, 250 unpaced listeners) ten voices made 2,662 audio-s/s with it
# where they made 2,107 without, and 100 voices by Zipf(1.1) had first audio at p95 in 384 ms,
# not 700. Not for one voice, whose steps take few full calls already: with it one voice made
# 9 % more audio but had first audio later (p95 158 against 141 ms), and 3,000 paced listeners
# of one voice had 448 of 6,479 streams underrun where 14 of 6,229 did without (one run each).
# Nor where streams are paced: their steps gather windows already (`WindowConfig.paced_step_ms`),
# and a widened window's audio is made before it is due.
VOCODER_LAUNCH_SHARE = 0.15

# BURST: where at least a full encoder call's worth of new streams wait (`max_encoder_batch`,
# listeners arriving together), a new stream late for its first audio does not shorten the
# step to its own slack (30 ms, `MIN_STEP_BUDGET_S`, once it is late): the step takes new
# sentences up to its whole length (`max_step_ms`), in fewer and fuller encoder calls, whose
# fixed cost is most of a call on a GPU. Playing streams' slack still bounds it. Outside a
# burst a late new stream keeps the step short, so that the next one's wait stays short too:
# through Triton on the H100, new streams never shortening the step doubled first audio's
# p50 at 500 and 1,000 streams (docs/history.md, 2026-11-25).

# A playing stream with at least this much audio buffered has a lead: where the runtime takes
# windows of any width (onnxruntime), it may take a longer window and flow chunk
# (`WindowRules`) and pay the context frames once where it would pay them twice or more. The
# planner takes the longer window only where its cost still fits the step.
LEAD_SECONDS = 0.5

# How much longer each window of a stream's ramp is than the one before, where calls take any
# width (onnxruntime). Each window must be decoded while the one before it plays, so during its
# ramp a stream needs its audio this many times faster than it plays; with doubling, listeners
# arriving together needed more than two cores have (docs/history.md, 2026-11-24). 1.5 takes
# a few more calls: windows of 16, 24, 36, 54, 81, 121 and then 128 frames.
CPU_RAMP = 1.5
# The margin the CPU planner keeps before each stream's deadline (`WindowRules`).
CPU_DEADLINE_MARGIN_S = 0.04
# A new stream's first audio is due this long after it arrives (after its encoder call), as
# the planner orders it among the playing streams (`WindowRules.first_audio_s`).
FIRST_AUDIO_S = 0.05
# The same on the CPU: playing streams whose audio runs out sooner go first. Well inside the
# 300 ms first-audio bound that `make bench` holds the CPU to; where nothing else is due, first
# audio is as soon as before.
# Listeners arriving together (each level of `voxfleet bench` starts its N listeners within a
# second) otherwise took the steps their playing neighbours' windows needed: in an A/B of fresh
# servers (docs/history.md, 2026-11-24), 20 listeners held in 4 of 8 runs with 50 ms and 9 of
# 11 with 200 ms, and `make bench` then held half the machine limit in 7 runs of 7.
CPU_FIRST_AUDIO_S = 0.2
# A step looks at no more playing streams than this many times the windows it may take: the
# ones whose audio runs out first (`_most_urgent`). A step full by its estimated time (a GPU
# at 2,000 streams takes about 100 windows) worked out the next window of every other stream
# only to leave it for later: 7.8 ms of the scheduler thread's 31 ms per step in
# `python -m lab.scheduler_host`, 2.5 ms with this (docs/history.md).
# The others have more audio buffered than all of these; the padding rows a step fills
# (`fill_buckets`) still have three candidates for each window the step may take.
PLAN_SCAN_WINDOWS = 4
# Where more new listeners of a voice wait for their first sentence's encoder call than one
# call takes (`max_encoder_batch`, a burst) and every row of a call is as wide as its longest
# sentence (a fixed-shape encoder: `WindowRules.match_lengths`), the call takes the oldest of
# them and, among the oldest MATCH_CALLS calls' worth, those nearest it in length, not the
# next in arrival order. Thirty-two sentences taken in arrival order are padded to the longest
# of them, and the encoder's device time sets a burst's first audio. On an H200, 2,000
# listeners within 1 s: rows of 224 to 235 phoneme ids against 268 to 274, first audio p95
# 672 ms against 765 (four runs each, docs/gpu.md). The oldest is always taken, so no one
# waits behind a later arrival for long.
MATCH_CALLS = 4
# Where a busy step's streams are of several voices and none is paced (`_unpaced_voices`,
# a packed pod bound by its device) and its vocoder calls are padded to batch buckets (CUDA
# graphs), the padding rows left after `fill_buckets` take the windows that follow the call's
# own in their sentences (`fill_with_next_windows`), up to this many further windows of a
# stream a step. Each voice's streams are all in such a step already, so `fill_buckets` has no
# other window of the call's width for its empty rows: about a quarter of the vocoder's rows
# were padding (`python -m lab.modelled_device`). On an H200 pool pod (101 voices, 16 GiB MPS
# limit, 250 unpaced listeners, three fresh pods each, side by side) ten voices made 3,623
# (3,352) audio-s/s with them against 3,072 (3,032), and 100 voices by Zipf(1.1) 1,460 (1,327)
# against 1,235 (1,216), first audio no later. One voice's steps take them only where they
# take two encoder calls a step (`ENCODER_CALLS_A_STEP` says why). Buckets double,
# so one pass fills a call whenever its streams have a window left; the further passes are for
# calls where some have none.
NEXT_WINDOW_PASSES = 3
# Where calls have fixed shapes (a GPU), a step takes new sentences for up to this many encoder
# calls of `max_encoder_batch` rows each (`WindowRules.encoder_calls`; `encoder_calls` splits
# them), so that where more sentences wait than one call takes, the encoder keeps pace with
# streams whose sentences end sooner: one voice's busy unpaced steps then take next windows
# too (`fill_with_next_windows`). With one call a step, one voice's 2,000 unpaced listeners
# made 7 % more audio with next windows, but their sentences ended sooner than its calls of
# 32 could start new ones: first audio at p95 went from 141 to 158 ms to 849 to 1,285 ms,
# 7 to 12 streams ran late. With two (on an H200, three pairs of fresh servers side by side,
# docs/gpu-runs.md) they made 1.075 (worst 1.070) times the audio of one call without next
# windows, 0.822 (0.820) of the stage limit, first audio at p95 169 to 343 ms against 136 to
# 146, no stream late; in a 101-voice pod one voice made 1.078 times the audio at 250
# listeners. Only for one voice, unpaced: a step that took more calls than may still go out
# ran streams late in `python -m lab.modelled_device`, and so did paced listeners arriving
# together, where one call a step admits no more new streams than the device keeps up with.
ENCODER_CALLS_A_STEP = 2

Scales = tuple[float, float, float]


@dataclass(frozen=True)
class WindowRules:
    """How a scheduler's windows are cut, beyond the serving plan's `WindowConfig`.

    `exact_widths`: calls are as wide as their windows (plus context) rather than rounded up
    to the few widths that fixed-shape engines (CUDA graphs, TensorRT profiles) are built for;
    windows of different widths then never share a call, which costs nothing where the cost
    per frame does not fall with the batch (the CPU). `lead_window_frames` and
    `lead_flow_frames`: the window and the flow chunk of a stream with a lead (0: no lead
    windows). `merge_tails`: a short rest of a sentence goes with the window or flow chunk
    before it instead of a call of its own (`next_window`). `deadline_margin_s`: every stream
    is planned as if its audio ran out this much sooner, for the cost model's error (a CPU
    call's time varies by a quarter on a shared machine) and the response's way to the
    listener; without it the planner fills a step up to a stream's last moment, and a
    listener's second chunk, due 186 ms after its first, came 6 to 13 ms late now and then
    (docs/reliability.md). `batch_buckets`: the batch sizes (ascending) a fixed-shape engine
    pads its calls up to (CUDA graphs captured per batch bucket); the rows of padding cost the
    device as much as rows of windows, so the planner fills them with the next windows of
    playing streams that were not due yet (`fill_buckets`). Empty: calls are as long as their
    windows. `ramp`: each window of a stream's ramp is this many times the one before (rounded
    down), from `first_window_frames` up to `window_frames`; fixed-shape engines keep 2, the
    sizes they are built for (`CPU_RAMP` says why the CPU takes less). `trim_edges` (with exact
    widths): a call takes no context frames past the sentence's edges. The conv layers pad a
    call's edges with zeros as they pad the sentence's in a one-shot decode, so the audio
    there is the one-shot decode's, from fewer frames. `first_audio_s`: a new stream's first
    audio is planned as due this long after it arrived (`Stream.deadline`); the CPU's is later
    than a GPU's (`CPU_FIRST_AUDIO_S` says why). `grouped_voices`: a vocoder call takes the
    windows of every voice (the backend runs them as one grouped call, each voice's rows
    against its own weights: `BackendFeatures.groups_voices`), so the vocoder's calls are
    one per width, not one per width and voice (and the encoder's, `encoder_calls`, not one
    per voice). `match_lengths`: in a burst, a step's new sentences are the oldest new
    stream's and those nearest it in length (`MATCH_CALLS`), for an encoder whose every row
    is as wide as the call's longest sentence. `next_windows` (with batch buckets): on a busy
    step of several voices, none paced, the padding rows still empty after `fill_buckets` take
    the following windows of the streams already in the call (`fill_with_next_windows`); of
    one voice too where `encoder_calls` is more than 1. `encoder_calls`: a step takes new
    sentences for up to this many encoder calls of `max_encoder_batch` rows each
    (`ENCODER_CALLS_A_STEP`, the GPU's; 1, the CPU's).
    """

    exact_widths: bool = False
    lead_window_frames: int = 0
    lead_flow_frames: int = 0
    merge_tails: bool = False
    deadline_margin_s: float = 0.0
    batch_buckets: tuple[int, ...] = ()
    ramp: float = 2.0
    trim_edges: bool = False
    first_audio_s: float = FIRST_AUDIO_S
    grouped_voices: bool = False
    match_lengths: bool = False
    next_windows: bool = False
    encoder_calls: int = 1

    def __post_init__(self) -> None:
        if self.encoder_calls < 1:
            raise ValueError(f"encoder_calls must be at least 1, got {self.encoder_calls}")
        if not self.ramp > 1.0:
            raise ValueError(f"ramp must be more than 1, got {self.ramp}")
        if not self.first_audio_s > 0:
            raise ValueError(f"first_audio_s must be positive, got {self.first_audio_s}")
        if self.trim_edges and not self.exact_widths:
            raise ValueError("trim_edges needs exact_widths: a fixed-shape call has one width")


def cpu_rules(lead_frames: int = 0) -> WindowRules:
    """How windows are cut where calls take any width (onnxruntime): exact widths, short tails
    merged, the CPU's deadline margin, ramp and first-audio due time, no context past a
    sentence's edges; with `lead_frames`, a stream with a lead takes windows of twice and flow
    chunks of four times that many frames."""
    return WindowRules(
        True,
        lead_window_frames=2 * lead_frames,
        lead_flow_frames=4 * lead_frames,
        merge_tails=True,
        deadline_margin_s=CPU_DEADLINE_MARGIN_S,
        ramp=CPU_RAMP,
        trim_edges=True,
        first_audio_s=CPU_FIRST_AUDIO_S,
    )


@dataclass
class StepPlan:
    """A step's work: streams whose next sentence is encoded, then windows to decode.

    `rest_until`: when the first playing stream left out for its lead (`plan_step`'s lead
    limit) falls back under the limit; None where none was. `rest_lead_s`: the least lead
    limit of those streams. `full`: work was left for a later step by the step's limits (its
    batch sizes, its time, the streams it looks at), not only by the streams' leads.
    """

    encodes: list[Stream] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    rest_until: float | None = None
    rest_lead_s: float | None = None
    full: bool = False

    def __bool__(self) -> bool:
        return bool(self.encodes or self.windows)


def next_window(
    stream: Stream, cfg: WindowConfig, rules: WindowRules = WindowRules(), lead: bool = False
) -> Window:
    """The stream's next window of its current sentence, with the flow chunk it needs; with
    `lead`, the lead window and flow chunk of `rules` where they are longer than the usual ones.

    With `rules.merge_tails`, a rest of the sentence of at most `first_window_frames` after a
    window (not the first: first audio stays as soon as it is) goes with that window, and a
    rest of at most twice that after a flow chunk goes with the chunk, within the steady
    window and chunk: a call of its own would pay the context frames again for a few frames
    of audio. For requests of 1 to 4 words it cuts the flow's frames by 12 % and the vocoder's
    by 2 % (`python -m lab.window_frames`, docs/streaming.md).
    """
    state = stream.current
    assert state is not None
    grown = cfg.first_window_frames * rules.ramp ** min(stream.windows_sent, 64)
    size = min(cfg.window_frames, int(grown))
    chunk = 2 * size
    if lead:
        size, chunk = max(size, rules.lead_window_frames), max(chunk, rules.lead_flow_frames)
    start, end = state.vocoded, min(state.frames, state.vocoded + size)
    if (
        rules.merge_tails
        and stream.windows_sent
        and state.frames - end <= cfg.first_window_frames
        and state.frames - start <= max(size, cfg.window_frames)
    ):
        end = state.frames
    needed = min(state.frames, end + cfg.vocoder_context_frames)
    if state.flowed >= needed:
        return Window(stream, (state.flowed, state.flowed), (start, end))
    flow_end = min(state.frames, max(needed, state.flowed + chunk))
    if (
        rules.merge_tails
        and state.frames - flow_end <= 2 * cfg.first_window_frames
        and state.frames - state.flowed <= max(chunk, 2 * cfg.window_frames)
    ):
        flow_end = state.frames
    return Window(stream, (state.flowed, flow_end), (start, end))


def widened(stream: Stream, cfg: WindowConfig, size: int) -> Window | None:
    """The stream's next window in a vocoder call cut for windows of `size` frames (a size class
    wider than its own window's): as much of its sentence as that holds, so the row the call
    computes anyway carries audio; None where its flow has not reached that far."""
    state = stream.current
    assert state is not None
    start = state.vocoded
    end = min(state.frames, start + size)
    if state.flowed < min(state.frames, end + cfg.vocoder_context_frames):
        return None
    return Window(stream, (state.flowed, state.flowed), (start, end), size)


def call_frames(frames: int, cfg: WindowConfig, rules: WindowRules, flow: bool = False) -> int:
    """Frames a call gives `frames` frames of window (context not counted): the smallest
    size class that holds them, or exactly `frames` with exact widths."""
    return frames if rules.exact_widths else cfg.size_class(frames, flow=flow)


def call_key(
    window: Window, cfg: WindowConfig, rules: WindowRules, flow: bool = False
) -> tuple[int, int]:
    """(width, context frames before the window) of the window's vocoder call, or of its flow
    call with `flow`: windows with the same key share a call.

    The context is `cfg`'s on both sides; with `rules.trim_edges`, none past the sentence's
    edges, so a call at an edge is narrower (and its key differs)."""
    if window.size and not flow:  # a wider call's (fixed widths: context on both sides)
        return window.size + 2 * cfg.vocoder_context_frames, cfg.vocoder_context_frames
    span = window.flow if flow else window.decode
    return _span_call(span, window.state.frames, cfg, rules, flow)


def _span_call(
    span: tuple[int, int], sentence_frames: int, cfg: WindowConfig, rules: WindowRules, flow: bool
) -> tuple[int, int]:
    """`call_key` of frames `span` of a sentence of `sentence_frames` frames."""
    context = cfg.flow_context_frames if flow else cfg.vocoder_context_frames
    frames = call_frames(span[1] - span[0], cfg, rules, flow=flow)
    if not rules.trim_edges:
        return frames + 2 * context, context
    before = min(context, span[0])
    after = min(context, sentence_frames - span[1])
    return frames + before + after, before


def first_call_width(cfg: WindowConfig, rules: WindowRules) -> int:
    """The width of a new stream's first vocoder call, for a sentence longer than its first
    window and that window's context (its frame count is known only once it is encoded)."""
    first = cfg.first_window_frames
    return _span_call((0, first), first + cfg.vocoder_context_frames, cfg, rules, False)[0]


# A stage call: (stage, width, voice). Windows share a call only where all three agree: the
# voices of one scheduler each run with their own weights (VoiceSlot, `call_voice`), unless the
# backend groups them (`WindowRules.grouped_voices`: the vocoder's voice is then None).
Call = tuple[str, int, object]


def window_calls(
    window: Window, cfg: WindowConfig, rules: WindowRules = WindowRules()
) -> list[Call]:
    """The (stage, width, voice) calls a window takes part in; same-width windows of one
    voice share one (of any voice, for the vocoder where `rules.grouped_voices`)."""
    voice = call_voice(window.stream.voice)
    vocoder_voice = None if rules.grouped_voices else voice
    calls: list[Call] = [("vocoder", call_key(window, cfg, rules)[0], vocoder_voice)]
    if window.flow[1] > window.flow[0]:
        calls.append(("flow", call_key(window, cfg, rules, flow=True)[0], voice))
    return calls


def group_calls(
    windows: list[Window], size: Callable[[Window], Hashable], batching: bool
) -> list[list[Window]]:
    """One call per size; one call per window when cross-stream batching is off."""
    if not batching:
        return [[window] for window in windows]
    groups: dict[Hashable, list[Window]] = {}
    for window in windows:
        groups.setdefault(size(window), []).append(window)
    return list(groups.values())


def _cost(costs: CostModel, calls: list[Call], planned: set[Call]) -> float:
    return sum(costs.estimate(call[0], call[1], call not in planned) for call in calls)


def _encode_cost(
    costs: CostModel, call: tuple[int, int], ids: int, call_rows: int = 0
) -> tuple[float, bool]:
    """What a sentence of `ids` phoneme ids adds to a step's encoder call of `call` (rows,
    width), and whether it joins that call: joined, its own row and, where it is the longest,
    the padding it gives the others (every row of a call is as wide as its longest); where
    that costs more than a call of its own (as `encoder_calls` splits them), or the call has
    its `call_rows` (0: no limit), a call's fixed cost and its row (it opens the next call)."""
    rows, width = call
    own = costs.estimate("encoder", ids, True)
    if rows == 0 or (call_rows and rows >= call_rows):
        return own, True
    joined = costs.estimate("encoder", (rows + 1) * max(width, ids) - rows * width, False)
    return (joined, True) if joined <= own else (own, False)


def plan_step(
    streams: list[Stream],
    cfg: WindowConfig,
    costs: CostModel,
    batching: bool,
    now: float,
    rules: WindowRules = WindowRules(),
    encoder_beside: bool = False,
    step_interval_s: float = 0.0,
    encoder_queued: bool = False,
    launch_s: float = 0.0,
    launch_share: float = VOCODER_LAUNCH_SHARE,
    unpaced_encode_share: float = ENCODE_UNPACED_SHARE,
    encoder_streams: int = 1,
    encoder_calls: int | None = None,
) -> StepPlan:
    """Earliest deadline first over all work: sentences to encode and windows to decode.

    Work is added while every chosen stream still gets its audio before its deadline and
    the step stays under `max_step_ms` (both by the cost model), so a stream that arrives
    while others race ahead of playback waits one short step, not one long one. A playing
    stream that cannot wait a whole step is always served (its window runs before any
    encoder call), and nothing is added that would make a playing stream left for later
    run dry. A stream whose sentence is encoded this step also gets its first window. A
    stream with a lead takes a lead window (`rules`) where it fits the step, else the usual one.
    With `encoder_beside` (a GPU's encoder launched, not waited for), a sentence's first window
    comes in a later step, once its frame counts are known, and its encoder call costs the
    step nothing where it runs beside the windows, on a stream of its own. Queued behind them
    on their stream (`encoder_queued`), it costs the step its device time: the windows of the
    next step wait behind it there, as they wait for an encoder call in the step, so a playing
    stream that could not wait that long is served first and the new stream waits a step.

    With cross-stream batching a step looks at every stream with a sentence to encode but
    only the `PLAN_SCAN_WINDOWS` x `max_batch_windows` playing streams whose audio runs out
    first: the others have more audio buffered than any of these, and their turn comes in a
    later step.

    On a busy GPU scheduler a new stream may be held back a little for others to share its
    encoder call (`ENCODE_HOLD_CALLS`), unless the step before took `step_interval_s` (the
    time since its plan) at least as long as that. There, where voices' encoder calls split,
    a step opens another voice's call only while its encoder calls' fixed costs stay within
    `ENCODE_VOICES_SHARE` of its budget, or `unpaced_encode_share` (`ENCODE_UNPACED_SHARE`)
    where its streams are of several voices and none is paced; the other voices' new streams
    wait a step. Over `encoder_streams` CUDA streams (queued calls side by side) that many
    calls always open, as one call does on one stream: their costs, as the cost model learns
    them, are each call's share of the time they ran side by side. Likewise,
    where its streams are of several voices and none is paced, with `launch_s` (the host's
    time to launch a vocoder call; 0: not counted), each voice's windows share one vocoder
    call cut for the widest of them, and a window that can wait opens another voice's call
    only while the step's launches take at most `launch_share` (`VOCODER_LAUNCH_SHARE`) of
    its budget; it waits a step, and windows joining the open calls take its place.

    A step takes new sentences for one encoder call of `cfg.max_encoder_batch` rows; a busy
    step of one voice, unpaced, for `rules.encoder_calls` calls (`ENCODER_CALLS_A_STEP`), no
    more than `encoder_calls` (those that may still go out beside the windows; None: any).

    With a lead limit (the stream's own `Stream.lead_limit_s`, its voice's, else
    `cfg.max_lead_ms`), a playing stream with that much audio sent and not yet played
    (`Stream.buffered_seconds`) gets nothing this step, neither a window nor its next
    sentence's encoder call: its audio is not needed yet, and the device's time goes to the
    others and to new listeners (`StepPlan.rest_until` says when the first of them is due again).

    Every stream passed in has a current sentence or one waiting to be encoded.
    """
    plan = StepPlan()
    call_rows = cfg.max_encoder_batch  # an encoder call's
    window_limit = cfg.max_batch_windows if batching else len(streams)
    scan = PLAN_SCAN_WINDOWS * window_limit if batching else len(streams)
    match_rows = call_rows if batching and rules.match_lengths else 0
    streams, plan.rest_until, plan.rest_lead_s, plan.full = _most_urgent(
        streams, scan, rules.first_audio_s, now, cfg.max_lead_ms / 1000, match_rows
    )
    step_s = cfg.max_step_ms / 1000
    step_cost, budget = 0.0, step_s
    waiting_slack = float("inf")  # the least slack of a playing stream left for later
    planned: set[Call] = set()  # calls the step makes so far
    rows: Counter[Call] = Counter()  # windows in each of the step's calls
    new = (
        sum(1 for s in streams if s.first_audio_at is None and s.current is None) if batching else 0
    )
    # A burst of listeners (a full encoder call's worth of new streams waiting): a new stream's
    # own deadline does not shorten the step (`BURST`).
    burst = batching and new >= call_rows
    hold = 0.0
    if batching and len(streams) >= ENCODE_HOLD_MIN_STREAMS:
        hold = min(cfg.max_encoder_wait_ms / 1000, ENCODE_HOLD_CALLS * costs.per_call["encoder"])
        if new >= call_rows or step_interval_s >= hold:
            hold = 0.0  # a full encoder batch is waiting already, or a step's worth arrived
    # The two playing streams closest to running dry: a lead window must leave every other
    # playing stream time for its own window (`_least_other_slack`).
    closest = _closest_playing(streams, now, rules) if rules.lead_window_frames else []
    # The usual windows of playing streams left for a later step, in deadline order.
    skipped: list[Window] = []
    # Each encoder call planned so far: its rows and its width (the longest sentence's ids).
    encoding: dict[Call, tuple[int, int]] = {}
    # Voices' encoder calls split on a busy scheduler: their fixed costs are held to a share
    # of the step (`ENCODE_VOICES_SHARE`; `ENCODE_UNPACED_SHARE` where no stream is paced).
    split_voices = batching and not rules.grouped_voices and len(streams) >= ENCODE_HOLD_MIN_STREAMS
    # (Where neither share can bind, as on a CPU backend, the streams are not looked over.)
    unpaced_voices = (
        _unpaced_voices(streams, cfg)
        if split_voices and (launch_s > 0 or costs.per_call["encoder"] > 0)
        else 0
    )
    unpaced = unpaced_voices > 1
    # One voice's busy unpaced steps take new sentences for `rules.encoder_calls` calls
    # (`ENCODER_CALLS_A_STEP`), or as many as may still go out (`encoder_calls`, None: any).
    calls_a_step = 1
    if unpaced_voices == 1:
        calls_a_step = rules.encoder_calls
        if encoder_calls is not None:
            calls_a_step = max(1, min(calls_a_step, encoder_calls))
    encode_limit = calls_a_step * call_rows if batching else len(streams)
    encode_share = unpaced_encode_share if unpaced else ENCODE_VOICES_SHARE
    launches = 0  # the step's vocoder calls so far
    count_launches = unpaced and launch_s > 0 and launch_share > 0
    # Where launches count and calls have fixed widths, a voice's windows in a step share one
    # vocoder call, cut for the widest of them (`_one_call_a_voice`): each voice's call so far,
    # its rows and its width.
    widen = count_launches and not rules.exact_widths
    voice_calls: dict[object, tuple[int, int]] = {}
    for stream in streams:
        window: Window | None = None
        opens = False  # its window opens a vocoder call (where launches count)
        if stream.current is None:
            if len(plan.encodes) >= encode_limit:
                plan.full = True
                continue
            if stream.first_audio_at is None and now - stream.arrived < hold:
                continue
            # New streams' encoder call (one per step is counted: they split by length
            # only; one per voice, unless the backend groups voices) and first windows (a
            # vocoder call of their own, after the encoder).
            voice = None if rules.grouped_voices else call_voice(stream.voice)
            calls: list[Call] = [("encoder", 0, voice), ("first-window", 0, voice)]
            cost, joins = 0.0, False
            ids = len(stream.sentences[0].ids)
            if (
                split_voices
                and len(encoding) >= encoder_streams
                and calls[0] not in encoding
                and (len(encoding) + 1) * costs.per_call["encoder"] > encode_share * budget
            ):
                plan.full = True  # another voice's call opens in a later step
                continue
            if not encoder_beside or encoder_queued:
                cost, joins = _encode_cost(
                    costs, encoding.get(calls[0], (0, 0)), ids, call_rows if batching else 0
                )
            if not encoder_beside:
                cost += costs.estimate(
                    "vocoder", first_call_width(cfg, rules), calls[1] not in planned
                )
        else:
            if len(plan.windows) >= window_limit:
                plan.full = True
                continue
            window = usual = next_window(stream, cfg, rules)
            calls = window_calls(window, cfg, rules)
            if widen:
                cost, opens = _voice_call_cost(costs, calls, planned, voice_calls)
            else:
                cost = _cost(costs, calls, planned)
                opens = count_launches and calls[0] not in planned
            if rules.lead_window_frames and stream.buffered_seconds(now) >= LEAD_SECONDS:
                longer = next_window(stream, cfg, rules, lead=True)
                longer_calls = window_calls(longer, cfg, rules)
                longer_cost = _cost(costs, longer_calls, planned)
                if (
                    longer != window
                    and (not plan or step_cost + longer_cost <= min(budget, waiting_slack))
                    and step_cost + longer_cost <= _least_other_slack(closest, stream)
                ):
                    window, calls, cost = longer, longer_calls, longer_cost
        time_left = _time_left(stream, now, rules)
        slack = max(time_left, MIN_STEP_BUDGET_S)
        playing = stream.first_audio_at is not None
        # A playing stream whose audio runs out within a step cannot wait for the next one.
        # (Judged against the step's length, not the budget left: that shrinks to the least
        # slack chosen so far, and a second late stream would then wait a whole step.)
        urgent = playing and stream.current is not None and time_left < step_s
        own_slack = slack if playing or not burst else float("inf")
        limit = min(budget, own_slack, waiting_slack)
        # (Work that costs the step nothing, an encoder call beside it, never waits.)
        if (not urgent and plan and cost > 0 and step_cost + cost > limit) or (
            opens
            and not urgent
            and count_launches
            and launches
            and (launches + 1) * launch_s > launch_share * budget
        ):
            plan.full = True
            if playing:
                waiting_slack = min(waiting_slack, slack)
                if window is not None:
                    skipped.append(usual)
            continue
        if window is None:
            plan.encodes.append(stream)
            if joins:
                encoded, width = encoding.get(calls[0], (0, 0))
                if batching and encoded >= call_rows:  # it opens the voice's next call
                    encoded, width = 0, 0
                encoding[calls[0]] = (encoded + 1, max(width, ids))
        else:
            plan.windows.append(window)
            rows.update(calls)
            launches += opens
            if widen:
                _, width, voice = calls[0]
                rows_so_far, widest = voice_calls.get(voice, (0, 0))
                voice_calls[voice] = (rows_so_far + 1, max(width, widest))
        step_cost += cost
        planned.update(calls)
        budget = max(MIN_STEP_BUDGET_S, min(budget, own_slack))
    # A playing stream left out above because of work planned before it in deadline order (a
    # new stream's encoder call: due sooner, but run after every window) may not last until
    # the next step, which starts once this whole step is done: its window joins this step
    # (windows run before encoder calls). Without this, a listener's second chunk, due 186 ms
    # after its first, came late whenever a new stream's sentence was encoded in between.
    left_out: list[Window] = []  # (once the step is full, nothing more joins it anyway)
    for window in skipped:
        if len(plan.windows) >= window_limit:
            break
        calls = window_calls(window, cfg, rules)
        cost = _cost(costs, calls, planned)
        if _time_left(window.stream, now, rules) < step_cost + cost:
            plan.windows.append(window)
            rows.update(calls)
            step_cost += cost
            planned.update(calls)
        else:
            left_out.append(window)
    if widen:
        widths = _one_call_a_voice(plan, cfg, rules)
        left_out = _recut(left_out, widths, cfg, rules)
        rows = Counter(call for w in plan.windows for call in window_calls(w, cfg, rules))
    if batching and rules.batch_buckets:
        fill_buckets(plan, left_out, cfg, rules, window_limit, rows)
        # (One voice's, only where its encoder may take more than one call a step.)
        if rules.next_windows and (unpaced or (unpaced_voices and rules.encoder_calls > 1)):
            fill_with_next_windows(plan, cfg, rules)
    return plan


def _lead_limit(stream: Stream, lead_s: float) -> float:
    """The stream's lead limit in seconds: its own (`Stream.lead_limit_s`), else `lead_s`, the
    plan's (0: none)."""
    return lead_s if stream.lead_limit_s is None else stream.lead_limit_s


def _unpaced_voices(streams: list[Stream], cfg: WindowConfig) -> int:
    """How many voices' calls `streams` are of, where none of them has a lead limit (its own,
    else `cfg`'s); 0 where one has. Several: a busy step's launches are held
    (`VOCODER_LAUNCH_SHARE`) and its voices' encoder calls held to `ENCODE_UNPACED_SHARE`."""
    lead_s = cfg.max_lead_ms / 1000
    voices: set[Hashable] = set()
    for stream in streams:
        if _lead_limit(stream, lead_s) > 0:
            return 0
        voices.add(call_voice(stream.voice))
    return len(voices)


def _voice_call_cost(
    costs: CostModel,
    calls: list[Call],
    planned: set[Call],
    voice_calls: Mapping[object, tuple[int, int]],
) -> tuple[float, bool]:
    """What a window of `calls` adds to a step whose voices' windows each share one vocoder
    call cut for the widest of them (`voice_calls`: each voice's call so far, its rows and its
    width), and whether it opens its voice's call: a call's fixed cost and its row, or its row
    at the call's width, with the rows before it where it widens the call."""
    _, width, voice = calls[0]
    flow = _cost(costs, calls[1:], planned)
    rows, widest = voice_calls.get(voice, (0, 0))
    if not rows:
        return flow + costs.estimate("vocoder", width, True), True
    frames = max(width, widest) + rows * max(0, width - widest)
    return flow + costs.estimate("vocoder", frames, False), False


def _one_call_a_voice(plan: StepPlan, cfg: WindowConfig, rules: WindowRules) -> dict[object, int]:
    """Cut each voice's windows in `plan` for one vocoder call as wide as the widest of them
    (`widened`: a narrower window takes as much more of its sentence as that call holds); a
    window whose flow is not that far keeps its own call. Returns each voice's call width."""
    widths: dict[object, int] = {}
    for window in plan.windows:
        _, width, voice = window_calls(window, cfg, rules)[0]
        widths[voice] = max(widths.get(voice, 0), width)
    plan.windows = _recut(plan.windows, widths, cfg, rules)
    return widths


def _recut(
    windows: list[Window], widths: Mapping[object, int], cfg: WindowConfig, rules: WindowRules
) -> list[Window]:
    """`windows`, each narrower than its voice's call in `widths` widened to it where it can."""
    recut = []
    for window in windows:
        _, width, voice = window_calls(window, cfg, rules)[0]
        if width < widths.get(voice, 0):
            size = widths[voice] - 2 * cfg.vocoder_context_frames
            window = widened(window.stream, cfg, size) or window
        recut.append(window)
    return recut


def fill_buckets(
    plan: StepPlan,
    candidates: list[Window],
    cfg: WindowConfig,
    rules: WindowRules,
    limit: int,
    rows: Mapping[Call, int] | None = None,
) -> int:
    """Fill the rows a step's calls are padded with (`rules.batch_buckets`, ascending) with
    `candidates`, the next windows of playing streams left out of the step, most urgent
    first; returns how many joined.

    A window joins only where every call it takes part in (its vocoder call, and its flow
    call if it needs a flow chunk) is already planned with padding rows to spare: it then
    costs the device nothing, its stream gets its audio early and later steps have less to
    do. Through Triton on the H100, 26 to 31 % of the vocoder rows computed were padding
    before this (docs/history.md). The step never grows past `limit` windows, and a
    stream already in the step or not yet playing gets no window here. `rows`: the windows in
    each of the step's calls, where the caller counted them as it planned (`plan_step`).
    """
    if not plan.windows:
        return 0
    planned = {w.stream.stream_id for w in plan.windows}
    planned.update(s.stream_id for s in plan.encodes)
    if rows is None:
        rows = Counter(call for w in plan.windows for call in window_calls(w, cfg, rules))
    room = {
        call: next((b for b in rules.batch_buckets if b >= n), n) - n for call, n in rows.items()
    }
    added = 0
    for window in candidates:
        if len(plan.windows) >= limit or not any(room.values()):
            break
        stream = window.stream
        if stream.stream_id in planned or stream.first_audio_at is None:
            continue
        calls = window_calls(window, cfg, rules)
        if all(room.get(call, 0) > 0 for call in calls):
            for call in calls:
                room[call] -= 1
            plan.windows.append(window)
            planned.add(stream.stream_id)
            added += 1
    return added


def fill_with_next_windows(
    plan: StepPlan, cfg: WindowConfig, rules: WindowRules, passes: int = NEXT_WINDOW_PASSES
) -> int:
    """Fill the padding rows of a step's vocoder calls (`rules.batch_buckets`) that
    `fill_buckets` left empty with the windows that follow, in their sentence, those of the
    unpaced streams (no lead limit: `Stream.lead_limit_s`, else `cfg.max_lead_ms`) already in
    the call: a stream then gets two (or more) consecutive windows of one call, in order, at
    no cost to the device, which computes those rows anyway. Returns how many joined.
    (`plan_step` calls it for busy steps of several unpaced voices: `NEXT_WINDOW_PASSES`.)

    A window follows only where its frames are flowed already (the whole-sentence flow of a
    GPU) and it shares its call's width and context (it is cut for the call's width, as
    `widened`); a stream at its sentence's end gets none. The step's window limit does not
    bound them: they fill calls it admitted, never a call's bucket past its own. Paced streams
    get none: their audio is not wanted before it is due (`plan_step`'s lead limit).
    """
    context = cfg.vocoder_context_frames
    lead_s = cfg.max_lead_ms / 1000
    calls = group_calls(
        plan.windows,
        lambda w: (
            call_key(w, cfg, rules),
            None if rules.grouped_voices else call_voice(w.stream.voice),
        ),
        True,
    )
    added = 0
    for windows in calls:
        width, before = call_key(windows[0], cfg, rules)
        room = next((b for b in rules.batch_buckets if b >= len(windows)), 0) - len(windows)
        size = width - 2 * context
        followed = [
            w
            for w in windows
            if _lead_limit(w.stream, lead_s) <= 0 and w.stream.first_audio_at is not None
        ]
        for _ in range(passes):
            following: list[Window] = []
            for window in followed:
                if room <= 0:
                    break
                state = window.state
                start = window.decode[1]
                end = min(state.frames, start + size)
                if start >= state.frames or state.flowed < min(state.frames, end + context):
                    continue
                after = Window(window.stream, (state.flowed, state.flowed), (start, end), size)
                if call_key(after, cfg, rules) != (width, before):
                    continue
                plan.windows.append(after)
                following.append(after)
                room -= 1
            added += len(following)
            followed = following
            if room <= 0 or not following:
                break
    return added


def _most_urgent(
    streams: list[Stream],
    playing: int,
    first_audio_s: float,
    now: float,
    lead_s: float,
    match_rows: int = 0,
) -> tuple[list[Stream], float | None, float | None, bool]:
    """In deadline order: every stream with a sentence to encode, and the `playing` streams
    with a current sentence whose audio runs out first, leaving out the playing streams with
    at least their lead limit (`Stream.lead_limit_s`, else `lead_s`; 0: none) of audio ahead
    of their listener; with when the first of those falls under its limit and the least of
    their limits (None, None: none rest), and whether playing streams were left out beyond
    `playing`. Streams to encode of several voices take their places in turn by voice
    (`_voice_turns`); with `match_rows` (an encoder call's rows), a voice's new streams in a
    burst take theirs by length (`_matched`).

    Each stream's deadline is read once, and the choices are made on arrays: at thousands of
    streams, a pass of Python per stream is most of a step's planning."""
    count = len(streams)
    if not count:
        return [], None, None, False
    deadlines = np.fromiter((s.deadline(first_audio_s) for s in streams), float, count)
    decoding = np.fromiter((s.current is not None for s in streams), bool, count)
    rest_until: float | None = None
    rest_lead: float | None = None
    # (Inline, not `_lead_limit`: a call a stream, on every step, at thousands of streams.)
    leads = np.fromiter(
        (lead_s if s.lead_limit_s is None else s.lead_limit_s for s in streams), float, count
    )
    kept = np.ones(count, bool)
    if leads.any():
        started = np.fromiter((s.first_audio_at is not None for s in streams), bool, count)
        resting = started & (leads > 0) & (deadlines - now >= leads)
        if resting.any():
            rest_until = float((deadlines - leads)[resting].min())
            rest_lead = float(leads[resting].min())
            kept = ~resting
    chosen = np.flatnonzero(decoding & kept)
    cut = len(chosen) > playing
    if cut:
        chosen = chosen[np.argpartition(deadlines[chosen], playing)[:playing]]
    chosen = np.sort(np.concatenate((np.flatnonzero(~decoding & kept), chosen)))
    chosen = chosen[np.argsort(deadlines[chosen], kind="stable")]
    return _voice_turns([streams[i] for i in chosen], match_rows), rest_until, rest_lead, cut


def _voice_turns(ordered: list[Stream], match_rows: int = 0) -> list[Stream]:
    """`ordered` with its streams to encode (new listeners, next sentences) given their places
    in turn by voice: the first place to the earliest of each voice's in the order their
    earliest come, then the second of each, and so on; playing streams keep theirs. A burst of
    a thousand listeners of one voice then delays another voice's new listener by one place,
    not by a thousand, and the encoder calls a step holds are shared among the voices. With
    `match_rows`, each voice's new listeners are first put in order by length (`_matched`)."""
    places = [i for i, stream in enumerate(ordered) if stream.current is None]
    voices: dict[object, list[Stream]] = {}
    for i in places:
        voices.setdefault(ordered[i].voice, []).append(ordered[i])
    if not voices or (len(voices) < 2 and not match_rows):
        return ordered
    if match_rows:
        voices = {voice: _matched(queue, match_rows) for voice, queue in voices.items()}
    turns = [
        stream
        for rank in range(max(len(queue) for queue in voices.values()))
        for queue in voices.values()
        if rank < len(queue)
        for stream in (queue[rank],)
    ]
    result = list(ordered)
    for place, stream in zip(places, turns, strict=True):
        result[place] = stream
    return result


def _matched(queue: list[Stream], rows: int) -> list[Stream]:
    """`queue` (one voice's streams to encode, earliest first) with, where more than `rows` new
    listeners wait in it, the `rows - 1` of them nearest the earliest in length, among the
    `MATCH_CALLS * rows` earliest, moved up behind it (`MATCH_CALLS`). New listeners take the
    places new listeners had; playing streams' next sentences keep theirs."""
    places = [i for i, stream in enumerate(queue) if stream.first_audio_at is None]
    if len(places) <= rows:
        return queue
    new = [queue[i] for i in places[: MATCH_CALLS * rows]]
    width = len(new[0].sentences[0].ids)
    nearest = sorted(range(1, len(new)), key=lambda i: abs(len(new[i].sentences[0].ids) - width))
    near = set(nearest[: rows - 1])
    # (The near ones first, each part in arrival order: the sort is stable.)
    order = [new[0], *(new[i] for i in sorted(range(1, len(new)), key=lambda i: i not in near))]
    result = list(queue)
    for place, stream in zip(places, order, strict=False):
        result[place] = stream
    return result


def _time_left(stream: Stream, now: float, rules: WindowRules) -> float:
    """Seconds until the stream's deadline, less the rules' margin."""
    return stream.deadline(rules.first_audio_s) - now - rules.deadline_margin_s


def _closest_playing(
    streams: list[Stream], now: float, rules: WindowRules
) -> list[tuple[float, int]]:
    """(time left, stream id) of the two playing streams whose audio runs out first."""
    playing = [
        (_time_left(s, now, rules), s.stream_id) for s in streams if s.first_audio_at is not None
    ]
    return heapq.nsmallest(2, playing)


def _least_other_slack(closest: list[tuple[float, int]], stream: Stream) -> float:
    """The least time left of a playing stream other than `stream` (inf: there is none)."""
    for time_left, stream_id in closest:
        if stream_id != stream.stream_id:
            return time_left
    return float("inf")


def encoder_calls(
    waiting: list[Stream],
    costs: CostModel,
    batching: bool,
    grouped_voices: bool = False,
    max_rows: int = 0,
) -> Iterator[tuple[Scales, list[Stream]]]:
    """The encoder calls for streams whose next sentence is to be encoded: batches sharing
    scales, speaker and voice (any voice where `grouped_voices`: the backend runs several
    voices' rows in one call), sorted by length and split where padding costs more than a
    call, and where a call has `max_rows` (0: no limit; a step may take several calls' worth,
    `WindowRules.encoder_calls`).

    A generator: each split is decided with the cost model as it stands after the calls
    before it have run and been observed.
    """
    groups: dict[tuple[float, float, float, int, object], list[Stream]] = {}
    for stream in waiting:
        key = (
            *stream.params.scales(),
            stream.params.speaker_id,
            None if grouped_voices else call_voice(stream.voice),
        )
        groups.setdefault(key, []).append(stream)
    for (noise, length, noise_w, _, _), streams in groups.items():
        # Padding a short sentence to a long one costs the long one's time: split at 1.25x,
        # unless one more call costs more than the padding (a GPU's fixed cost per call).
        streams.sort(key=lambda s: len(s.sentences[0].ids))
        batch: list[Stream] = []
        for stream in streams:
            split = not batching or (max_rows > 0 and len(batch) >= max_rows)
            if batch and not split:
                shortest, size = len(batch[0].sentences[0].ids), len(stream.sentences[0].ids)
                longest = len(batch[-1].sentences[0].ids)
                padding = costs.estimate("encoder", (size - longest) * len(batch), False)
                split = size > 1.25 * shortest and padding > costs.per_call["encoder"]
            if batch and split:
                yield (noise, length, noise_w), batch
                batch = []
            batch.append(stream)
        yield (noise, length, noise_w), batch
