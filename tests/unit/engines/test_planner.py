"""The step planner without a runtime: which windows and encoder calls a step makes."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from engines.contract.plan import WindowConfig
from engines.streaming import planner
from engines.streaming.costs import CostModel
from engines.streaming.planner import (
    CPU_RAMP,
    StepPlan,
    WindowRules,
    call_key,
    cpu_rules,
    encoder_calls,
    fill_buckets,
    fill_with_next_windows,
    next_window,
    plan_step,
    window_calls,
)
from engines.streaming.types import SentenceState, Stream, StreamSink, SynthesisParams
from engines.text.frontend import Sentence

NOW = 1000.0


def make_stream(
    stream_id: int,
    ids: int = 40,
    frames: int | None = None,
    buffered_s: float | None = None,
    windows_sent: int = 0,
) -> Stream:
    """A stream with a sentence of `ids` phoneme ids waiting, or one of `frames` frames
    playing with `buffered_s` seconds of audio left in its listener's buffer."""
    stream = Stream(
        stream_id, deque([Sentence("x", [1] * ids)]), SynthesisParams(), StreamSink(), NOW
    )
    if frames is not None:
        stream.sentences.clear()
        stream.current = SentenceState(pages=np.array([1]), frames=frames)
        stream.first_audio_at = NOW - 1.0
        stream.audio_seconds_sent = 1.0 + (buffered_s or 0.0)
        stream.windows_sent = windows_sent
    return stream


def test_windows_grow_from_the_first_window_to_the_steady_window() -> None:
    cfg = WindowConfig()
    stream = make_stream(1, frames=1000)
    sizes = []
    for sent in range(5):
        stream.windows_sent = sent
        window = next_window(stream, cfg)
        sizes.append(window.decode[1] - window.decode[0])
    assert sizes == [16, 32, 64, 128, 128]
    # The CPU's ramp grows by half: more calls, but each is due while a shorter one plays.
    cpu = WindowRules(exact_widths=True, ramp=CPU_RAMP)
    sizes = []
    for sent in range(8):
        stream.windows_sent = sent
        window = next_window(stream, cfg, cpu)
        sizes.append(window.decode[1] - window.decode[0])
    assert sizes == [16, 24, 36, 54, 81, 121, 128, 128]
    stream.windows_sent = 10_000  # a long-lived stream's ramp does not overflow
    window = next_window(stream, cfg, cpu)
    assert window.decode[1] - window.decode[0] == 128
    with pytest.raises(ValueError, match="ramp must be more than 1"):
        WindowRules(ramp=1.0)
    # The flow runs ahead of the vocoder by at least its context.
    window = next_window(stream, cfg)
    assert window.flow[1] >= window.decode[1] + cfg.vocoder_context_frames


