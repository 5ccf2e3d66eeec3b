"""Voices share a scheduler's steps fairly: the planner orders every voice's playing streams
by when their listeners run out of audio, and gives new listeners their places in turn by
voice, so a voice with one listener never waits behind a voice with a thousand; a step's
calls split by voice (each runs with its own weights). No runtime: the planner is pure
(engines/streaming/planner.py)."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from host_device import SlowDevice
from known_costs import FAST_GPU, RATE, TEXT, AsyncKnownCosts, Listener

from engines.contract.plan import WindowConfig
from engines.streaming import StreamScheduler
from engines.streaming.costs import CostModel
from engines.streaming.planner import (
    ENCODE_UNPACED_SHARE,
    ENCODE_VOICES_SHARE,
    StepPlan,
    WindowRules,
    call_key,
    encoder_calls,
    group_calls,
    plan_step,
    window_calls,
)
from engines.streaming.types import (
    SentenceState,
    Stream,
    StreamSink,
    SynthesisParams,
    VoiceSlot,
    call_voice,
)
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice

NOW = 1000.0
CFG = WindowConfig(max_batch_windows=32, max_encoder_batch=8)


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def playing(stream_id: int, voice: VoiceSlot, buffered_s: float) -> Stream:
    stream = Stream(stream_id, deque(), SynthesisParams(), StreamSink(), NOW - 5.0)
    stream.current = SentenceState(pages=np.array([1]), frames=2000, flowed=2000, vocoded=500)
    stream.first_audio_at = NOW - 2.0
    stream.audio_seconds_sent = 2.0 + buffered_s
    stream.windows_sent = 8
    stream.voice = voice
    return stream


def waiting(stream_id: int, voice: VoiceSlot, arrived: float = NOW) -> Stream:
    stream = Stream(
        stream_id, deque([Sentence("x", [1] * 40)]), SynthesisParams(), StreamSink(), arrived
    )
    stream.voice = voice
    return stream


def gpu_costs() -> CostModel:
    costs = CostModel(fixed_part=True)
    for stage, seconds in (("vocoder", 0.004), ("flow", 0.002), ("encoder", 0.006)):
        for _ in range(3):
            costs.observe(stage, seconds, 8, 144)
    return costs


def test_a_voice_with_one_listener_is_served_before_a_busy_voices_later_deadlines() -> None:
    busy, quiet = VoiceSlot("busy"), VoiceSlot("quiet")
    # A thousand listeners of one voice with 0.4 to 1.4 s of audio left; one listener of
    # another voice whose audio runs out in 0.1 s.
    streams = [playing(i, busy, 0.4 + i / 1000) for i in range(1000)]
    lonely = playing(5000, quiet, 0.1)
    plan = plan_step([*streams, lonely], CFG, gpu_costs(), True, NOW)
    assert lonely in [w.stream for w in plan.windows]
    assert plan.windows[0].stream is lonely  # planned first: its deadline is the earliest
    assert len(plan.windows) == CFG.max_batch_windows  # the busy voice fills the rest


def test_a_new_listener_of_a_quiet_voice_is_encoded_in_the_next_step() -> None:
    busy, quiet = VoiceSlot("busy"), VoiceSlot("quiet")
    streams = [playing(i, busy, 0.5 + i / 1000) for i in range(1000)]
    newcomers = [waiting(2000 + i, busy, NOW - 0.01) for i in range(20)]
    new_quiet = waiting(5000, quiet, NOW - 0.01)
    plan = plan_step([*streams, *newcomers, new_quiet], CFG, gpu_costs(), True, NOW)
    assert new_quiet in plan.encodes
    # Its sentence is encoded in a call of its own voice (each voice its own weights).
    calls = list(encoder_calls(plan.encodes, gpu_costs(), True))
    for _, members in calls:
        assert len({s.voice for s in members}) == 1
    assert any(members == [new_quiet] for _, members in calls)


def test_a_steps_windows_split_into_calls_by_voice() -> None:
    a, b = VoiceSlot("a"), VoiceSlot("b")
    streams = [playing(i, a if i % 2 else b, 0.05) for i in range(12)]
    plan = plan_step(streams, CFG, gpu_costs(), True, NOW)
    groups = group_calls(
        plan.windows, lambda w: (window_calls(w, CFG)[0], w.stream.voice), batching=True
    )
    assert len(groups) == 2
    assert all(len({w.stream.voice for w in group}) == 1 for group in groups)
    assert sorted(len(g) for g in groups) == [6, 6]


def test_where_voices_are_grouped_a_quiet_voice_is_still_first_and_calls_are_by_width() -> None:
    busy, quiet = VoiceSlot("busy"), VoiceSlot("quiet")
    rules = WindowRules(grouped_voices=True)
    streams = [playing(i, busy, 0.4 + i / 1000) for i in range(1000)]
    lonely = playing(5000, quiet, 0.1)
    plan = plan_step([*streams, lonely], CFG, gpu_costs(), True, NOW, rules)
    assert plan.windows[0].stream is lonely
    keys = {window_calls(w, CFG, rules)[0] for w in plan.windows}
    assert {voice for _, _, voice in keys} == {None}  # one vocoder call a width, any voice


class GroupingDevice(SlowDevice):
    """A GPU backend that groups voices: a vocoder call carries rows of several voices (its
    `voice` a sequence, a row each) and costs the stages one call; it records each call's
    voices."""

    def __init__(self, runtime: Any) -> None:
        super().__init__(runtime)
        self.features = replace(self.features, fixed_call_costs=True, groups_voices=True)
        self.voices_per_call: list[int] = []
        self.voices_per_encoder_call: list[int] = []

    def vocode(self, tables, starts, limits, width, speakers, cut, voice=None):
        rows = voice if isinstance(voice, list) else [voice] * len(tables)
        self.voices_per_call.append(len({id(each) for each in rows}))
        return super().vocode(tables, starts, limits, width, speakers, cut)

    def encode(self, ids, lengths, scales, speakers, voice=None):
        rows = voice if isinstance(voice, list) else [voice] * len(ids)
        self.voices_per_encoder_call.append(len({id(each) for each in rows}))
        return super().encode(ids, lengths, scales, speakers)


class VoiceOf:
    """A voice's weights as a host backend takes them: the stages' calls, an identity of its
    own."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)


