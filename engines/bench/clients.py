"""The closed loop of one level split over several client processes.

One Python process is the client of every stream of a level: at 2,000 streams it opens 2,000
gRPC streams within the level's ramp (one second by default), over one connection, and stamps
every chunk on one event loop, so that its own work there adds to the first audio it
measures. With `voxfleet bench --client-processes N`, N processes each run the closed loop
(`engines.bench.loadgen`) for their share of the listeners, over a connection of their own,
as a population of real listeners would; the parent merges their records into one level.

- Share k holds listeners k, k + N, k + 2N, ... of the level: its starts are offset within the
  ramp so that the shares together arrive as evenly as one process's listeners, no listener
  starts after the level's duration, and it takes the sentences at the same places of the
  corpus order.
- Chunks are stamped with `time.perf_counter`, which on Linux reads CLOCK_MONOTONIC, one clock
  for every process of the machine, so records of different processes compare directly.
- A share reports its own event loop's lateness and garbage collections; the level reports
  the worst process's loop and every process's collections, so a client that fell behind
  still shows.
- Only systems that say how to reach them from another process (`client_spec()`: the Triton
  systems) are split; piper, which synthesises in the client process itself, always runs in
  the one process.
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from engines.bench.loadgen import LoadResult, ramp_seconds, run_closed_loop_watched
from engines.bench.timeline import StreamRecord
from engines.text.corpus import cycle_sentences

# A client process must be connected and ready this soon after it was started.
READY_TIMEOUT_S = 120.0
# And must report its records this long after the level's duration and drain have passed.
RESULT_GRACE_S = 60.0
# The shares start together this long after the parent says so (every process is waiting).
START_DELAY_S = 0.05


class ClientProcessError(RuntimeError):
    """A client process failed to connect, run its share or report it."""


@dataclass(frozen=True)
class Share:
    """What one client process runs: `concurrency` listeners, from `delay_s` after the level's
    start, spread over `ramp_s`, starting new streams for `duration_s`."""

    index: int
    processes: int
    concurrency: int
    delay_s: float
    ramp_s: float
    duration_s: float
    drain_s: float
    retry_after_s: float


@dataclass
class ShareResult:
    records: list[StreamRecord]
    started: float
    wall_s: float
    loop_lag_ms: dict[str, float]
    gc_pause_ms: dict[str, float]


def plan_shares(
    processes: int,
    concurrency: int,
    duration_s: float,
    drain_s: float,
    retry_after_s: float,
    ramp_s: float | None = None,
) -> list[Share]:
    """The level's listeners dealt to `processes` shares, listener g to share g mod N, their
    starts spread over `ramp_s` (default `loadgen.ramp_seconds`)."""
    if processes < 1:
        raise ValueError(f"client processes must be at least 1, got {processes}")
    processes = min(processes, concurrency)
    ramp = ramp_seconds(duration_s, ramp_s)
    shares = []
    for index in range(processes):
        count = len(range(index, concurrency, processes))
        # Listener g of the level starts at ramp * g / concurrency; this share's j-th is
        # listener index + processes * j.
        delay = ramp * index / concurrency
        shares.append(
            Share(
                index=index,
                processes=processes,
                concurrency=count,
                delay_s=delay,
                ramp_s=ramp * processes * count / concurrency,
                duration_s=duration_s - delay,
                drain_s=drain_s,
                retry_after_s=retry_after_s,
            )
        )
    return shares


def _share_main(
    conn: Connection,
    factory: Callable[..., Any],
    kwargs: dict[str, Any],
    share: Share,
    sentences: Sequence[str],
) -> None:
    """A client process: connect, say ready, run the share when told, report, wait to be let
    go (the parent reads the processes' CPU time before they exit)."""
    try:
        asyncio.run(_run_share(conn, factory(**kwargs), share, sentences))
    except BaseException as error:  # every failure goes back to the parent, named
        try:
            conn.send(("error", f"{type(error).__name__}: {error}"))
        except (OSError, ValueError):
            pass
    finally:
        conn.close()


async def _run_share(conn: Connection, system: Any, share: Share, sentences: Sequence[str]) -> None:
    try:
        await system.prepare(share.concurrency)
        conn.send(("ready", None))
        start_at = await asyncio.to_thread(conn.recv)
        if start_at is None:  # the parent gave up before the level started
            return
        await asyncio.sleep(max(0.0, start_at + share.delay_s - time.perf_counter()))
        started = time.perf_counter()
        order = itertools.islice(cycle_sentences(sentences), share.index, None, share.processes)
        result, loop_lag, gc_pauses = await run_closed_loop_watched(
            system.open_stream,
            order,
            share.concurrency,
            share.duration_s,
            share.drain_s,
            share.ramp_s,
            share.retry_after_s,
        )
        if loop_lag:
            loop_lag["max_at_s"] += share.delay_s  # from the level's start
        report = ShareResult(result.records, started, result.wall_s, loop_lag, gc_pauses)
        conn.send(("done", report))
        await asyncio.to_thread(conn.recv)
    finally:
        await system.close()


class ClientProcesses:
    """One level's closed loop run by several client processes (see the module docstring).

    `start()` starts them and waits until each is connected, `run()` runs the level, `close()`
    lets them go (after the caller has read their CPU time) and ends any left.
    """

    def __init__(
        self,
        spec: tuple[Callable[..., Any], dict[str, Any]],
        shares: list[Share],
        sentences: Sequence[str],
    ) -> None:
        self._factory, self._kwargs = spec
        self.shares = shares
        self._sentences = list(sentences)
        self._processes: list[tuple[Any, Connection]] = []

    @property
    def count(self) -> int:
        return len(self.shares)

    async def start(self) -> None:
        context = multiprocessing.get_context("spawn")  # no half-copied threads or loops
        for share in self.shares:
            parent, child = context.Pipe()
            process = context.Process(
                target=_share_main,
                args=(child, self._factory, self._kwargs, share, self._sentences),
                name=f"voxfleet-bench-client-{share.index}",
                daemon=True,
            )
            process.start()
            child.close()
            self._processes.append((process, parent))
        for index, (_, conn) in enumerate(self._processes):
            await self._expect(index, conn, "ready", READY_TIMEOUT_S)

    async def run(self) -> tuple[LoadResult, dict[str, float], dict[str, float]]:
        """The merged records, the worst process's loop lateness and all their collections."""
        start_at = time.perf_counter() + START_DELAY_S
        for _, conn in self._processes:
            conn.send(start_at)
        limit = max(share.duration_s + share.delay_s for share in self.shares)
        limit += self.shares[0].drain_s + RESULT_GRACE_S
        results: list[ShareResult] = [
            await self._expect(index, conn, "done", limit)
            for index, (_, conn) in enumerate(self._processes)
        ]
        records = [record for result in results for record in result.records]
        began = min(result.started for result in results)
        wall = max(result.started + result.wall_s for result in results) - began
        return LoadResult(records, wall), worst_loop_lag(results), all_gc_pauses(results)

    async def close(self) -> None:
        for _, conn in self._processes:
            try:
                conn.send(None)
            except (OSError, ValueError):
                pass
        for process, conn in self._processes:
            await asyncio.to_thread(process.join, 10.0)
            if process.is_alive():
                process.terminate()
                await asyncio.to_thread(process.join, 5.0)
            conn.close()
        self._processes = []

    async def _expect(self, index: int, conn: Connection, kind: str, timeout_s: float) -> Any:
        process = self._processes[index][0]
        if not await asyncio.to_thread(conn.poll, timeout_s):
            raise ClientProcessError(
                f"client process {index} sent no {kind!r} within {timeout_s:.0f} s"
            )
        try:
            got, value = conn.recv()
        except EOFError:
            await asyncio.to_thread(process.join, 5.0)
            raise ClientProcessError(
                f"client process {index} ended (exit code {process.exitcode}) before {kind!r}"
            ) from None
        if got == "error":
            raise ClientProcessError(f"client process {index}: {value}")
        return value


def worst_loop_lag(results: Sequence[ShareResult]) -> dict[str, float]:
    """The loop lateness of the process that was latest: the largest p50, p95 and max (with
    the max's time) over the processes."""
    lags = [result.loop_lag_ms for result in results if result.loop_lag_ms]
    if not lags:
        return {}
    worst = max(lags, key=lambda lag: lag["max"])
    return {
        "p50": max(lag["p50"] for lag in lags),
        "p95": max(lag["p95"] for lag in lags),
        "max": worst["max"],
        "max_at_s": worst["max_at_s"],
    }


def all_gc_pauses(results: Sequence[ShareResult]) -> dict[str, float]:
    """Every process's collections: their count and total, and the longest."""
    pauses = [result.gc_pause_ms for result in results]
    return {
        "count": sum(p["count"] for p in pauses),
        "total": sum(p["total"] for p in pauses),
        "max": max((p["max"] for p in pauses), default=0.0),
    }
