"""What the load step counts: refusals apart from failures, a refused listener asking again for
the same sentence, streams cut by a scale-in, and the load levels from a pod's measure."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from engines.bench.systems import BenchSystemError
from engines.bench.timeline import Chunk, StreamRecord
from lab.autoscale.load import Clients, Phase, TimedRecord, run_phases
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


def test_a_refused_listener_asks_again_for_the_same_sentence_and_failures_end_when_they_fail(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = itertools.count(start=0.0, step=0.5)
    system = FakeSystem()
    clients = Clients("shared", lambda: lambda: [], "joe")
    monkeypatch.setattr(clients, "for_listener", lambda index: system)
    records: list[TimedRecord] = []
    sentences = iter(f"Sentence {n}." for n in range(1000))

    async def run() -> Any:
        await run_phases(
            clients, sentences, [Phase("x", 1, 2.0)], records, clock=lambda: next(clock),
            drain_s=1.0,
        )  # fmt: skip

    asyncio.run(run())
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


def test_a_stall_of_the_listeners_loop_is_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    clients = Clients("shared", lambda: lambda: [], "joe")
    monkeypatch.setattr(clients, "for_listener", lambda index: BlockingSystem())
    records: list[TimedRecord] = []
    stalls: list[tuple[float, float]] = []
    sentences = iter(f"Sentence {n}." for n in range(1000))

    async def run() -> None:
        await run_phases(
            clients, sentences, [Phase("x", 1, 1.0)], records, drain_s=1.0, stalls=stalls
        )

    asyncio.run(run())
    assert records, "the listener sent nothing"
    assert len(stalls) == 1, stalls
    assert 0.15 < stalls[0][1] < 0.5
