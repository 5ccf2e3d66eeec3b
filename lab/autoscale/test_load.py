"""What the load step counts: refusals apart from failures, a refused listener asking again for
the same sentence, streams cut by a scale-in, and the load levels from a pod's measure; and
that the listeners keep time in a process of their own while the harness is busy."""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from engines.bench.systems import BenchSystemError
from engines.bench.timeline import Chunk, StreamRecord
from lab.autoscale.load import (
    Clients,
    ListenerProcess,
    Listeners,
    ListenerSpec,
    LoopWitness,
    Phase,
    Pods,
    TimedRecord,
    drive_phases,
)
from lab.autoscale.step import (
    load_levels,
    measured_capacity,
    stream_stats,
    streams_cut,
    underrun_detail,
)

REFUSAL = "BenchSystemError: [RESOURCE_EXHAUSTED] voice 'joe': 1 pod(s) refused the stream"


def record(sent: float, ended: float | None, error: str | None = None) -> TimedRecord:
    chunks = [Chunk(sent + 0.1, 2205)] if error is None else []
    return TimedRecord("down", StreamRecord("Hello.", sent, 22050, chunks, ended, error), sent)


def test_only_streams_in_flight_at_the_scale_in_count_as_cut() -> None:
    records = [
        record(10.0, 10.2, "UNAVAILABLE: no endpoints yet"),  # failed long before the scale-in
        record(90.0, 101.0, "UNAVAILABLE: connection reset"),  # in flight, failed after it
        record(95.0, None, "cut off: still streaming when the run ended"),
        record(96.0, 104.0),  # finished normally
        record(99.0, 100.5, REFUSAL),  # every pod was full: refused, never started
        record(300.0, 300.5, "UNAVAILABLE"),  # sent after the window
    ]
    cut = streams_cut(records, since=100.0, until=160.0)
    assert [c["sent_s"] for c in cut] == [90.0, 95.0]


def test_refusals_are_counted_apart_and_the_wait_includes_them() -> None:
    refused = record(10.0, 10.01, REFUSAL)
    admitted = record(10.2, 12.0)
    admitted.asked_s = 10.0  # the same listener, asking again after the refusal
    stats = stream_stats([refused, admitted, record(20.0, 20.1, "INTERNAL: boom")])
    assert stats["admitted_streams"] == 1 and stats["refused_streams"] == 1
    assert stats["failed_streams"] == 1
    assert stats["first_audio_p95_ms"] == 100.0  # from its own request
    assert stats["listener_wait_p95_ms"] == 300.0  # from when the listener first asked


class FakeSystem:
    """Refuses the first request, then fails every other one with a reset connection."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        self.texts.append(text)
        await asyncio.sleep(0)
        if len(self.texts) == 1:
            raise BenchSystemError("[RESOURCE_EXHAUSTED] full", "RESOURCE_EXHAUSTED")
        raise ConnectionResetError("recvmsg: Connection reset by peer")
        yield (0, 0)  # an async generator that fails before its first chunk

    async def close(self) -> None:
        return None


def numbered() -> Iterator[str]:
    return iter(f"Sentence {n}." for n in range(100_000))


def listen_for(
    system: Any,
    seconds: float,
    clock: Callable[[], float] = time.monotonic,
    stalls: list[tuple[float, float]] | None = None,
) -> list[TimedRecord]:
    """One listener on `system` for `seconds`, in this process's own event loop."""
    records: list[TimedRecord] = []
    clients = Clients("shared", lambda: lambda: [], "joe", make=lambda voice, pods: system)

    async def run() -> None:
        listeners = Listeners(clients, numbered(), records.append, clock, stalls)
        listeners.set("x", 1)
        await asyncio.sleep(seconds)
        await listeners.finish(1.0)

    asyncio.run(run())
    return records


def test_a_refused_listener_asks_again_for_the_same_sentence_and_failures_end_when_they_fail() -> (
    None
):
    clock = itertools.count(start=0.0, step=0.5)
    system = FakeSystem()
    records = listen_for(system, 0.7, clock=lambda: next(clock))
    assert len(records) >= 3, "the listener sent too little"
    assert system.texts[0] == system.texts[1] == "Sentence 0."  # asked again after the refusal
    assert system.texts[2] == "Sentence 1."  # a failure moves on
    assert records[0].refused and records[1].asked_s == records[0].asked_s
    second = records[1].record
    assert second.error is not None and "Connection reset" in second.error
    assert second.ended_s is not None and second.ended_s > second.sent_s


def test_the_load_follows_the_pods_own_measure() -> None:
    timeline = [
        {"t": 3.0, "pods": {"a": {"capacity": 0.0}}},  # not yet measured, and too early
        {"t": 12.0, "pods": {"a": {"capacity": 7.0}}},
        {"t": 15.0, "pods": {"a": {"capacity": 8.0}}},
        {"t": 18.0, "pods": {"a": {"capacity": 9.0}}},
        {"t": 21.0, "error": "a missed sample"},
    ]
    assert measured_capacity(timeline, since_s=10.0) == 8
    assert load_levels(8) == (4, 12)
    assert load_levels(1) == (1, 2)
    with pytest.raises(AssertionError, match="reported no capacity"):
        measured_capacity(timeline[:1], since_s=0.0)


def test_underrun_detail_says_where_a_stream_went_quiet() -> None:
    on_time = TimedRecord(
        "step", StreamRecord("Fine.", 10.0, 22050, [Chunk(10.1, 22050), Chunk(10.5, 22050)], 11.0)
    )
    # Half a second of audio, then the next chunk 0.8 s later: silent for 0.3 s.
    late = TimedRecord(
        "step",
        StreamRecord("Late one.", 10.2, 22050, [Chunk(10.4, 11025), Chunk(11.2, 11025)], 12.0),
    )
    detail = underrun_detail([on_time, late], started=0.0)
    assert len(detail) == 1
    assert detail[0]["sent_s"] == 10.2 and detail[0]["streams_in_flight"] == 1
    assert detail[0]["late"] == [{"chunk": 1, "late_ms": 300.0, "at_s": 0.8}]