def windows_of(frames: int, rules: WindowRules) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(flow chunk, decoded frames) of each window of one sentence of `frames` frames."""
    cfg = WindowConfig()
    stream = make_stream(1, frames=frames)
    state = stream.current
    assert state is not None
    windows = []
    while state.vocoded < frames:
        window = next_window(stream, cfg, rules)
        windows.append((window.flow, window.decode))
        state.flowed, state.vocoded = max(state.flowed, window.flow[1]), window.decode[1]
        stream.windows_sent += 1
    return windows


def test_a_short_tail_of_a_sentence_goes_with_the_window_before_it_on_the_cpu() -> None:
    cpu = WindowRules(True, merge_tails=True)
    # 16 + 32 frames leave 10: the second window takes them, and the flow covers them in its
    # first chunk (58 - 32 = 26 frames left after it, at most two first windows).
    assert windows_of(58, cpu) == [((0, 58), (0, 16)), ((58, 58), (16, 58))]
    assert windows_of(58, WindowRules(True)) == [
        ((0, 32), (0, 16)),
        ((32, 58), (16, 48)),
        ((58, 58), (48, 58)),
    ]
    # First audio is never delayed: the first window stays 16 frames even with 10 left.
    assert windows_of(26, cpu)[0][1] == (0, 16)
    # A long sentence keeps its steady windows: a tail merges only within one of them.
    decoded = [decode for _, decode in windows_of(1000, cpu)]
    assert max(end - start for start, end in decoded) <= WindowConfig().window_frames + 16
    assert decoded[-1][1] == 1000


def test_a_playing_stream_about_to_run_dry_is_served_before_a_new_stream() -> None:
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-3, vocoder=1e-3, flow=1e-3)  # a slow machine
    playing = make_stream(1, frames=600, buffered_s=0.01, windows_sent=4)
    newcomer = make_stream(2, ids=200)  # due 50 ms after it arrived, now

    plan = plan_step([newcomer, playing], WindowConfig(), costs, batching=True, now=NOW)

    assert [w.stream.stream_id for w in plan.windows] == [1]
    # The newcomer's encoder call would push the playing stream past its buffer: it waits.
    assert plan.encodes == []


def test_on_the_cpu_a_new_stream_waits_for_a_playing_stream_due_before_its_first_audio() -> None:
    # A listener 150 ms from running dry and one who just arrived; the step holds one of them.
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=3e-4, vocoder=3e-4, flow=3e-5)
    playing = make_stream(1, frames=600, buffered_s=0.15, windows_sent=2)
    newcomer = make_stream(2, ids=200)  # a 60 ms encoder call, then its first window

    def planned(rules: WindowRules) -> tuple[list[int], list[int]]:
        plan = plan_step(
            [newcomer, playing], WindowConfig(), costs, batching=True, now=NOW, rules=rules
        )
        return [s.stream_id for s in plan.encodes], [w.stream.stream_id for w in plan.windows]

    # Where first audio is due 50 ms after arrival (a GPU's rules), the newcomer goes first and
    # the playing stream, which can still wait a step, waits.
    assert planned(WindowRules()) == ([2], [])
    # On the CPU first audio is due 200 ms after arrival: the playing stream's window goes
    # first, and the newcomer's encoder call would take the step past the playing stream's
    # time: it waits for the next step.
    assert planned(cpu_rules()) == ([], [1])


def test_a_new_stream_is_served_at_once_on_the_cpu_where_nothing_else_is_due() -> None:
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=3e-4, vocoder=3e-4, flow=3e-5)
    playing = make_stream(1, frames=600, buffered_s=2.0, windows_sent=6)
    newcomer = make_stream(2, ids=100)

    plan = plan_step(
        [playing, newcomer], WindowConfig(), costs, batching=True, now=NOW, rules=cpu_rules()
    )

    assert [s.stream_id for s in plan.encodes] == [2]


def test_a_playing_stream_is_not_left_to_run_dry_behind_a_new_streams_encoder_call() -> None:
    # The newcomer is due sooner (first audio) and planned first, but its encoder call runs
    # after every window: a playing stream that cannot wait until that call is done must get
    # its window in this step (the second chunk of a listener, due 186 ms after the first).
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-3, vocoder=1e-3, flow=1e-4)
    playing = make_stream(1, frames=600, buffered_s=0.15, windows_sent=1)
    newcomer = make_stream(2, ids=100)  # an encoder call of 100 ms

    plan = plan_step([newcomer, playing], WindowConfig(), costs, batching=True, now=NOW)

    assert [s.stream_id for s in plan.encodes] == [2]
    assert [w.stream.stream_id for w in plan.windows] == [1]


def test_a_lead_window_leaves_the_other_playing_streams_time_for_theirs() -> None:
    cpu = WindowRules(True, lead_window_frames=256, lead_flow_frames=512, merge_tails=True)
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-3, vocoder=1e-3, flow=1e-3)
    ahead = make_stream(1, frames=2000, buffered_s=0.55, windows_sent=5)
    other = make_stream(2, frames=2000, buffered_s=0.6, windows_sent=5)

    alone = plan_step([ahead], WindowConfig(), costs, batching=True, now=NOW, rules=cpu)
    both = plan_step([ahead, other], WindowConfig(), costs, batching=True, now=NOW, rules=cpu)

    lead = alone.windows[0].decode
    assert lead[1] - lead[0] == 256  # alone, it takes a lead window
    # Beside a stream with 0.6 s left, an 832 ms lead window would run it dry: a steady one.
    first = both.windows[0]
    assert first.stream.stream_id == 1 and first.decode[1] - first.decode[0] == 128


def test_an_encoder_beside_the_windows_costs_the_step_nothing() -> None:
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-3, vocoder=1e-3, flow=1e-3)  # the slow machine above
    playing = make_stream(1, frames=600, buffered_s=0.01, windows_sent=4)
    newcomer = make_stream(2, ids=200)

    plan = plan_step(
        [newcomer, playing], WindowConfig(), costs, batching=True, now=NOW, encoder_beside=True
    )

    # Its call runs beside the playing stream's window, so the newcomer need not wait.
    assert [w.stream.stream_id for w in plan.windows] == [1]
    assert [s.stream_id for s in plan.encodes] == [2]


def test_an_encoder_queued_behind_the_windows_waits_while_a_playing_stream_cannot() -> None:
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-3, vocoder=1e-3, flow=1e-3)  # a 200 ms encoder call

    def plan(queued: bool) -> tuple[list[int], list[int]]:
        playing = make_stream(1, frames=600, buffered_s=0.01, windows_sent=4)
        later = make_stream(3, frames=600, buffered_s=0.15, windows_sent=4)
        newcomer = make_stream(2, ids=200)
        step = plan_step(
            [newcomer, playing, later],
            WindowConfig(),
            costs,
            batching=True,
            now=NOW,
            encoder_beside=True,
            encoder_queued=queued,
        )
        return [w.stream.stream_id for w in step.windows], [s.stream_id for s in step.encodes]

    # On a stream of its own the call delays no window: the newcomer is encoded at once.
    assert plan(queued=False) == ([1, 3], [2])
    # Queued on the windows' stream, the next step's windows would wait 200 ms behind it, and
    # the stream with 150 ms left would run dry: the newcomer waits for a step.
    assert plan(queued=True) == ([1, 3], [])


def test_new_streams_encoded_in_a_step_fit_it_with_their_call_padded_to_the_longest() -> None:
    """Every row of an encoder call is as wide as its longest sentence: a long sentence among
    short ones costs the call its width for each of them. Charged at their own lengths, twelve
    newcomers went into a call of 72 ms ahead of a playing stream with 40 ms of audio left."""
    costs = CostModel(fixed_part=True)
    costs.per_call.update(encoder=5e-3, vocoder=0.0, flow=0.0)
    costs.per_frame.update(encoder=2e-5, vocoder=1e-9, flow=1e-9)
    for launch in ({"encoder_beside": True, "encoder_queued": True}, {}):
        playing = make_stream(1, frames=600, buffered_s=0.040, windows_sent=4)
        newcomers = [make_stream(10 + i, ids=280 if i == 0 else 40) for i in range(12)]
        step = plan_step(
            [playing, *newcomers], WindowConfig(), costs, batching=True, now=NOW, **launch
        )
        assert [w.stream.stream_id for w in step.windows[:1]] == [1]
        widest = max(len(s.sentences[0].ids) for s in step.encodes)
        call_s = costs.per_call["encoder"] + len(step.encodes) * widest * 2e-5
        assert 0 < len(step.encodes) < len(newcomers)
        assert call_s <= 0.040, (launch, len(step.encodes), call_s)


def test_with_room_in_the_step_every_stream_is_planned() -> None:
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-7, vocoder=1e-7, flow=1e-7)  # a fast machine
    streams = [make_stream(i, frames=600, buffered_s=2.0, windows_sent=4) for i in range(3)]
    streams += [make_stream(10 + i, ids=30 + i) for i in range(2)]

    plan = plan_step(streams, WindowConfig(), costs, batching=True, now=NOW)

    assert sorted(w.stream.stream_id for w in plan.windows) == [0, 1, 2]
    assert sorted(s.stream_id for s in plan.encodes) == [10, 11]


def test_a_stream_at_its_lead_limit_gets_no_work_until_it_falls_under_it() -> None:
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-7, vocoder=1e-7, flow=1e-7)  # room for everything
    cfg = WindowConfig(max_lead_ms=1000)
    ahead = make_stream(1, frames=600, buffered_s=1.5, windows_sent=4)
    behind = make_stream(2, frames=600, buffered_s=0.4, windows_sent=4)
    between = make_stream(3, frames=600, buffered_s=3.0, windows_sent=4)
    between.current = None  # its next sentence waits to be encoded
    between.sentences.append(Sentence("y", [1] * 20))
    new = make_stream(4)

    plan = plan_step([ahead, behind, between, new], cfg, costs, batching=True, now=NOW)

    assert [w.stream.stream_id for w in plan.windows] == [2]
    assert sorted(s.stream_id for s in plan.encodes) == [4]  # a new stream is never held
    # Due again when the first of the others has 1 s of audio left: `ahead`, 0.5 s from now.
    assert plan.rest_until == pytest.approx(NOW + 0.5)
    # Without the limit all of them get their work, as before.
    plan = plan_step([ahead, behind, between, new], WindowConfig(), costs, True, NOW)
    assert sorted(w.stream.stream_id for w in plan.windows) == [1, 2]
    assert sorted(s.stream_id for s in plan.encodes) == [3, 4]
    assert plan.rest_until is None
    # Once under it, a stream is planned again.
    plan = plan_step([ahead], cfg, costs, batching=True, now=NOW + 0.6)
    assert [w.stream.stream_id for w in plan.windows] == [1]
    with pytest.raises(ValueError, match="max_lead_ms must not be negative"):
        WindowConfig(max_lead_ms=-1)


def test_encoder_calls_split_by_scales_and_not_without_batching() -> None:
    costs = CostModel()
    slow = SynthesisParams(length_scale=1.5)
    streams = [make_stream(i, ids=40) for i in range(3)]
    streams[2] = Stream(3, deque([Sentence("x", [1] * 40)]), slow, StreamSink(), NOW)

    calls = [
        (scales, [s.stream_id for s in batch])
        for scales, batch in encoder_calls(streams, costs, batching=True)
    ]
    assert calls == [((0.667, 1.0, 0.8), [0, 1]), ((0.667, 1.5, 0.8), [3])]

    unbatched = list(encoder_calls(streams[:2], costs, batching=False))
    assert [len(batch) for _, batch in unbatched] == [1, 1]


def test_a_stream_with_a_lead_takes_a_longer_window_on_exact_widths_only() -> None:
    cfg = WindowConfig()
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-7, vocoder=1e-7, flow=1e-7)
    cpu = WindowRules(True, lead_window_frames=256, lead_flow_frames=512)

    ahead = make_stream(1, frames=1000, buffered_s=3.0, windows_sent=4)
    (window,) = plan_step([ahead], cfg, costs, True, NOW, cpu).windows
    assert window.decode == (0, 256)
    assert window.flow == (0, 512)
    assert window_calls(window, cfg, cpu) == [("vocoder", 256 + 16, None), ("flow", 512 + 48, None)]

    # Fixed-shape engines keep the steady window and its size classes.
    (window,) = plan_step([ahead], cfg, costs, True, NOW).windows
    assert window.decode == (0, 128)
    assert window_calls(window, cfg) == [("vocoder", 128 + 16, None), ("flow", 256 + 48, None)]

    # Without a lead, the usual window.
    behind = make_stream(2, frames=1000, buffered_s=0.2, windows_sent=4)
    (window,) = plan_step([behind], cfg, costs, True, NOW, cpu).windows
    assert window.decode == (0, 128)


def test_a_lead_window_that_does_not_fit_the_step_falls_back_to_the_usual_one() -> None:
    cfg = WindowConfig()
    costs = CostModel(fixed_part=False)
    # A usual window costs 25 ms here, a lead window 46 ms: only the first fits a 60 ms step.
    costs.per_frame.update(encoder=1e-4, vocoder=1.5e-4, flow=1e-5)
    cpu = WindowRules(True, lead_window_frames=256, lead_flow_frames=512)
    due = make_stream(1, frames=1000, buffered_s=0.1, windows_sent=4)
    ahead = make_stream(2, frames=1000, buffered_s=3.0, windows_sent=4)

    plan = plan_step([due, ahead], cfg, costs, True, NOW, cpu)

    assert [w.decode for w in plan.windows] == [(0, 128), (0, 128)]


def test_exact_widths_decode_a_sentence_tail_without_padding() -> None:
    cfg = WindowConfig()
    stream = make_stream(1, frames=100, windows_sent=4)
    stream.current.flowed = 100  # type: ignore[union-attr]
    window = next_window(stream, cfg)
    assert window.decode == (0, 100)
    assert window_calls(window, cfg, WindowRules(exact_widths=True)) == [("vocoder", 116, None)]
    assert window_calls(window, cfg) == [("vocoder", 128 + 16, None)]


def test_calls_at_a_sentences_edges_take_no_context_past_them_where_edges_are_trimmed() -> None:
    cfg = WindowConfig()  # vocoder context 8, flow context 24
    cpu = WindowRules(exact_widths=True, ramp=CPU_RAMP, trim_edges=True)
    stream = make_stream(1, frames=400)
    state = stream.current
    assert state is not None

    first = next_window(stream, cfg, cpu)  # frames 0-16, its flow chunk 0-32
    assert (first.decode, first.flow) == ((0, 16), (0, 32))
    assert call_key(first, cfg, cpu) == (16 + 8, 0)
    assert call_key(first, cfg, cpu, flow=True) == (32 + 24, 0)
    # Without trimming, the same window's calls carry the context on both sides.
    assert window_calls(first, cfg, WindowRules(exact_widths=True)) == [
        ("vocoder", 16 + 16, None),
        ("flow", 32 + 48, None),
    ]

    state.flowed, state.vocoded, stream.windows_sent = 32, 16, 1
    middle = next_window(stream, cfg, cpu)  # frames 16-40: context on both sides
    assert call_key(middle, cfg, cpu) == (24 + 16, 8)

    state.flowed, state.vocoded, stream.windows_sent = 400, 300, 6
    last = next_window(stream, cfg, cpu)  # frames 300-400, the sentence's end
    assert last.decode == (300, 400)
    assert window_calls(last, cfg, cpu) == [("vocoder", 100 + 8, None)]

    with pytest.raises(ValueError, match="trim_edges needs exact_widths"):
        WindowRules(trim_edges=True)


def test_every_playing_stream_about_to_run_dry_is_served_in_the_step() -> None:
    cfg = WindowConfig()
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-4, vocoder=2e-4, flow=1e-5)  # a window: about 32 ms
    late = [make_stream(i, frames=1000, buffered_s=0.01 * i, windows_sent=4) for i in (1, 2, 3)]
    ahead = make_stream(9, frames=1000, buffered_s=3.0, windows_sent=4)

    plan = plan_step([ahead, *late], cfg, costs, True, NOW)

    # Each of them would run dry before the next step: all go in this one, late as it gets;
    # the stream with seconds of audio left waits.
    assert sorted(w.stream.stream_id for w in plan.windows) == [1, 2, 3]


def test_padding_rows_of_a_graphed_call_take_the_next_windows_not_yet_due() -> None:
    cfg = WindowConfig()
    costs = CostModel(fixed_part=False)
    costs.per_frame.update(encoder=1e-4, vocoder=2e-4, flow=1e-5)  # as above
    late = [make_stream(i, frames=1000, buffered_s=0.01 * i, windows_sent=4) for i in (1, 2, 3)]
    ahead = [
        make_stream(8, frames=1000, buffered_s=3.0, windows_sent=4),
        make_stream(9, frames=1000, buffered_s=2.0, windows_sent=4),
    ]
    # More urgent than both, but its next window (its second) has a call of its own.
    young = make_stream(7, frames=1000, buffered_s=1.0, windows_sent=1)
    graphs = WindowRules(batch_buckets=(1, 2, 4, 8))
    streams = [*ahead, young, *late]

    plan = plan_step(streams, cfg, costs, True, NOW, graphs)

    # Three windows are due; their calls are padded to 4 rows: the fourth row goes to the
    # stream that would run dry soonest among those whose window has the same calls.
    assert [w.stream.stream_id for w in plan.windows] == [1, 2, 3, 9]
    assert len({tuple(window_calls(w, cfg, graphs)) for w in plan.windows}) == 1
    # Without buckets (or without batching) nothing joins.
    assert len(plan_step(streams, cfg, costs, True, NOW).windows) == 3
    assert len(plan_step(streams, cfg, costs, False, NOW, graphs).windows) == 3


def test_filling_the_padding_never_takes_a_step_past_its_window_limit() -> None:
    graphs = WindowRules(batch_buckets=(1, 2, 4, 8))
    due = [make_stream(i, frames=1000, buffered_s=0.01, windows_sent=4) for i in range(5)]
    ahead = [make_stream(10 + i, frames=1000, buffered_s=3.0, windows_sent=4) for i in range(5)]
    for limit, added in ((6, 1), (8, 3), (16, 3)):
        plan = StepPlan(windows=[next_window(s, WindowConfig(), graphs) for s in due])
        candidates = [next_window(s, WindowConfig(), graphs) for s in ahead]
        assert fill_buckets(plan, candidates, WindowConfig(), graphs, limit) == added
        assert len(plan.windows) == 5 + added
    # A stream gets one window per step, and one that has not started playing gets none.
    plan = StepPlan(windows=[next_window(s, WindowConfig(), graphs) for s in due[:3]])
    fresh = make_stream(20, frames=1000, windows_sent=4)
    fresh.first_audio_at = None
    candidates = [next_window(s, WindowConfig(), graphs) for s in [*due[:3], fresh]]
    assert fill_buckets(plan, candidates, WindowConfig(), graphs, 16) == 0


def flowed_stream(stream_id: int, frames: int = 1000, vocoded: int = 0) -> Stream:
    """A playing stream whose sentence is flowed whole (a GPU's whole-sentence flow), its
    audio about to run out."""
    stream = make_stream(stream_id, frames=frames, buffered_s=0.01, windows_sent=4)
    assert stream.current is not None
    stream.current.flowed, stream.current.vocoded = frames, vocoded
    return stream


def test_padding_rows_take_the_next_windows_of_unpaced_streams_already_in_the_call() -> None:
    """Five unpaced streams' windows in a vocoder call padded to 8 rows, no other window of its
    width to fill it: the three empty rows take the windows that follow three of the streams'
    own in their sentences, in the same call and in order (`fill_with_next_windows`); a stream
    at its sentence's end gets none, nor do paced streams, and a full bucket takes none."""
    graphs = WindowRules(batch_buckets=(1, 2, 4, 8), next_windows=True)
    # The first ends its sentence with this window; the others have frames to spare.
    streams = [flowed_stream(0, vocoded=900), *(flowed_stream(i) for i in range(1, 5))]
    cfg = WindowConfig()

    def call_of(listeners: list[Stream], config: WindowConfig = cfg) -> StepPlan:
        return StepPlan(windows=[next_window(s, config, graphs) for s in listeners])

    plan = call_of(streams)
    assert fill_with_next_windows(plan, cfg, graphs) == 3
    assert len({call_key(w, cfg, graphs) for w in plan.windows}) == 1  # one call
    first, following = plan.windows[:5], plan.windows[5:]
    assert [w.stream.stream_id for w in following] == [1, 2, 3]
    for window in following:
        (own,) = [w for w in first if w.stream is window.stream]
        assert window.decode[0] == own.decode[1] and window.flow[0] == window.flow[1]
        assert window.decode[1] - window.decode[0] == own.decode[1] - own.decode[0]
    paced = WindowConfig(max_lead_ms=300)
    assert fill_with_next_windows(call_of(streams, paced), paced, graphs) == 0
    assert fill_with_next_windows(call_of(streams[1:]), cfg, graphs) == 0  # 4 rows: full
    # Where the others end their sentences, the rows go to the one stream with frames left:
    # its second window, then its third and its fourth, one after the other.
    ending = [flowed_stream(i, vocoded=900) for i in range(4)]
    long = flowed_stream(4, frames=2000)
    cfg = WindowConfig()
    plan = StepPlan(windows=[next_window(s, cfg, graphs) for s in [*ending, long]])
    assert fill_with_next_windows(plan, cfg, graphs) == 3
    assert [w.decode for w in plan.windows if w.stream is long] == [
        (0, 128),
        (128, 256),
        (256, 384),
        (384, 512),
    ]


def busy_scheduler(count: int, seed: int) -> list[Stream]:
    """`count` streams as a busy GPU scheduler has them: most playing, at every point of their
    ramp and sentence, a few about to run dry, most up to two seconds ahead; a few waiting to
    be encoded."""
    rng = np.random.default_rng(seed)
    streams = []
    for i in range(count):
        if rng.random() < 0.05:
            stream = make_stream(i + 1, ids=int(rng.integers(20, 300)))
            stream.arrived = NOW - float(rng.uniform(0.0, 0.5))
        else:
            frames = int(rng.integers(60, 700))
            late = rng.random() < 0.02
            buffered = rng.uniform(-0.3, 0.05) if late else rng.uniform(0.05, 2.0)
            stream = make_stream(
                i + 1,
                frames=frames,
                buffered_s=float(buffered),
                windows_sent=int(rng.integers(0, 6)),
            )
            assert stream.current is not None
            stream.current.flowed = frames  # a GPU's whole-sentence flow
            stream.current.vocoded = int(rng.integers(0, frames - 1))
        streams.append(stream)
    return streams


def gpu_costs() -> CostModel:
    """A GPU's cost model (the H100's call log through Triton): a fixed cost per call."""
    costs = CostModel(fixed_part=True)
    costs.per_call.update(encoder=12.7e-3, flow=1.3e-3, vocoder=0.23e-3)
    costs.per_frame.update(encoder=1.25e-6, flow=0.15e-6, vocoder=2.0e-6)
    return costs


def test_a_step_looks_only_at_the_playing_streams_due_first(monkeypatch) -> None:
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)
    graphs = WindowRules(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128))
    costs = gpu_costs()
    looked_at = []
    original = planner.next_window

    def counted(stream, *args, **kwargs):
        looked_at.append(stream.stream_id)
        return original(stream, *args, **kwargs)

    for seed in range(6):
        streams = busy_scheduler(2000, seed)
        looked_at.clear()
        with monkeypatch.context() as patch:
            patch.setattr(planner, "next_window", counted)
            plan = plan_step(streams, cfg, costs, True, NOW, graphs)
        # The step is full by its estimated time, not by its 128 windows: the case where
        # every other stream used to be looked at and left for later.
        assert len(plan.windows) < cfg.max_batch_windows
        # 2,000 streams, of which the step works out the windows of the 512 due first only ...
        assert 0 < len(set(looked_at)) <= planner.PLAN_SCAN_WINDOWS * cfg.max_batch_windows
        due = sorted((s for s in streams if s.current is not None), key=lambda s: s.deadline(0.05))
        assert set(looked_at) <= {s.stream_id for s in due[: len(set(looked_at))]}
        # ... and plans what it would plan looking at all of them.
        with monkeypatch.context() as patch:
            patch.setattr(planner, "PLAN_SCAN_WINDOWS", 10**6)
            everything = plan_step(streams, cfg, costs, True, NOW, graphs)
        assert plan.encodes == everything.encodes
        assert plan.windows == everything.windows
        assert plan.windows and plan.encodes


