"""A load step: `voxfleet bench`'s closed-loop streams, with a concurrency that changes in phases.

Each worker is a listener: it holds one stream at a time and asks for its next sentence when
the previous stream ends, as `voxfleet bench` does; worker `i` is active while the current
phase's concurrency is above `i`. Listeners reach the voice's pods through the bench's
balanced system (`engines.bench.systems.BalancedTritonSystem`): long-lived connections, one
per pod, a pod picked per stream by the fewest streams in flight, the pods listed by the
voice's headless Service (looked up again every 2 s, as DNS would be), and a stream a full pod
refuses sent to another pod. Two client layouts (`LAYOUTS`):

- `per-listener`: every listener holds its own client and connections, as the benchmark's
  client processes and voice-agent workers each do (`voxfleet bench --client-processes N`);
- `shared`: one client and one connection per pod for every listener, as one process serving
  many listeners does.

A stream every pod refused (RESOURCE_EXHAUSTED) is a refusal, not a failure: the listener waits
`RETRY_AFTER_S` and asks again for the same sentence, and the record of its admitted stream
keeps when it first asked (`asked_s`), so that its wait counts the refusals. Other failures end
the stream when the error arrives; the worker backs off and moves on. Timelines are the
benchmark's `StreamRecord`s, so first audio and underruns are counted as in the benchmark.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from engines.bench.stats import is_refusal
from engines.bench.systems import BalancedTritonSystem
from engines.bench.timeline import Chunk, StreamRecord

Clock = Callable[[], float]
Pods = Callable[[], Sequence[str]]
# How long a listener waits after a refused or failed stream before it asks again.
RETRY_AFTER_S = 0.2
# The listeners' event loop is watched every STALL_TICK_S; a wake-up more than STALL_S late is
# a stall (`run_phases`): a listener's second chunk is due 186 ms after its first.
STALL_TICK_S = 0.01
STALL_S = 0.03
LAYOUTS = ("per-listener", "shared")


@dataclass(frozen=True)
class Phase:
    """`concurrency` listeners for `seconds`; a callable concurrency is read when the phase
    starts (after `before`, which may change the world first, e.g. apply a manifest)."""

    name: str
    concurrency: int | Callable[[], int]
    seconds: float
    before: Callable[[], None] | None = None


@dataclass
class TimedRecord:
    """A benchmark stream record, the phase it was sent in, and when its listener first asked
    for that sentence (before any refusal)."""

    phase: str
    record: StreamRecord
    asked_s: float = 0.0

    @property
    def refused(self) -> bool:
        return is_refusal(self.record.error)


@dataclass
class Clients:
    """The listeners' clients: one for all (`shared`) or one per listener."""

    layout: str
    pods: Callable[[], Pods]  # a fresh endpoint source (its own lookups) per client
    voice: str
    made: list[BalancedTritonSystem] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout is one of {', '.join(LAYOUTS)}, not {self.layout!r}")

    def _make(self) -> BalancedTritonSystem:
        system = BalancedTritonSystem("voxfleet-pods", "", self.voice, pods=self.pods())
        self.made.append(system)
        return system

    def for_listener(self, index: int) -> BalancedTritonSystem:
        if self.layout == "shared":
            return self.made[0] if self.made else self._make()
        while len(self.made) <= index:
            self._make()
        return self.made[index]

    def counts(self) -> dict[str, dict[str, int]]:
        """Streams started, refusals and failures per pod, over every client so far."""
        out: dict[str, dict[str, int]] = {}
        for system in list(self.made):
            for endpoint, counts in system.balancer.counts().items():
                entry = out.setdefault(endpoint, {"streams": 0, "refusals": 0, "failures": 0})
                entry["streams"] += counts.streams
                entry["refusals"] += counts.refusals
                entry["failures"] += counts.failures
        return out

    @property
    def refused_streams(self) -> int:
        return sum(system.balancer.refused_streams for system in list(self.made))

    async def close(self) -> None:
        for system in self.made:
            await system.close()


async def run_phases(
    clients: Clients,
    sentences: Iterator[str],
    phases: Sequence[Phase],
    records: list[TimedRecord],
    clock: Clock = time.monotonic,
    until: Callable[[], bool] | None = None,
    drain_s: float = 60.0,
    started: Callable[[str, float, int], None] | None = None,
    stalls: list[tuple[float, float]] | None = None,
) -> None:
    """Run the phases in order; the last one also ends early once `until()` is true.

    Records are appended to `records` as streams start, so a sampler can read them live;
    `started(name, time, concurrency)` is called as each phase begins. `stalls`, where given,
    gets (when it ended, seconds) for every time the listeners' event loop woke more than
    STALL_S late: a chunk that arrives meanwhile is stamped late, by the client, not the pod."""
    current: dict[str, Any] = {"phase": phases[0].name, "concurrency": 0}
    stop = asyncio.Event()

    async def watch_loop() -> None:
        assert stalls is not None
        while not stop.is_set():
            before = clock()
            await asyncio.sleep(STALL_TICK_S)
            late = clock() - before - STALL_TICK_S
            if late > STALL_S:
                stalls.append((clock(), late))

    async def worker(index: int) -> None:
        await asyncio.sleep(0.2 * index)
        system = clients.for_listener(index)
        text, asked = next(sentences), None
        while not stop.is_set():
            if index >= current["concurrency"]:
                await asyncio.sleep(0.2)
                continue
            now = clock()
            record = StreamRecord(text=text, sent_s=now)
            item = TimedRecord(str(current["phase"]), record, asked if asked is not None else now)
            records.append(item)
            try:
                async for samples, rate in system.open_stream(record.text):
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
            if item.refused:
                asked = item.asked_s  # the same listener asks again for the same sentence
            else:
                text, asked = next(sentences), None
            if record.error is not None:
                await asyncio.sleep(RETRY_AFTER_S)

    workers: list[asyncio.Future[None]] = []
    watcher = asyncio.ensure_future(watch_loop()) if stalls is not None else None
    try:
        for index, phase in enumerate(phases):
            if phase.before is not None:
                await asyncio.to_thread(phase.before)
            concurrency = phase.concurrency() if callable(phase.concurrency) else phase.concurrency
            current["phase"], current["concurrency"] = phase.name, concurrency
            while len(workers) < concurrency:
                workers.append(asyncio.ensure_future(worker(len(workers))))
            begun = clock()
            if started is not None:
                started(phase.name, begun, concurrency)
            last = index == len(phases) - 1
            while clock() < begun + phase.seconds:
                if last and until is not None and until():
                    break
                await asyncio.sleep(0.5)
        stop.set()
        current["concurrency"] = 0
        if workers:
            await asyncio.wait(workers, timeout=drain_s)
    finally:
        stop.set()
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        if watcher is not None:
            await asyncio.gather(watcher, return_exceptions=True)
