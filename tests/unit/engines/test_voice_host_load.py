"""A pod knows what it holds: its voice host measures the audio each architecture's scheduler
makes a second and how busy it is, derives the real-time streams it holds from its own
history, and refuses a new stream (RESOURCE_EXHAUSTED, at once) when it holds that many,
rather than make every playing stream late."""

from __future__ import annotations

import pytest

from engines.pod.voice_host.host import (
    FULL_BUSY,
    LOAD_WINDOW_S,
    SLOW_START_STREAMS,
    LoadMeter,
    StreamRefused,
    VoiceHost,
)
from engines.streaming import StreamSink, SynthesisParams
from engines.streaming.types import StepTimes


class FakeScheduler:
    def __init__(self) -> None:
        self.step_times = StepTimes()
        self.audio_seconds = 0.0
        self.live = 0

    def live_streams(self) -> int:
        return self.live


def run(meter: LoadMeter, scheduler: FakeScheduler, busy: float, rate: float, seconds: float):
    """`seconds` of wall time, `busy` of it on steps making `rate` s of audio a second."""
    now = getattr(run, "now", 0.0)
    for _ in range(int(seconds / 0.25)):
        now += 0.25
        scheduler.step_times.wall["windows"] += 0.25 * busy
        scheduler.step_times.wall["idle"] += 0.25 * (1 - busy)
        scheduler.audio_seconds += 0.25 * rate
        meter.sample(now)
    run.now = now  # type: ignore[attr-defined]


def test_capacity_is_the_audio_the_pod_makes_a_second_at_full_busy() -> None:
    scheduler = FakeScheduler()
    meter = LoadMeter(scheduler)  # type: ignore[arg-type]
    scheduler.live = 2
    run(meter, scheduler, busy=0.1, rate=1.5, seconds=3)
    assert meter.capacity == 0  # too idle to say what it could make
    # Two streams racing ahead of their listeners keep it busy all the time: 12 s of audio
    # a second is what it makes, 10 real-time streams with the headroom.
    run(meter, scheduler, busy=1.0, rate=12.0, seconds=3)
    assert meter.capacity == int(12.0 * FULL_BUSY) == 10
    assert not meter.full(2)  # busy, but far from full
    assert meter.ratio(5) == pytest.approx(0.5)
    scheduler.live = 11
    run(meter, scheduler, busy=1.0, rate=11.5, seconds=3)
    assert meter.capacity == 9 and meter.full(11) and meter.full(9) and not meter.full(8)
    # The machine got slower (another process took CPU time): it holds fewer now, and is
    # full at that many, however busy it was when the streams came in.
    run(meter, scheduler, busy=0.5, rate=3.0, seconds=3)
    assert meter.capacity == 5 and meter.full(5) and not meter.full(4)
    assert meter.ratio(0) == 0.0


def test_a_pod_that_has_not_measured_itself_takes_new_streams_slowly() -> None:
    """A new pod looks empty to every balancer: without a measure it would take every new
    stream at once. Until it measures, it takes SLOW_START_STREAMS more a window once it has
    that many, and never refuses a lightly loaded listener."""
    meter = LoadMeter(FakeScheduler())  # type: ignore[arg-type]
    for taken in range(SLOW_START_STREAMS):
        assert not meter.full(taken, now=10.0)
        meter.admitted(now=10.0)
    assert meter.full(SLOW_START_STREAMS, now=10.5)  # a burst: the rest go elsewhere
    assert not meter.full(SLOW_START_STREAMS - 1, now=10.5)  # a stream ended: room again
    assert not meter.full(SLOW_START_STREAMS, now=10.0 + LOAD_WINDOW_S + 0.1)  # it grows


def test_a_full_pod_refuses_a_new_stream_with_resource_exhausted(joe_plan) -> None:
    host = VoiceHost()
    try:
        handle = host.load(joe_plan)
        (architecture,) = host._architectures.values()
        assert architecture.load is not None
        host._closed.set()  # the load watcher stops measuring: the test sets the load
        architecture.load.busy, architecture.load.rate, architecture.load.capacity = 0.97, 1.0, 1
        architecture.scheduler._incoming.append(object())  # one live stream
        with pytest.raises(StreamRefused) as refused:
            host.start_stream(handle, "Hello.", SynthesisParams(), StreamSink())
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert "this server is full: 1 live streams of the 1 it holds" in str(refused.value)
        assert host.stats(handle).refused_streams == 1
    finally:
        architecture.scheduler._incoming.clear()
        host.close()