def test_a_burst_of_new_streams_fills_the_step_and_one_late_stream_keeps_it_short() -> None:
    """Where a full encoder call's worth of new streams wait, their first-audio deadlines
    (passed already) do not cut the step to 30 ms: it takes sentences up to its length."""
    costs = gpu_costs()
    costs.per_frame["encoder"] = 20e-6  # 2 ms a sentence of 100 ids
    cfg = WindowConfig(max_encoder_batch=32, max_step_ms=60)

    def encodes(count: int) -> int:
        streams = [make_stream(i, ids=100) for i in range(count)]
        for stream in streams:
            stream.arrived = NOW - 0.2  # late for first audio
        return len(plan_step(streams, cfg, costs, batching=True, now=NOW).encodes)

    # 30 ms: the encoder call's 12.7 ms and the first windows' call, then 2 ms a sentence.
    assert encodes(31) == 8
    # A burst: up to the step's 60 ms.
    assert encodes(32) == 22
    assert encodes(200) == 22


def test_a_new_stream_is_held_for_others_only_where_steps_are_shorter_than_the_wait() -> None:
    """On a busy GPU scheduler a new stream may wait a little for others to share its encoder
    call; where the step before already took that long, the streams that arrived during it
    share one call anyway, and holding one back would cost it a whole step more."""
    costs = CostModel()
    costs.per_call.update(encoder=0.01, vocoder=0.002, flow=0.002)  # a GPU: 25 ms hold
    costs.per_frame.update(encoder=1e-7, vocoder=1e-7, flow=1e-7)
    playing = [make_stream(i, frames=600, buffered_s=2.0, windows_sent=4) for i in range(20)]
    newcomer = make_stream(100)
    newcomer.arrived = NOW - 0.005
    cfg = WindowConfig()
    assert cfg.max_encoder_wait_ms == 25

    def encoded(step_interval_s: float) -> list[int]:
        plan = plan_step(
            [*playing, newcomer], cfg, costs, True, NOW, step_interval_s=step_interval_s
        )
        return [s.stream_id for s in plan.encodes]

    assert encoded(0.005) == []  # short steps: it waits for others to arrive
    assert encoded(0.045) == [100]  # a 45 ms step's arrivals share its call already
    newcomer.arrived = NOW - 0.030
    assert encoded(0.005) == [100]  # waited its 25 ms: encoded whatever the steps


