"""A load step: `voxfleet bench`'s closed-loop streams, with a concurrency that changes in phases.

Each worker holds one stream at a time and sends its next sentence when the previous stream
ends, as `voxfleet bench` does; worker `i` is active while the current phase's concurrency is
above `i`. Every stream opens its own gRPC connection through the voice's Service, as separate
listeners would, so that a pod added by a scale-up receives new streams (one long-lived
connection would stay on the pod it first reached). A failed stream ends when its error
arrives, and its worker backs off `RETRY_AFTER_S` before the next one. Timelines are the
benchmark's `StreamRecord`s, so first audio and underruns are counted as in the benchmark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass

from engines.bench.systems import TritonSystem
from engines.bench.timeline import Chunk, StreamRecord

Clock = Callable[[], float]
# How long a worker waits after a failed stream before its next one.
RETRY_AFTER_S = 0.2


@dataclass(frozen=True)
class Phase:
    name: str
    concurrency: int
    seconds: float


@dataclass
class TimedRecord:
    """A benchmark stream record and the phase it was sent in."""

    phase: str
    record: StreamRecord


async def open_stream_through(
    address: str, voice: str, text: str
) -> AsyncIterator[tuple[int, int]]:
    """One stream on a fresh connection to `address` (a Service's proxy)."""
    system = TritonSystem("voxfleet", address, voice, streaming=True)
    await system.connect()
    try:
        async for chunk in system.open_stream(text):
            yield chunk
    finally:
        await system.close()


async def run_phases(
    address: str,
    voice: str,
    sentences: Iterator[str],
    phases: Sequence[Phase],
    records: list[TimedRecord],
    clock: Clock = time.monotonic,
    until: Callable[[], bool] | None = None,
    drain_s: float = 60.0,
) -> None:
    """Run the phases in order; the last one also ends early once `until()` is true.

    Records are appended to `records` as streams start, so a sampler can read them live.
    """
    most = max(p.concurrency for p in phases)
    current = {"phase": phases[0].name, "concurrency": phases[0].concurrency}
    stop = asyncio.Event()

    async def worker(index: int) -> None:
        await asyncio.sleep(0.2 * index)
        while not stop.is_set():
            if index >= current["concurrency"]:  # type: ignore[operator]
                await asyncio.sleep(0.2)
                continue
            record = StreamRecord(text=next(sentences), sent_s=clock())
            records.append(TimedRecord(str(current["phase"]), record))
            try:
                async for samples, rate in open_stream_through(address, voice, record.text):
                    record.chunks.append(Chunk(clock(), samples))
                    if rate:
                        record.sample_rate = rate
                record.ended_s = clock()
            except asyncio.CancelledError:
                record.error = "cut off: still streaming when the run ended"
                raise
            except Exception as error:  # a failed stream is a result, ended when it failed
                record.error = f"{type(error).__name__}: {error}"
                record.ended_s = clock()
                await asyncio.sleep(RETRY_AFTER_S)  # a listener backing off before it retries

    workers = [asyncio.ensure_future(worker(i)) for i in range(most)]
    try:
        for index, phase in enumerate(phases):
            current["phase"], current["concurrency"] = phase.name, phase.concurrency
            deadline = clock() + phase.seconds
            last = index == len(phases) - 1
            while clock() < deadline:
                if last and until is not None and until():
                    break
                await asyncio.sleep(0.5)
        stop.set()
        current["concurrency"] = 0
        await asyncio.wait(workers, timeout=drain_s)
    finally:
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