def voices_run(
    sentences: list[Sentence], grouped: bool, one_weights: bool = False
) -> dict[str, Any]:
    """Four voices with five listeners each, all at once, on stages of known cost; with
    `one_weights`, four slots of one voice's weights (its instances in a voice host)."""
    runtime = AsyncKnownCosts(FAST_GPU)
    if grouped:
        device = GroupingDevice(runtime)
        runtime.stream_backend = lambda: device  # type: ignore[method-assign]
    scheduler = StreamScheduler(runtime, RATE, windows=WindowConfig(), exact_widths=False)
    assert scheduler.rules.grouped_voices is grouped
    weights = VoiceOf(runtime)
    voices = [
        VoiceSlot(f"v{i}", weights=weights if one_weights else VoiceOf(runtime)) for i in range(4)
    ]
    listeners: list[tuple[VoiceSlot, Listener]] = []
    scheduler.start()
    try:
        for index in range(20):
            voice = voices[index % 4]
            listeners.append((voice, Listener()))
            scheduler.submit(list(sentences), SynthesisParams(), listeners[-1][1], voice=voice)
        for _, listener in listeners:
            assert listener.done.wait(60), "a stream never finished"
    finally:
        scheduler.stop()
    return {
        "calls": runtime.calls["vocoder"],
        "errors": [listener.error for _, listener in listeners if listener.error],
        "audio_s": {
            voice.name: sum(listener.received_s for v, listener in listeners if v is voice)
            for voice in voices
        },
        "voice_windows": {
            voice.name: sum(n * c for n, c in voice.stats.vocoder_batches.items())
            for voice in voices
        },
        "voice_calls": sum(sum(voice.stats.vocoder_batches.values()) for voice in voices),
        "voices_per_call": getattr(runtime.stream_backend(), "voices_per_call", []),
        "encoder_calls": runtime.calls["encoder"],
        "voices_per_encoder_call": getattr(runtime.stream_backend(), "voices_per_encoder_call", []),
    }


def test_a_backend_that_groups_voices_gets_one_call_for_all_of_them(sentences) -> None:
    """Where the backend groups voices, a step's windows of every voice share one vocoder call
    a width, and its sentences one encoder call: fewer calls for the same audio, every
    voice's audio whole, and each voice's windows still counted as its own."""
    grouped = voices_run(sentences, grouped=True)
    split = voices_run(sentences, grouped=False)
    assert not grouped["errors"] and not split["errors"]
    assert grouped["audio_s"] == pytest.approx(split["audio_s"], rel=1e-6)
    assert max(grouped["voices_per_call"]) >= 3  # calls carried several voices' windows
    assert grouped["calls"] < 0.7 * split["calls"], (grouped["calls"], split["calls"])
    assert grouped["voice_windows"] == split["voice_windows"]
    # and the four voices' first sentences, asked for at once, shared encoder calls.
    assert max(grouped["voices_per_encoder_call"]) >= 3
    assert grouped["encoder_calls"] < split["encoder_calls"]