def drain_a_burst(match_lengths: bool, count: int = 320) -> tuple[list[float], bool]:
    """Listeners of mixed sentence lengths arriving together on a GPU scheduler, planned step
    after step until every first sentence is encoded; each step lasts what its encoder calls
    cost, every row as wide as its call's longest sentence (padded to 32 ids). When each
    listener's call ended (seconds from the first step), and whether every step encoded the
    earliest one waiting."""
    costs = gpu_costs()
    cfg = WindowConfig(max_encoder_batch=32, max_step_ms=60)
    rules = WindowRules(batch_buckets=(1, 2, 4, 8, 16, 32, 64, 128), match_lengths=match_lengths)
    lengths = np.random.default_rng(7).choice([24, 48, 96, 160, 260, 420], count)
    waiting = [make_stream(i, ids=int(n)) for i, n in enumerate(lengths)]
    for i, stream in enumerate(waiting):
        stream.arrived = NOW - 0.5 + i * 1e-4  # in order of their ids
    now, waits, oldest_first = NOW, [], True
    while waiting:
        step = plan_step(waiting, cfg, costs, batching=True, now=now, rules=rules)
        assert step.encodes
        oldest_first &= waiting[0] in step.encodes
        for _, batch in encoder_calls(step.encodes, costs, batching=True):
            width = -(-max(len(s.sentences[0].ids) for s in batch) // 32) * 32
            now += costs.per_call["encoder"] + len(batch) * width * costs.per_frame["encoder"]
        waits += [now - NOW for s in step.encodes]
        encoded = {s.stream_id for s in step.encodes}
        waiting = [s for s in waiting if s.stream_id not in encoded]
    return waits, oldest_first


def test_a_burst_is_encoded_in_calls_of_like_lengths_and_sooner() -> None:
    """Every row of a GPU encoder call is as wide as its longest sentence. Taken in arrival
    order, a burst's calls are padded to the longest of 32 sentences; taken by length around
    the earliest listener waiting, they are padded far less, and the burst is encoded sooner,
    its slowest listeners included, while the earliest one waiting is still encoded first."""
    arrival, in_order = drain_a_burst(match_lengths=False)
    matched, oldest_first = drain_a_burst(match_lengths=True)
    assert in_order and oldest_first
    assert len(matched) == len(arrival) == 320
    assert max(matched) < 0.8 * max(arrival)
    assert np.percentile(matched, 95) < 0.8 * np.percentile(arrival, 95)
    assert np.median(matched) < 0.8 * np.median(arrival)


def test_playing_streams_next_sentences_keep_their_places_in_a_burst() -> None:
    """Ordering a burst by length moves only new listeners: a playing stream's next sentence
    (its listener has audio running out) is encoded in its deadline's turn."""
    rules = WindowRules(match_lengths=True)
    cfg = WindowConfig(max_encoder_batch=4, max_step_ms=1000)
    costs = gpu_costs()
    newcomers = [make_stream(i, ids=300 if i % 2 else 30) for i in range(12)]
    for i, stream in enumerate(newcomers):
        stream.arrived = NOW - 0.5 + i * 1e-3
    playing = make_stream(99, ids=300)
    # Between sentences, its audio runs out between the third and the fourth newcomer's due.
    playing.first_audio_at = NOW - 2.0
    playing.audio_seconds_sent = 2.0 - 0.4475
    step = plan_step([*newcomers, playing], cfg, costs, batching=True, now=NOW, rules=rules)
    assert [s.stream_id for s in step.encodes] == [0, 2, 4, 99]
    unmatched = plan_step([*newcomers, playing], cfg, costs, True, NOW, WindowRules())
    assert [s.stream_id for s in unmatched.encodes] == [0, 1, 2, 99]
