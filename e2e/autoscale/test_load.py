"""What the load step counts as a stream cut by a scale-in, and when a failed stream ended."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from autoscale import load
from autoscale.load import Phase, TimedRecord, run_phases
from autoscale.step import streams_cut
from engines.bench.timeline import Chunk, StreamRecord


def record(sent: float, ended: float | None, error: str | None = None) -> TimedRecord:
    chunks = [Chunk(sent + 0.1, 2205)] if error is None else []
    return TimedRecord("down", StreamRecord("Hello.", sent, 22050, chunks, ended, error))


def test_only_streams_in_flight_at_the_scale_in_count_as_cut() -> None:
    records = [
        record(10.0, 10.2, "UNAVAILABLE: no endpoints yet"),  # failed long before the scale-in
        record(90.0, 101.0, "UNAVAILABLE: connection reset"),  # in flight, failed after it
        record(95.0, None, "cut off: still streaming when the run ended"),
        record(96.0, 104.0),  # finished normally
        record(300.0, 300.5, "UNAVAILABLE"),  # sent after the window
    ]
    cut = streams_cut(records, since=100.0, until=160.0)
    assert [c["sent_s"] for c in cut] == [90.0, 95.0]


def test_a_failed_stream_records_when_it_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = itertools.count(start=0.0, step=0.5)

    async def failing(address: str, voice: str, text: str) -> AsyncIterator[tuple[int, int]]:
        await asyncio.sleep(0)
        raise ConnectionResetError("recvmsg: Connection reset by peer")
        yield (0, 0)  # an async generator that fails before its first chunk

    monkeypatch.setattr(load, "open_stream_through", failing)
    records: list[TimedRecord] = []

    async def run() -> Any:
        await run_phases(
            "127.0.0.1:1", "joe", iter(["Hello."] * 1000), [Phase("x", 1, 1.0)], records,
            clock=lambda: next(clock), drain_s=1.0,
        )  # fmt: skip

    asyncio.run(run())
    assert records, "the worker sent nothing"
    first = records[0].record
    assert first.error is not None and "Connection reset" in first.error
    assert first.ended_s is not None and first.ended_s > first.sent_s
