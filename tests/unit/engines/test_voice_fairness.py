"""Voices share a scheduler's steps fairly: the planner orders every voice's playing streams
by when their listeners run out of audio, and gives new listeners their places in turn by
voice, so a voice with one listener never waits behind a voice with a thousand; a step's
calls split by voice (each runs with its own weights). No runtime: the planner is pure
(engines/streaming/planner.py)."""

from __future__ import annotations

from collections import deque

import numpy as np

from engines.contract.plan import WindowConfig
from engines.streaming.costs import CostModel
from engines.streaming.planner import encoder_calls, group_calls, plan_step, window_calls
from engines.streaming.types import SentenceState, Stream, StreamSink, SynthesisParams, VoiceSlot
from engines.text.frontend import Sentence

NOW = 1000.0
CFG = WindowConfig(max_batch_windows=32, max_encoder_batch=8)


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
