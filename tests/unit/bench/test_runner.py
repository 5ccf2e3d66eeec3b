"""The sweep: same sentences for every run, saturated systems stop climbing."""

from __future__ import annotations

import asyncio
import gc
import io
import time
from collections.abc import AsyncIterator

from engines.bench.runner import SweepSettings, queue_delta, run_sweep


class FakeSystem:
    """Answers in one chunk after `delay_s` per open stream (a saturating server)."""

    streaming = False

    def __init__(self, name: str, delay_s: float) -> None:
        self.name = name
        self.delay_s = delay_s
        self.open = 0
        self.texts_per_run: list[list[str]] = []
        self.prepared: list[int] = []

    async def prepare(self, concurrency: int) -> None:
        self.prepared.append(concurrency)
        self.texts_per_run.append([])

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        self.texts_per_run[-1].append(text)
        self.open += 1
        try:
            await asyncio.sleep(self.delay_s * self.open)
            yield 22050, 22050
        finally:
            self.open -= 1

    def server(self) -> None:
        return None

    async def batch_counts(self) -> dict[str, dict[int, int]]:
        return {}

    async def close(self) -> None:
        return None


async def test_saturated_system_is_skipped_at_higher_levels_and_text_order_restarts() -> None:
    fast, slow = FakeSystem("voxfleet", 0.001), FakeSystem("piper", 0.03)
    settings = SweepSettings([1, 2, 4], duration_s=0.15, skip_after_p95_ms=50)
    runs = await run_sweep([slow, fast], ["one", "two", "three"], settings, log=io.StringIO())
    by_key = {(run.system, run.concurrency): run for run in runs}
    assert fast.prepared == [1, 2, 4]
    assert slow.prepared == [1, 2]  # p95 at 2 streams ≈ 60 ms > 50 ms: saturated
    assert by_key[("piper", 4)].skipped and "saturated at concurrency 2" in str(
        by_key[("piper", 4)].skipped
    )
    assert by_key[("voxfleet", 4)].skipped is None and by_key[("voxfleet", 4)].streams > 0
    # After the warm-up sentence, each run begins at the top of the same order.
    for system in (slow, fast):
        for texts in system.texts_per_run:
            measured = [text for text in texts if text in {"one", "two", "three"}]
            assert measured[:2] == ["one", "two"]


class StampingSystem(FakeSystem):
    """Each stream takes `delay_s`; when every measured stream was opened is kept."""

    def __init__(self, delay_s: float) -> None:
        super().__init__("voxfleet", delay_s)
        self.opened: list[float] = []

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        if text != WARM_UP:
            self.opened.append(time.perf_counter())
        await asyncio.sleep(self.delay_s)
        yield 22050, 22050


WARM_UP = "Warming up before the measured runs."


async def test_a_levels_listeners_start_over_the_ramp_asked_for() -> None:
    quick, slow = StampingSystem(0.5), StampingSystem(0.5)
    await run_sweep([quick], ["one"], SweepSettings([4], duration_s=0.8), log=io.StringIO())
    await run_sweep(
        [slow], ["one"], SweepSettings([4], duration_s=0.8, ramp_s=0.6), log=io.StringIO()
    )
    # Each listener's first stream: 4 of them, started over the ramp (the default for 0.8 s
    # of load is 0.08 s); the next ones come 0.5 s later.
    first_quick, first_slow = sorted(quick.opened)[:4], sorted(slow.opened)[:4]
    assert first_quick[-1] - first_quick[0] < 0.2
    assert 0.4 < first_slow[-1] - first_slow[0] < 0.6


class BlockingSystem(FakeSystem):
    """A system whose streams block the benchmark's own event loop for `block_s` once each,
    as a load generator too busy to read its chunks would."""

    def __init__(self, block_s: float) -> None:
        super().__init__("voxfleet", 0.001)
        self.block_s = block_s

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        time.sleep(self.block_s)  # on the loop's thread: nothing else runs meanwhile
        async for chunk in super().open_stream(text):
            yield chunk


async def test_a_run_reports_how_late_the_load_generators_own_loop_was() -> None:
    """Chunks are timestamped on the benchmark's event loop: a run says how late that loop
    ran, so a first-audio figure inflated by a busy client is told from the server's."""
    settings = SweepSettings([1], duration_s=0.3)
    log = io.StringIO()
    (quiet,) = await run_sweep([FakeSystem("voxfleet", 0.001)], ["one"], settings, log=log)
    (busy,) = await run_sweep([BlockingSystem(0.12)], ["one"], settings, log=io.StringIO())
    assert set(quiet.client["loop_lag_ms"]) == {"p50", "p95", "max", "max_at_s"}
    assert busy.client["loop_lag_ms"]["max"] >= 100.0
    assert quiet.client["loop_lag_ms"]["max"] < busy.client["loop_lag_ms"]["max"]
    # The stall is placed in the level: its streams block the loop while the load runs.
    assert 0.0 <= busy.client["loop_lag_ms"]["max_at_s"] < busy.wall_seconds
    assert "client loop lag p95" in log.getvalue()


class CollectingSystem(FakeSystem):
    """A system whose streams leave the benchmark a large heap to collect, as a load
    generator holding many objects would: each stream starts with a full collection."""

    def __init__(self) -> None:
        super().__init__("voxfleet", 0.001)
        self.heap: list[object] = []

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        if not self.heap:
            self.heap = [[index] for index in range(500_000)]
        gc.collect()
        async for chunk in super().open_stream(text):
            yield chunk


async def test_a_run_reports_the_load_generators_garbage_collections() -> None:
    """A collection stops the benchmark's event loop: a run says how many ran and the
    longest, so a loop stall can be told apart from a late server."""
    settings = SweepSettings([1], duration_s=0.3)
    callbacks = list(gc.callbacks)
    (collecting,) = await run_sweep([CollectingSystem()], ["one"], settings, log=io.StringIO())
    pauses = collecting.client["gc_pause_ms"]
    assert set(pauses) == {"count", "total", "max"}
    assert pauses["count"] >= 1 and pauses["total"] >= pauses["max"] > 1.0
    assert gc.callbacks == callbacks  # nothing of the run's is left listening


def test_the_triton_queue_figure_is_the_mean_wait_of_the_runs_own_requests() -> None:
    before = {"joe": (10, 50_000_000), "idle": (3, 9_000_000)}
    after = {"joe": (30, 250_000_000), "idle": (3, 9_000_000), "new": (2, 4_000_000)}
    # 20 requests waited 200 ms in all during the run; a model without requests is left out.
    assert queue_delta(before, after) == {"joe": 10.0, "new": 2.0}
