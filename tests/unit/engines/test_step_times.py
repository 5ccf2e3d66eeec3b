"""Where the scheduler thread's time goes (`StreamScheduler.step_times`, reported in a
profiling run's call log): a device that is slow to finish a step shows up as time waiting for
the step in flight, off the thread's CPU, not as planning or launching."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from host_device import QUIET, TEXT, HostStages, Pending, Sink, SlowDevice

from engines.runtimes.onnx import OnnxStages
from engines.streaming import StreamScheduler
from engines.streaming.types import FIRST_AUDIO_PARTS, STEP_PARTS, FirstAudioPaths, StepTimes
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def step_times(stages: OnnxStages, sentences: list[Sentence], seconds: float) -> StepTimes:
    scheduler = StreamScheduler(HostStages(stages, SlowDevice(stages, seconds)), 22050)
    scheduler.start()
    try:
        sinks = [Sink() for _ in range(2)]
        for sink in sinks:
            scheduler.submit(list(sentences), QUIET, sink)
        for sink in sinks:
            assert sink.done.wait(120) and sink.error is None and sink.chunks
    finally:
        scheduler.stop()
    return scheduler.step_times


def test_a_slow_device_shows_as_the_wait_for_the_step_in_flight(stages, sentences) -> None:
    slow = step_times(stages, sentences, 0.03)
    fast = step_times(stages, sentences, 0.0)
    assert slow.steps > 5 and fast.steps > 5
    # Every step but the first waits for the one before it to finish on the device.
    assert slow.wall["wait"] >= 0.8 * 0.03 * (slow.steps - 1)
    assert fast.wall["wait"] < 0.2 * slow.wall["wait"]
    # The wait is off the thread's CPU; the parts together are the steps' wall time.
    busy = sum(seconds for part, seconds in slow.wall.items() if part != "idle")
    assert slow.cpu < busy - 0.8 * slow.wall["wait"]
    assert slow.wall["plan"] > 0 and slow.wall["windows"] > 0 and slow.wall["encode"] > 0
    # The CPU time by part adds up to the thread's, and the wait for the device has none.
    assert sum(slow.cpu_parts.values()) == pytest.approx(slow.cpu, rel=0.05, abs=0.002)
    assert slow.cpu_parts["wait"] < 0.2 * slow.wall["wait"]


def test_the_report_names_every_part_in_seconds() -> None:
    times = StepTimes()
    times.steps, times.cpu = 3, 0.01234
    times.wall["wait"] = 1.23456
    report = times.report()
    assert report["steps"] == 3 and report["cpu_s"] == 0.012 and report["wait_s"] == 1.235
    assert {f"{part}_s" for part in STEP_PARTS} <= set(report)
    assert {f"{part}_cpu_s" for part in STEP_PARTS if part != "idle"} <= set(report)


class _SlowPending(Pending):
    """A launched step whose audio reaches the host `seconds` after the delivery asks."""

    def result(self) -> tuple[np.ndarray, float]:
        time.sleep(self.seconds)
        return self.pcm, self.seconds


class SlowAudio(SlowDevice):
    def vocode_async(self, *args: Any) -> Pending:
        return _SlowPending(self.vocode(*args), self.seconds)


def test_the_first_audio_path_splits_a_streams_first_audio_into_its_parts(
    stages, sentences
) -> None:
    """A profiling run's call log says where new streams' first audio went: the phonemiser
    before the scheduler (here 0.3 s, as if the request had waited that long), admission, the
    first window, and a device slow to hand its audio back (0.1 s a call). The first-audio
    metric counts from the request as well, not from when the scheduler got it."""
    scheduler = StreamScheduler(HostStages(stages, SlowAudio(stages, 0.1)), 22050)
    paths = scheduler.first_audio_paths = FirstAudioPaths()
    scheduler.start()
    try:
        sinks = [Sink() for _ in range(3)]
        for sink in sinks:
            scheduler.submit(sentences[:1], QUIET, sink, received=time.monotonic() - 0.3)
        for sink in sinks:
            assert sink.done.wait(120) and sink.error is None and sink.chunks
    finally:
        scheduler.stop()
    summary = paths.take()
    assert summary["n"] == 3
    assert 300 <= summary["frontend"][0] < 400
    assert summary["delivery"][0] >= 100  # the wait for the audio, after the launch
    assert summary["admission"][0] > 0 and summary["first_window"][0] >= 0
    parts = sum(summary[part][0] for part in FIRST_AUDIO_PARTS)
    assert summary["total"][0] >= 400 and abs(summary["total"][0] - parts) < 0.5 * parts
    assert paths.take() == {"n": 0}  # taken: the next interval starts empty
    # The first-audio histogram (voxfleet_first_audio_seconds) counts from the request too.
    samples = scheduler.stats.first_audio_samples
    assert len(samples) == 3 and min(samples) >= 0.4
