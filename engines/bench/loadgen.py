"""The closed-loop load generator.

N workers each hold one stream open at a time and send their next sentence as soon as the
previous stream ends. No worker starts a stream after the run's duration; streams still open
then are allowed `drain_s` more to finish, and are cut off (recorded as errors) after that.
Worker starts are spread over a short ramp so that N requests do not all land in the same
millisecond, which no real population of listeners does. With `retry_after_s`, a worker whose
request failed waits before its next one, twice as long after each failure in a row (up to
`MAX_RETRY_AFTER_S`), as a real client backs off a failing service; without it, it asks again
at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from engines.bench.resources import GcPauses, LoopLag
from engines.bench.timeline import Chunk, StreamRecord

# A system under test: text in, (samples, sample_rate) per audio chunk out, as they arrive.
StreamOpener = Callable[[str], AsyncIterator[tuple[int, int]]]
MAX_RETRY_AFTER_S = 2.0
# The error of a stream still open when the drain ran out.
CUT_OFF = "cut off: still streaming when the drain time ran out"


def ramp_seconds(duration_s: float, asked_s: float | None = None) -> float:
    """Over how long a level's workers start: `asked_s`, or by default a tenth of its
    duration, at most a second."""
    return min(1.0, duration_s / 10) if asked_s is None else asked_s


@dataclass(frozen=True)
class LoadResult:
    records: list[StreamRecord]
    wall_s: float


async def _stream_into(
    record: StreamRecord, open_stream: StreamOpener, clock: Callable[[], float]
) -> None:
    try:
        async for samples, sample_rate in open_stream(record.text):
            record.chunks.append(Chunk(clock(), samples))
            if sample_rate:
                record.sample_rate = sample_rate
        record.ended_s = clock()
    except asyncio.CancelledError:
        record.error = CUT_OFF
        raise
    except Exception as error:  # a failed request is a result, not a crash of the benchmark
        record.error = f"{type(error).__name__}: {error}"


async def run_closed_loop(
    open_stream: StreamOpener,
    sentences: Iterator[str],
    concurrency: int,
    duration_s: float,
    drain_s: float = 30.0,
    ramp_s: float | None = None,
    clock: Callable[[], float] = time.perf_counter,
    retry_after_s: float = 0.0,
) -> LoadResult:
    """Run `concurrency` closed-loop workers for `duration_s` seconds."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    if duration_s <= 0:
        raise ValueError(f"duration must be positive, got {duration_s} s")
    ramp = ramp_seconds(duration_s, ramp_s)
    records: list[StreamRecord] = []
    start = clock()
    deadline = start + duration_s

    async def worker(index: int) -> None:
        await asyncio.sleep(ramp * index / concurrency)
        pause = retry_after_s
        while clock() < deadline:
            text = next(sentences)
            record = StreamRecord(text=text, sent_s=clock())
            records.append(record)
            await _stream_into(record, open_stream, clock)
            if record.error is None:
                pause = retry_after_s
            elif pause > 0:
                await asyncio.sleep(min(pause, max(0.0, deadline - clock())))
                pause = min(2 * pause, MAX_RETRY_AFTER_S)

    workers = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
    done, pending = await asyncio.wait(workers, timeout=duration_s + drain_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    ends = [r.ended_s for r in records if r.ended_s is not None]
    wall = (max(ends) if ends else clock()) - start
    return LoadResult(records, wall)


async def run_closed_loop_watched(
    open_stream: StreamOpener,
    sentences: Iterator[str],
    concurrency: int,
    duration_s: float,
    drain_s: float,
    ramp_s: float | None,
    retry_after_s: float,
) -> tuple[LoadResult, dict[str, float], dict[str, float]]:
    """`run_closed_loop`, with how late this event loop woke up during it (`LoopLag`) and its
    process's garbage collections (`GcPauses`): every chunk is stamped on this loop."""
    lag, pauses = LoopLag(), GcPauses()
    lag.start()
    pauses.start()
    result = await run_closed_loop(
        open_stream,
        sentences,
        concurrency,
        duration_s,
        drain_s,
        ramp_s=ramp_s,
        retry_after_s=retry_after_s,
    )
    return result, await lag.stop(), pauses.stop()
