"""Paced streams share a step's calls (`WindowConfig.paced_step_ms`): where streams rest on their
lead and the calls are asynchronous (a GPU), a step that leaves no work waiting is followed by
the next no sooner than `paced_step_ms`, so the streams that come due meanwhile share its
calls. Without it they came due one by one and each made small calls of its own. Driven with
stages of known cost and a GPU backend's asynchronous calls on the host."""

from __future__ import annotations

import statistics
import time
from typing import Any

import pytest
from known_costs import FAST_GPU, RATE, TEXT, AsyncKnownCosts, Listener

from engines.contract.plan import WindowConfig
from engines.streaming import StreamScheduler, SynthesisParams
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice

COSTS = FAST_GPU
STREAMS = 40
LEAD_MS = 300
# Short windows (32 frames, 0.37 s of audio), so that paced streams come due often.
WINDOWS = dict(window_frames=32, max_lead_ms=LEAD_MS)


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def paced_run(sentences: list[Sentence], paced_step_ms: int) -> dict[str, Any]:
    """STREAMS paced listeners, arriving over 1 s; the vocoder's calls, and what they heard."""
    runtime = AsyncKnownCosts(COSTS)
    windows = WindowConfig(**WINDOWS, paced_step_ms=paced_step_ms)
    scheduler = StreamScheduler(runtime, RATE, windows=windows, exact_widths=False)
    assert scheduler._async
    listeners: list[Listener] = []
    scheduler.start()
    try:
        for _ in range(STREAMS):
            listeners.append(Listener())
            scheduler.submit(list(sentences), SynthesisParams(), listeners[-1])
            time.sleep(1.0 / STREAMS)
        for listener in listeners:
            assert listener.done.wait(60), "a stream never finished"
    finally:
        scheduler.stop()
    batches = scheduler.stats.vocoder_batches
    return {
        "calls": runtime.calls["vocoder"],
        "windows_per_call": sum(n * c for n, c in batches.items()) / sum(batches.values()),
        "underruns": sum(listener.underruns for listener in listeners),
        "errors": [listener.error for listener in listeners if listener.error],
        "first_audio_s": [listener.first - listener.asked for listener in listeners],
    }


def test_paced_streams_share_a_steps_calls_and_none_underruns(sentences) -> None:
    paced = paced_run(sentences, WindowConfig().paced_step_ms)
    each = paced_run(sentences, 0)
    assert not paced["errors"] and not each["errors"]
    # The same audio in fuller calls: at least half again as many windows a call.
    assert paced["windows_per_call"] >= 1.5 * each["windows_per_call"], (paced, each)
    assert paced["calls"] < each["calls"]
    # No listener ran dry waiting for a step; a new one waits at most about a step more.
    assert paced["underruns"] == 0
    assert statistics.median(paced["first_audio_s"]) < 0.15


def test_only_paced_streams_are_predicted_in_paced_steps() -> None:
    """A pod whose streams are paced counts its calls' fixed costs every `paced_step_ms`; one
    whose streams are not keeps the plan's `max_step_ms`, and so takes more streams."""

    def scheduler(max_lead_ms: int) -> StreamScheduler:
        windows = WindowConfig(window_frames=32, max_lead_ms=max_lead_ms)
        made = StreamScheduler(AsyncKnownCosts(COSTS), RATE, windows=windows, exact_widths=False)
        for stage, (per_call, per_frame) in COSTS.items():  # what its warmup would measure
            made.costs.per_call[stage], made.costs.per_frame[stage] = per_call, per_frame
        return made

    paced, unpaced = scheduler(LEAD_MS), scheduler(0)
    assert paced.layout().step_ms == WindowConfig().paced_step_ms
    assert unpaced.layout().step_ms == WindowConfig().max_step_ms
    assert paced.capacity() < unpaced.capacity()