def test_instances_of_one_voice_share_its_calls_and_their_counts_add_up_to_them(
    sentences,
) -> None:
    """Slots that hold one voice's weights (its instances in a pod's voice host, `voxfleet
    serve --instances`) share every stage call as one voice would, on a backend that does not
    group voices: fewer calls for the same audio. Each call is counted once, with all the
    voice's windows in it, so the instances' series of vocoder calls add up to the voice's
    calls and windows (as a dashboard sums them)."""
    shared = voices_run(sentences, grouped=False, one_weights=True)
    split = voices_run(sentences, grouped=False)
    assert not shared["errors"] and not split["errors"]
    assert shared["audio_s"] == pytest.approx(split["audio_s"], rel=1e-6)
    assert shared["calls"] < 0.7 * split["calls"], (shared["calls"], split["calls"])
    assert shared["encoder_calls"] < split["encoder_calls"]
    assert sum(shared["voice_windows"].values()) == sum(split["voice_windows"].values())
    assert shared["voice_calls"] == shared["calls"]


def test_what_a_scheduler_holds_counts_each_live_voices_calls(sentences) -> None:
    """A scheduler's prediction of what it holds counts the calls of each voice whose streams
    are live, by its share of them: ten voices hold fewer than one voice's streams, the
    instances of one voice (one weights) count as that voice, and voices whose rows share
    calls (a grouping backend) count as one."""

    def held(voices: list[VoiceSlot], grouped: bool = False) -> tuple[tuple[float, ...], int]:
        runtime = AsyncKnownCosts(FAST_GPU)
        if grouped:
            device = GroupingDevice(runtime)
            runtime.stream_backend = lambda: device  # type: ignore[method-assign]
        scheduler = StreamScheduler(runtime, RATE, windows=WindowConfig(), exact_widths=False)
        for stage, (per_call, per_frame) in FAST_GPU.items():
            scheduler.costs.per_call[stage], scheduler.costs.per_frame[stage] = per_call, per_frame
        for index in range(40):  # not started: the streams wait as they arrived
            voice = voices[index % len(voices)]
            scheduler.submit(list(sentences), SynthesisParams(), StreamSink(), voice=voice)
        return scheduler.layout().voice_shares, scheduler.capacity()

    runtime = AsyncKnownCosts(FAST_GPU)
    ten = [VoiceSlot(f"v{i}", weights=VoiceOf(runtime)) for i in range(10)]
    one_weights = VoiceOf(runtime)
    instances = [VoiceSlot(f"i{i}", weights=one_weights) for i in range(4)]
    one_shares, one = held(ten[:1])
    ten_shares, ten_held = held(ten)
    assert one_shares == (1.0,)
    assert ten_shares == pytest.approx((0.1,) * 10)
    assert ten_held < 0.7 * one, (ten_held, one)
    assert held(instances) == (one_shares, one)
    assert held(ten, grouped=True)[0] == (1.0,)


def h200_costs() -> CostModel:
    """Call costs of the kind a pool pod's log shows on an H200: an encoder call's fixed part
    is most of a call of a few sentences."""
    costs = CostModel(fixed_part=True)
    for stage, per_call, per_frame in (
        ("encoder", 3.8e-3, 1.9e-6),
        ("flow", 0.75e-3, 0.19e-6),
        ("vocoder", 0.8e-3, 1.0e-6),
    ):
        costs.per_call[stage], costs.per_frame[stage] = per_call, per_frame
    return costs


