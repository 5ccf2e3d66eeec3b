"""A level's listeners split over client processes: the same arrivals, texts and records as one
process would give, and a failing client process named instead of a hung benchmark."""

from __future__ import annotations

import asyncio
import io
import multiprocessing
import time
from collections.abc import AsyncIterator

import pytest

from engines.bench.clients import ClientProcessError, ClientProcesses, plan_shares
from engines.bench.loadgen import ramp_seconds
from engines.bench.runner import SweepSettings, run_sweep

SENTENCES = [f"Sentence number {n}." for n in range(40)]


class SpawnableSystem:
    """Three chunks per stream, `chunk_s` apart; made again in each client process from
    `client_spec()` (this module is imported there), where it refuses to connect if
    `refuse_in_clients`."""

    streaming = True

    def __init__(
        self,
        name: str,
        chunk_s: float = 0.02,
        refuse_in_clients: bool = False,
        busy_s: float = 0.0,
    ) -> None:
        self.name = name
        self.chunk_s = chunk_s
        self.refuse_in_clients = refuse_in_clients
        self.busy_s = busy_s  # CPU each chunk costs the client (parsing, in a real one)

    def client_spec(self) -> tuple[type[SpawnableSystem], dict[str, object]]:
        return type(self), {
            "name": self.name,
            "chunk_s": self.chunk_s,
            "refuse_in_clients": self.refuse_in_clients,
            "busy_s": self.busy_s,
        }

    async def prepare(self, concurrency: int) -> None:
        in_client = multiprocessing.current_process().name.startswith("voxfleet-bench-client")
        if self.refuse_in_clients and in_client:
            raise ConnectionRefusedError("no server at localhost:1")

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        for _ in range(3):
            await asyncio.sleep(self.chunk_s)
            until = time.process_time() + self.busy_s
            while time.process_time() < until:
                pass
            yield 441, 22050

    def server(self) -> None:
        return None

    async def batch_counts(self) -> dict[str, dict[int, int]]:
        return {}

    async def close(self) -> None:
        return None


@pytest.mark.parametrize("concurrency,processes", [(12, 4), (10, 3), (3, 8)])
def test_shares_start_their_listeners_when_one_process_would_and_stop_with_the_level(
    concurrency: int, processes: int
) -> None:
    duration = 5.0
    shares = plan_shares(processes, concurrency, duration, drain_s=30.0, retry_after_s=0.1)
    assert len(shares) == min(processes, concurrency)
    assert sum(share.concurrency for share in shares) == concurrency
    starts = sorted(
        share.delay_s + share.ramp_s * j / share.concurrency
        for share in shares
        for j in range(share.concurrency)
    )
    ramp = ramp_seconds(duration)
    assert starts == pytest.approx([ramp * g / concurrency for g in range(concurrency)])
    for share in shares:
        assert share.delay_s + share.duration_s == pytest.approx(duration)


def test_shares_spread_their_starts_over_the_ramp_asked_for() -> None:
    shares = plan_shares(4, 2000, 10.0, drain_s=30.0, retry_after_s=0.1, ramp_s=3.0)
    starts = sorted(
        share.delay_s + share.ramp_s * j / share.concurrency
        for share in shares
        for j in range(share.concurrency)
    )
    assert starts == pytest.approx([3.0 * g / 2000 for g in range(2000)])
    assert max(starts) > 2.9, "the last listener starts near the end of the 3 s ramp"


def test_client_processes_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="client processes must be at least 1, got 0"):
        plan_shares(0, 10, 5.0, 30.0, 0.1)


async def test_a_level_over_client_processes_records_every_listeners_streams() -> None:
    settings = SweepSettings(concurrencies=[6], duration_s=1.0, drain_s=5.0, client_processes=3)
    # Each chunk costs its client process 3 ms of CPU: about 0.25 s each over the level.
    system = SpawnableSystem("voxfleet", busy_s=0.003)
    runs = await run_sweep([system], SENTENCES, settings, log=io.StringIO())
    (run,) = runs
    assert run.errors == 0
    assert run.client["processes"] == 3
    # Six listeners for a second, each stream 60 ms: about a hundred streams, from all three
    # (fewer on a busy machine, never more).
    assert 20 <= run.streams <= 110
    assert run.chunks == 3 * run.streams
    assert set(run.client["loop_lag_ms"]) == {"p50", "p95", "max", "max_at_s"}
    assert 0.0 <= run.client["loop_lag_ms"]["max_at_s"] < 6.0  # within the level and drain
    assert set(run.client["gc_pause_ms"]) == {"count", "total", "max"}
    # The load generator's CPU is the client processes' too, not only this coordinating one's.
    assert run.client["cpu_percent"] > 20  # about 70; this process alone uses about 1


async def test_the_first_sentences_of_a_level_are_the_corpus_order_over_the_processes() -> None:
    # Streams of 150 ms: every listener's first starts (within the 100 ms ramp) before any
    # listener's second.
    shares = plan_shares(3, 6, 1.0, 5.0, 0.1)
    system = SpawnableSystem("voxfleet", chunk_s=0.05)
    clients = ClientProcesses(system.client_spec(), shares, SENTENCES)
    await clients.start()
    try:
        result, _, _ = await clients.run()
    finally:
        await clients.close()
    first = sorted(result.records, key=lambda record: record.sent_s)[:6]
    assert sorted(record.text for record in first) == sorted(SENTENCES[:6])


async def test_a_client_process_that_cannot_connect_is_named_with_its_error() -> None:
    settings = SweepSettings(concurrencies=[4], duration_s=1.0, drain_s=5.0, client_processes=2)
    with pytest.raises(ClientProcessError, match="client process 0: ConnectionRefusedError"):
        await run_sweep(
            [SpawnableSystem("voxfleet", refuse_in_clients=True)],
            SENTENCES,
            settings,
            log=io.StringIO(),
        )


async def test_a_system_without_a_client_spec_runs_in_this_process() -> None:
    class InProcess(SpawnableSystem):
        client_spec = None  # type: ignore[assignment]

    settings = SweepSettings(concurrencies=[4], duration_s=0.5, drain_s=5.0, client_processes=4)
    (run,) = await run_sweep([InProcess("piper")], SENTENCES, settings, log=io.StringIO())
    assert run.client["processes"] == 1 and run.streams > 0