class BlockingSystem:
    """Streams one chunk, blocking the event loop for 0.2 s the first time (as a thread that
    holds the interpreter would)."""

    def __init__(self) -> None:
        self.calls = 0

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        self.calls += 1
        if self.calls == 1:
            time.sleep(0.2)
        await asyncio.sleep(0.05)
        yield (2205, 22050)

    async def close(self) -> None:
        return None


def test_a_stall_of_the_listeners_loop_is_recorded() -> None:
    stalls: list[tuple[float, float]] = []
    records = listen_for(BlockingSystem(), 1.0, stalls=stalls)
    assert records, "the listener sent nothing"
    assert len(stalls) == 1, stalls
    assert 0.15 < stalls[0][1] < 0.5


class Target:
    """What `drive_phases` drives: it records the phases it was given."""

    def __init__(self) -> None:
        self.phases: list[tuple[str, int]] = []
        self.finished: float | None = None

    def phase(self, name: str, concurrency: int) -> None:
        self.phases.append((name, concurrency))

    def check(self) -> None:
        return None

    def finish(self, drain_s: float) -> None:
        self.finished = drain_s


def test_phases_read_their_load_after_their_before_and_the_last_ends_early() -> None:
    now = [0.0]
    level = {"steady": 2}
    target, started = Target(), []
    phases = [
        Phase("measure", 4, 10.0),
        Phase("steady", lambda: level["steady"], 10.0, before=lambda: level.update(steady=3)),
        Phase("down", 1, 100.0),
    ]
    drive_phases(
        target,
        phases,
        until=lambda: now[0] >= 30.0,
        started=lambda name, at, n: started.append((name, at)),
        drain_s=5.0,
        clock=lambda: now[0],
        sleep=lambda s: now.__setitem__(0, now[0] + s),
    )
    assert target.phases == [("measure", 4), ("steady", 3), ("down", 1)]
    assert [name for name, _ in started] == ["measure", "steady", "down"]
    assert started[2][1] == 20.0 and now[0] == 30.0  # `until` ended the last phase at 30 s
    assert target.finished == 5.0


class PacedSystem:
    """Three chunks 50 ms apart, from a pod it was given (none: no stream)."""

    def __init__(self, voice: str, pods: Pods) -> None:
        self.pods = pods

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        if not self.pods():
            raise BenchSystemError("no endpoints", "UNAVAILABLE")
        for _ in range(3):
            await asyncio.sleep(0.05)
            yield (1102, 22050)

    async def close(self) -> None:
        return None


def paced_spec() -> ListenerSpec:
    return ListenerSpec("per-listener", "joe", 0.2, PacedSystem, numbered)


def test_the_listeners_keep_time_in_their_own_process_while_the_harness_is_busy() -> None:
    records: list[TimedRecord] = []
    with ListenerProcess(paced_spec(), lambda: ["10.0.0.1:8001"], records) as listeners:
        assert listeners.priority in ("SCHED_RR 1", "nice -10"), listeners.priority
        if listeners.priority.startswith("SCHED_RR"):
            assert listeners.pid is not None
            assert os.sched_getscheduler(listeners.pid) == os.SCHED_RR
        listeners.phase("busy", 4)
        until, held = time.monotonic() + 1.5, []
        while time.monotonic() < until:
            data = [random.random() for _ in range(1_000_000)]
            begun = time.monotonic()
            data.sort()  # holds this process's interpreter lock throughout
            held.append(time.monotonic() - begun)
        listeners.finish(2.0)
        pid = listeners.pid
    assert max(held) > 0.1, "the harness never held its interpreter long enough to tell"
    admitted = [r for r in records if r.record.chunks]
    assert len(admitted) >= 8 and {r.phase for r in admitted} == {"busy"}
    assert all(r.record.error is None for r in admitted)
    # A listener in this process would have waited as long as each sort: these did not.
    assert max((late for _, late in listeners.stalls), default=0.0) < max(held) / 2
    gaps = [
        b.arrival_s - a.arrival_s for r in admitted for a, b in itertools.pairwise(r.record.chunks)
    ]
    assert max(gaps) < 0.05 + max(held) / 2
    assert pid is not None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped when the run left it


def test_a_listeners_process_that_dies_is_reported() -> None:
    with ListenerProcess(paced_spec(), lambda: ["10.0.0.1:8001"], []) as listeners:
        listeners.phase("x", 1)
        assert listeners.pid is not None
        os.kill(listeners.pid, signal.SIGKILL)
        with pytest.raises(RuntimeError, match="listeners' process failed: it exited with -9"):
            for _ in range(50):
                listeners.check()
                time.sleep(0.1)


def hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)


def test_the_witness_says_where_a_stalled_loop_was() -> None:
    async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        witness = LoopWitness(threading.get_ident()).start()

        async def ticking() -> None:  # beats as the stall watch does
            while True:
                witness.beat()
                await asyncio.sleep(0.01)

        task = asyncio.ensure_future(ticking())
        await asyncio.sleep(0.3)
        quiet = dict(witness.seen)
        hold_the_loop(0.4)
        await asyncio.sleep(0.05)
        task.cancel()
        witness.stop()
        return quiet, witness.report()

    quiet, report = asyncio.run(run())
    assert quiet == {}, "a loop that kept its tick was noted"
    assert "hold_the_loop" in report[0]["where"], report
    assert 300 < report[0]["longest_behind_ms"] < 600
