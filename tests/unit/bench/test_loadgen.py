"""The closed loop: N streams at a time, each next request only after the previous ended."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest

from engines.bench.loadgen import run_closed_loop
from engines.text.corpus import cycle_sentences


class FakeServer:
    """Streams three chunks per request with fixed delays; counts streams open at once."""

    def __init__(self, chunk_delay_s: float = 0.01, fail_on: str | None = None) -> None:
        self.chunk_delay_s = chunk_delay_s
        self.fail_on = fail_on
        self.open = 0
        self.most_open = 0
        self.texts: list[str] = []

    async def stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        self.texts.append(text)
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            for _ in range(3):
                await asyncio.sleep(self.chunk_delay_s)
                if text == self.fail_on:
                    raise ConnectionError("stream reset")
                yield 220, 22050
        finally:
            self.open -= 1


async def test_holds_exactly_n_streams_open_and_sends_the_corpus_in_order() -> None:
    server = FakeServer()
    result = await run_closed_loop(
        server.stream, cycle_sentences(["a", "b", "c"]), concurrency=4, duration_s=0.3, ramp_s=0.0
    )
    assert server.most_open == 4
    assert len(result.records) >= 4 * 5  # 30 ms a stream, 300 ms: about 10 rounds each
    assert server.texts[:6] == ["a", "b", "c", "a", "b", "c"]
    assert all(r.error is None and len(r.chunks) == 3 for r in result.records)
    assert all(r.sample_rate == 22050 for r in result.records)
    # Closed loop: nothing starts after the duration, and the run ends when the last stream does.
    last_start = max(r.sent_s for r in result.records)
    first_start = min(r.sent_s for r in result.records)
    assert last_start - first_start < 0.3
    assert result.wall_s == pytest.approx(
        max(r.ended_s or 0 for r in result.records) - first_start, abs=0.02
    )


async def test_a_failed_request_is_recorded_and_the_worker_goes_on() -> None:
    server = FakeServer(fail_on="bad")
    result = await run_closed_loop(
        server.stream, cycle_sentences(["good", "bad"]), concurrency=1, duration_s=0.15, ramp_s=0.0
    )
    failed = [r for r in result.records if r.error]
    assert failed and all(r.text == "bad" and "stream reset" in r.error for r in failed)
    assert any(r.text == "good" and r.error is None for r in result.records)


async def test_a_worker_backs_off_a_failing_service_instead_of_hammering_it() -> None:
    # Every request fails at once (a service that is down): without a back-off, the worker
    # would ask again thousands of times a second.
    server = FakeServer(chunk_delay_s=0.0, fail_on="down")
    result = await run_closed_loop(
        server.stream,
        cycle_sentences(["down"]),
        concurrency=1,
        duration_s=0.5,
        ramp_s=0.0,
        retry_after_s=0.05,
    )
    # Pauses of 0.05, 0.1 and 0.2 s fit in 0.5 s: four attempts.
    assert 3 <= len(result.records) <= 5
    assert all(r.error and "stream reset" in r.error for r in result.records)
    starts = [r.sent_s for r in result.records]
    gaps = [later - earlier for earlier, later in itertools.pairwise(starts)]
    assert gaps[0] >= 0.05
    assert all(b > 1.5 * a for a, b in itertools.pairwise(gaps)), gaps


async def test_streams_still_open_after_the_drain_are_cut_off_as_errors() -> None:
    server = FakeServer(chunk_delay_s=1.0)
    result = await run_closed_loop(
        server.stream,
        cycle_sentences(["slow"]),
        concurrency=2,
        duration_s=0.05,
        drain_s=0.1,
        ramp_s=0.0,
    )
    assert len(result.records) == 2
    assert all(r.error and "cut off" in r.error for r in result.records)
    assert server.open == 0  # the cut-off streams were closed, not leaked


async def test_bad_settings_are_refused() -> None:
    server = FakeServer()
    with pytest.raises(ValueError, match="concurrency"):
        await run_closed_loop(server.stream, cycle_sentences(["a"]), 0, 1.0)
    with pytest.raises(ValueError, match="duration"):
        await run_closed_loop(server.stream, cycle_sentences(["a"]), 1, 0.0)