def test_a_busy_step_of_many_voices_spends_it_on_windows_not_on_a_call_a_voice() -> None:
    """Ten busy voices, each with 20 playing listeners and three new ones late for their first
    audio: a step opens few voices' encoder calls (each takes every new listener of its
    voice), not a call of one sentence per voice whose fixed costs would take most of the
    step, and so has room for the playing streams' windows. The voices left wait their turn:
    every new listener is encoded within a few steps, the one waiting longest first. One
    voice's step takes all its new listeners in its one call, as before."""
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)

    def busy(voices: list[VoiceSlot]) -> tuple[list[Stream], list[Stream]]:
        streams = [playing(i, voices[i % len(voices)], 0.3 + i / 400) for i in range(200)]
        new = [waiting(1000 + i, voices[i % len(voices)], NOW - 0.1 + i / 1000) for i in range(30)]
        return streams, new

    streams, new = busy([VoiceSlot(f"v{i}") for i in range(10)])
    plan = plan_step([*streams, *new], cfg, h200_costs(), True, NOW)
    encoded = {s.voice for s in plan.encodes}
    assert 1 <= len(encoded) <= 2, [v.name for v in encoded]
    assert all(s in plan.encodes for s in new if s.voice in encoded)  # whole voices
    assert len(plan.windows) >= 50, len(plan.windows)
    left, steps = list(new), 0
    while left:
        steps += 1
        plan = plan_step([*streams, *left], cfg, h200_costs(), True, NOW)
        assert left[0] in plan.encodes  # the one waiting longest
        left = [s for s in left if s not in plan.encodes]
    assert steps <= 10
    one_streams, one_new = busy([VoiceSlot("one")])
    one = plan_step([*one_streams, *one_new], cfg, h200_costs(), True, NOW)
    assert sorted(s.stream_id for s in one.encodes) == [s.stream_id for s in one_new]


def test_a_busy_step_of_many_voices_launches_few_full_vocoder_calls() -> None:
    """Ten busy voices of 20 playing listeners each, their next windows of three widths, on a
    host that takes 1.3 ms to launch a vocoder call (about a packed H200 pod's): a step
    launches a few calls of many windows each, not a call a voice and width of a few windows;
    a window whose own call is not open rides its voice's wider one and carries as much audio
    as that call's rows hold. Every listener is served within a few steps, the one whose
    audio runs out first in the first. Without a launch cost (a CPU backend), with paced
    listeners (a lead limit) and for one voice the step is as before: a call a voice and
    width."""
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)
    voices = [VoiceSlot(f"v{i}") for i in range(10)]
    streams = [playing(i, voices[i % 10], 0.2 + i / 400) for i in range(200)]
    for index, stream in enumerate(streams):
        stream.windows_sent = (1, 2, 8)[index // 10 % 3]  # windows of 32, 64 and 128 frames

    def calls(plan: StepPlan) -> set[Any]:
        return {window_calls(w, cfg, WindowRules())[0] for w in plan.windows}

    before = plan_step(streams, cfg, h200_costs(), True, NOW)
    assert len(calls(before)) >= 25, len(calls(before))
    step = plan_step(streams, cfg, h200_costs(), True, NOW, launch_s=1.3e-3)
    assert len(calls(step)) <= 6, len(calls(step))
    assert len(step.windows) >= 6 * len(calls(step)), (len(step.windows), len(calls(step)))
    frames = sum(w.decode[1] - w.decode[0] for w in step.windows) / len(step.windows)
    assert frames > 1.2 * sum(w.decode[1] - w.decode[0] for w in before.windows) / len(
        before.windows
    )
    left, steps = sorted(streams, key=lambda s: s.deadline(0.05)), 0
    while left:
        steps += 1
        plan = plan_step(left, cfg, h200_costs(), True, NOW, launch_s=1.3e-3)
        served = {w.stream.stream_id for w in plan.windows}
        assert left[0].stream_id in served  # the one closest to running dry
        left = [s for s in left if s.stream_id not in served]
    assert steps <= 6, steps
    paced = replace(cfg, max_lead_ms=300)
    assert calls(plan_step(streams, paced, h200_costs(), True, NOW, launch_s=1.3e-3)) == calls(
        plan_step(streams, paced, h200_costs(), True, NOW)
    )
    one = [playing(s.stream_id, voices[0], s.buffered_seconds(NOW)) for s in streams]
    for mine, theirs in zip(one, streams, strict=True):
        mine.windows_sent = theirs.windows_sent
    assert calls(plan_step(one, cfg, h200_costs(), True, NOW, launch_s=1.3e-3)) == calls(
        plan_step(one, cfg, h200_costs(), True, NOW)
    )


def ten_busy_voices() -> tuple[list[Stream], list[Stream]]:
    """Ten voices of 20 playing, unpaced listeners each, and three new listeners a voice
    just arrived, the first waiting longest."""
    voices = [VoiceSlot(f"v{i}") for i in range(10)]
    streams = [playing(i, voices[i % 10], 0.1 + i / 4000) for i in range(200)]
    new = [waiting(1000 + i, voices[i % 10], NOW - i / 100_000) for i in range(30)]
    return streams, new


def encoded(plan: StepPlan) -> set[str]:
    """The voices whose encoder calls a step opens."""
    return {s.voice.name for s in plan.encodes if s.voice is not None}


def test_a_busy_step_of_many_unpaced_voices_opens_one_voices_encoder_call() -> None:
    """Ten busy voices whose listeners are unpaced (no lead limit), three new listeners each
    just arrived: a step opens one voice's encoder call, with all that voice's new listeners
    (`ENCODE_UNPACED_SHARE`), where a quarter of the step (`ENCODE_VOICES_SHARE`, which
    paced listeners keep) opens three; the voices take turns, the listener waiting longest
    first, and every one is encoded within ten steps."""
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)
    streams, new = ten_busy_voices()

    def step(listeners: list[Stream], config: WindowConfig = cfg, **share: float) -> StepPlan:
        return plan_step(listeners, config, h200_costs(), True, NOW, step_interval_s=1.0, **share)

    unpaced = step([*streams, *new])
    assert len(encoded(unpaced)) == 1
    assert all(s in unpaced.encodes for s in new if s.voice.name in encoded(unpaced))
    assert len(unpaced.windows) >= 100, len(unpaced.windows)
    quarter = step([*streams, *new], unpaced_encode_share=ENCODE_VOICES_SHARE)
    assert len(encoded(quarter)) == 3
    paced = step([*streams, *new], replace(cfg, max_lead_ms=300))
    assert encoded(paced) == encoded(quarter)
    left, steps = sorted(new, key=lambda s: s.arrived), 0
    while left:
        steps += 1
        plan = step([*streams, *left])
        assert left[0] in plan.encodes  # the one waiting longest
        left = [s for s in left if s not in plan.encodes]
    assert steps <= 10, steps


