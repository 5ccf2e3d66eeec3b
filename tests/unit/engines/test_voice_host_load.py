"""A pod knows what it holds: its voice host measures how busy each architecture's scheduler
is, derives the streams it holds at full load from its own history, and refuses a new stream
(RESOURCE_EXHAUSTED, at once) rather than make every playing stream late."""

from __future__ import annotations

import pytest

from engines.streaming import StreamSink, SynthesisParams
from engines.streaming.types import StepTimes
from engines.voice_host.host import FULL_BUSY, LoadMeter, StreamRefused, VoiceHost


class FakeScheduler:
    def __init__(self) -> None:
        self.step_times = StepTimes()
        self.live = 0

    def live_streams(self) -> int:
        return self.live


def run(meter: LoadMeter, scheduler: FakeScheduler, busy: float, seconds: float) -> None:
    """`seconds` of wall time, `busy` of it on steps, sampled every 0.25 s."""
    now = getattr(run, "now", 0.0)
    for _ in range(int(seconds / 0.25)):
        now += 0.25
        scheduler.step_times.wall["windows"] += 0.25 * busy
        scheduler.step_times.wall["idle"] += 0.25 * (1 - busy)
        meter.sample(now)
    run.now = now  # type: ignore[attr-defined]


def test_capacity_is_measured_from_the_pods_own_busy_time() -> None:
    scheduler = FakeScheduler()
    meter = LoadMeter(scheduler)  # type: ignore[arg-type]
    scheduler.live = 6
    run(meter, scheduler, busy=0.1, seconds=3)
    assert meter.capacity == 0  # too idle to say what a stream costs
    assert not meter.full(100)
    run(meter, scheduler, busy=0.5, seconds=3)
    assert meter.busy == pytest.approx(0.5)
    assert meter.capacity == int(6 * FULL_BUSY / 0.5)  # 10: six streams at half the time
    assert meter.ratio == pytest.approx(0.5 / FULL_BUSY)
    assert not meter.full(10)  # not busy enough to refuse, whatever the count
    scheduler.live = 11
    run(meter, scheduler, busy=0.95, seconds=3)
    assert meter.full(11)
    run(meter, scheduler, busy=0.3, seconds=3)  # the load fell: streams are taken again
    assert not meter.full(11)


def test_a_full_pod_refuses_a_new_stream_with_resource_exhausted(joe_plan) -> None:
    host = VoiceHost()
    try:
        handle = host.load(joe_plan)
        (architecture,) = host._architectures.values()
        assert architecture.load is not None
        host._closed.set()  # the load watcher stops measuring: the test sets the load
        architecture.load.busy, architecture.load.capacity = 0.97, 1
        architecture.scheduler._incoming.append(object())  # one live stream
        with pytest.raises(StreamRefused) as refused:
            host.start_stream(handle, "Hello.", SynthesisParams(), StreamSink())
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert "this server is full: 1 live streams" in str(refused.value)
        assert host.stats(handle).refused_streams == 1
    finally:
        architecture.scheduler._incoming.clear()
        host.close()
