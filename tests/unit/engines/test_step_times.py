"""Where the scheduler thread's time goes (`StreamScheduler.step_times`, reported in a
profiling run's call log): a device that is slow to finish a step shows up as time waiting for
the step in flight, off the thread's CPU, not as planning or launching."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from host_device import QUIET, TEXT, HostStages, Sink, Timing

from engines.frames import HostBackend
from engines.frontend import Sentence, text_to_sentences
from engines.runtime import OnnxStages
from engines.streaming import StreamScheduler
from engines.streaming.types import STEP_PARTS, StepTimes
from engines.voice import Voice


class _Pending:
    """A launched step whose device work ends `seconds` after the scheduler asks for it."""

    def __init__(self, pcm: np.ndarray, seconds: float) -> None:
        self.pcm, self.seconds = pcm, seconds

    def wait(self) -> None:
        time.sleep(self.seconds)

    def result(self) -> tuple[np.ndarray, float]:
        return self.pcm, 0.001


class SlowDevice(HostBackend):
    """Host frame stores with a GPU backend's asynchronous calls, each step's device work
    taking `seconds` to finish."""

    async_calls = True

    def __init__(self, runtime: Any, seconds: float) -> None:
        super().__init__(runtime, initial_pages=512)
        self.seconds = seconds

    def vocode_async(self, *args: Any) -> _Pending:
        return _Pending(self.vocode(*args), self.seconds)

    def timer(self) -> Timing:
        return Timing()


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


def test_the_report_names_every_part_in_seconds() -> None:
    times = StepTimes()
    times.steps, times.cpu = 3, 0.01234
    times.wall["wait"] = 1.23456
    report = times.report()
    assert report["steps"] == 3 and report["cpu_s"] == 0.012 and report["wait_s"] == 1.235
    assert {f"{part}_s" for part in STEP_PARTS} <= set(report)