def test_encoder_calls_over_several_streams_open_that_many_voices_a_step() -> None:
    """The same ten busy unpaced voices with the backend's queued encoder calls spread over
    four CUDA streams (`encoder_streams`), side by side: a step opens four voices' encoder
    calls where one stream opens one (their costs as one call's alone: the cost model has
    not seen them side by side yet), and every new listener is encoded within three steps,
    the one waiting longest first; with one stream, one voice's as before."""
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)
    streams, new = ten_busy_voices()

    def step(listeners: list[Stream], streams_: int) -> StepPlan:
        return plan_step(
            listeners, cfg, h200_costs(), True, NOW, step_interval_s=1.0, encoder_streams=streams_
        )

    assert len(encoded(step([*streams, *new], 1))) == 1
    spread = step([*streams, *new], 4)
    assert len(encoded(spread)) == 4
    assert all(s in spread.encodes for s in new if s.voice.name in encoded(spread))
    left, steps = sorted(new, key=lambda s: s.arrived), 0
    while left:
        steps += 1
        plan = step([*streams, *left], 4)
        assert left[0] in plan.encodes  # the one waiting longest
        left = [s for s in left if s not in plan.encodes]
    assert steps <= 3, steps


def test_a_busy_step_of_many_unpaced_voices_fills_its_calls_padding_with_next_windows() -> None:
    """Ten busy voices of unpaced listeners: every voice's vocoder call, padded to its batch
    bucket, fills the empty rows with the windows that follow its streams' own
    (`fill_with_next_windows`), so the step makes the same calls with more audio; one voice's
    busy step, and paced listeners' steps, get none (`NEXT_WINDOW_PASSES` says why)."""
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)
    buckets = (1, 2, 4, 8, 16, 32, 64, 128)
    on = WindowRules(batch_buckets=buckets, next_windows=True)
    off = WindowRules(batch_buckets=buckets)
    streams, _ = ten_busy_voices()

    def calls(listeners: list[Stream], rules: WindowRules, config: WindowConfig = cfg) -> Counter:
        plan = plan_step(
            listeners, config, h200_costs(), True, NOW, rules, step_interval_s=1.0, launch_s=7e-4
        )
        return Counter(
            (call_key(w, config, rules), call_voice(w.stream.voice)) for w in plan.windows
        )

    plain, followed = calls(streams, off), calls(streams, on)
    assert set(followed) == set(plain)
    assert sum(followed.values()) > sum(plain.values())
    assert all(rows in buckets for rows in followed.values()), followed
    voice = VoiceSlot("v0")  # (90 streams: a call with padding rows)
    one = [playing(s.stream_id, voice, s.buffered_seconds(NOW)) for s in streams[:90]]
    assert any(rows not in buckets for rows in calls(one, off).values())
    assert calls(one, on) == calls(one, off)
    paced = replace(cfg, max_lead_ms=300)
    assert calls(streams, on, paced) == calls(streams, off, paced)


def test_the_unpaced_encoder_share_is_read_from_the_environment(monkeypatch) -> None:
    """VOXFLEET_ENCODE_SHARE sets the unpaced steps' share for comparing runs (a tenth
    unset); a value that is not a share from 0 to 1 is refused with the variable's name."""
    from engines.streaming import scheduler as scheduler_module

    name = scheduler_module.ENCODE_SHARE_ENV
    monkeypatch.setenv(name, "0.25")
    assert scheduler_module.share_from_environment(name, ENCODE_UNPACED_SHARE) == 0.25
    for bad in ("1.5", "a tenth", "-0.1"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            scheduler_module.share_from_environment(name, ENCODE_UNPACED_SHARE)
    monkeypatch.delenv(name)
    assert scheduler_module.share_from_environment(name, ENCODE_UNPACED_SHARE) == 0.1


def test_a_busy_step_of_one_unpaced_voice_takes_two_encoder_calls_of_new_sentences() -> None:
    """One voice's busy step of unpaced listeners, with more new sentences waiting than an
    encoder call takes: the step takes two calls' worth (`ENCODER_CALLS_A_STEP`), which
    `encoder_calls` splits into calls of at most `max_encoder_batch` rows, and its vocoder
    calls' padding rows take next windows. One call's worth where the rules allow one
    (VOXFLEET_ENCODER_CALLS=1) or only one more may go out, for paced listeners, and for a
    step of several voices."""
    cfg = WindowConfig(max_batch_windows=128, max_encoder_batch=32)
    buckets = (1, 2, 4, 8, 16, 32, 64, 128)
    voice, other = VoiceSlot("v0"), VoiceSlot("v1")
    streams = [playing(i, voice, 1.0 + i / 1000) for i in range(90)]
    new = [waiting(1000 + i, voice, NOW - 0.2 - i / 100_000) for i in range(80)]
    two = WindowRules(batch_buckets=buckets, next_windows=True, encoder_calls=2)
    one = replace(two, encoder_calls=1)

    def step(
        rules: WindowRules,
        listeners: list[Stream],
        config: WindowConfig = cfg,
        calls: int | None = None,
    ) -> StepPlan:
        return plan_step(
            listeners,
            config,
            h200_costs(),
            True,
            NOW,
            rules,
            encoder_beside=True,
            encoder_queued=True,
            step_interval_s=1.0,
            launch_s=7e-4,
            encoder_calls=calls,
        )

    plan = step(two, [*streams, *new])
    assert len(plan.encodes) == 64
    batches = [batch for _, batch in encoder_calls(plan.encodes, h200_costs(), True, False, 32)]
    assert len(batches) == 2 and all(len(batch) == 32 for batch in batches)
    assert len(step(one, [*streams, *new]).encodes) == 32
    assert len(step(two, [*streams, *new], calls=1).encodes) == 32
    assert len(step(two, [*streams, *new], replace(cfg, max_lead_ms=300)).encodes) == 32
    mixed = [waiting(s.stream_id, other if s.stream_id % 2 else voice, s.arrived) for s in new]
    assert len(step(two, [*streams, *mixed]).encodes) <= 32
    # Next windows: one voice's playing listeners fill their calls' padding rows.
    assert len(step(two, streams).windows) > len(step(one, streams).windows)


def test_the_encoder_calls_a_step_are_read_from_the_environment(monkeypatch) -> None:
    """VOXFLEET_ENCODER_CALLS sets how many encoder calls' worth of new sentences one voice's
    busy unpaced step takes (two unset); anything but a whole number from 1 up is refused
    with the variable's name."""
    from engines.streaming import scheduler as scheduler_module

    name = scheduler_module.ENCODER_CALLS_ENV
    monkeypatch.setenv(name, "1")
    assert scheduler_module.encoder_calls_from_environment() == 1
    for bad in ("0", "two", "-1", "1.5", "²"):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            scheduler_module.encoder_calls_from_environment()
    monkeypatch.delenv(name)
    assert scheduler_module.encoder_calls_from_environment() == 2
