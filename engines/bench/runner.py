"""A sweep: every system at every concurrency, on the same corpus, in one process.

Concurrency is the outer loop and systems the inner one, so that a slow drift of the machine
(other work starting or stopping) touches every system alike instead of one system's whole
curve. A system whose first-audio p95 passed `skip_after_p95_ms` is not run at higher
concurrencies: it is saturated already, and more streams would only take time to say so.
"""

from __future__ import annotations

import math
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

from engines.bench.clients import ClientProcesses, plan_shares
from engines.bench.loadgen import run_closed_loop_watched
from engines.bench.resources import (
    MachineCpuSampler,
    ProcessTree,
    ResourceSampler,
    own_process,
)
from engines.bench.stats import RunSummary, summarise_run
from engines.text.corpus import cycle_sentences

# A listener whose request failed (a service down or refusing) waits this long before its next
# one, doubling with each failure in a row, instead of asking again in a tight loop.
FAILED_REQUEST_RETRY_S = 0.1


class BenchSystem(Protocol):
    name: str
    streaming: bool

    async def prepare(self, concurrency: int) -> None: ...

    def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]: ...

    def server(self) -> ProcessTree | None: ...

    async def batch_counts(self) -> dict[str, dict[int, int]]: ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class SweepSettings:
    concurrencies: Sequence[int]
    duration_s: float
    drain_s: float = 30.0
    skip_after_p95_ms: float = 5000.0
    underrun_tolerance_s: float = 0.0
    profile: tuple[str, int] | None = None  # (system, concurrency) to sample with py-spy
    profile_dir: Path | None = None
    # Client processes that share each level's listeners (engines/bench/clients.py), for the
    # systems that can be reached from another process; 1: the closed loop runs here.
    client_processes: int = 1
    # Over how long a level's listeners start; None: `loadgen.ramp_seconds` of the duration.
    ramp_s: float | None = None


def batching_delta(
    before: dict[str, dict[int, int]], after: dict[str, dict[int, int]]
) -> dict[str, Any]:
    """Executions per batch size during a run, per model, and the mean batch size."""
    models: dict[str, Any] = {}
    for model, sizes in after.items():
        delta = {size: count - before.get(model, {}).get(size, 0) for size, count in sizes.items()}
        delta = {size: count for size, count in sorted(delta.items()) if count > 0}
        if not delta:
            continue
        executions = sum(delta.values())
        models[model] = {
            "executions_by_batch_size": {str(size): count for size, count in delta.items()},
            "executions": executions,
            "mean_batch_size": sum(size * count for size, count in delta.items()) / executions,
            "max_batch_size": max(delta),
        }
    return models


def queue_delta(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, float]:
    """Mean milliseconds a request waited in Triton's queue during a run, per model that took
    requests in it."""
    means: dict[str, float] = {}
    for model, (count, ns) in after.items():
        old_count, old_ns = before.get(model, (0, 0))
        if count > old_count:
            means[model] = (ns - old_ns) / (count - old_count) / 1e6
    return means


async def _queue_totals(system: BenchSystem) -> dict[str, tuple[int, int]]:
    """`queue_totals()` of a system behind Triton; nothing for the others (piper)."""
    totals = getattr(system, "queue_totals", None)
    return await totals() if totals is not None else {}


async def _warm_up(system: BenchSystem, text: str) -> None:
    async for _ in system.open_stream(text):
        pass


async def run_sweep(
    systems: Sequence[BenchSystem],
    sentences: Sequence[str],
    settings: SweepSettings,
    log: TextIO = sys.stderr,
) -> list[RunSummary]:
    runs: list[RunSummary] = []
    saturated: dict[str, int] = {}
    warm: set[str] = set()
    for concurrency in settings.concurrencies:
        for system in systems:
            if system.name in saturated:
                runs.append(
                    _skipped(
                        system.name, concurrency, saturated[system.name], settings.skip_after_p95_ms
                    )
                )
                continue
            await system.prepare(concurrency)
            if system.name not in warm:
                await _warm_up(system, "Warming up before the measured runs.")
                warm.add(system.name)
            run = await _measure(system, concurrency, sentences, settings)
            runs.append(run)
            print(_progress_line(run), file=log, flush=True)
            p95 = run.first_audio_ms["p95"]
            if run.streams == 0 or math.isnan(p95) or p95 > settings.skip_after_p95_ms:
                saturated[system.name] = concurrency
    return runs


async def _measure(
    system: BenchSystem, concurrency: int, sentences: Sequence[str], settings: SweepSettings
) -> RunSummary:
    tree = system.server()
    sampler = ResourceSampler(tree) if tree is not None else None
    clients = _client_processes(system, concurrency, sentences, settings)
    if clients is not None:
        # Started and connected before anything is measured: their start-up is not the level's.
        try:
            await clients.start()
        except BaseException:
            await clients.close()
            raise
    # The load generator shares the machine with the server: its own CPU is part of the story.
    client = ResourceSampler(own_process()) if tree is None or tree != own_process() else None
    before = await system.batch_counts()
    queued = await _queue_totals(system)
    machine = MachineCpuSampler()
    machine.start()
    for each in (sampler, client):
        if each:
            each.start()
    profiler = None
    if settings.profile == (system.name, concurrency) and tree is not None:
        import tempfile

        from engines.bench.profile import Profiler

        work = settings.profile_dir or Path(tempfile.mkdtemp(prefix="voxfleet-profile-"))
        profiler = Profiler(tree, settings.duration_s, work)
        profiler.start()
    # Every run starts at the top of the same sentence order, so that systems and levels are
    # compared on the same text (a faster system simply gets further down the list).
    # The listeners' event loop is this one, or each client process's (which watch their own).
    try:
        if clients is None:
            result, loop_lag, gc_pauses = await run_closed_loop_watched(
                system.open_stream,
                cycle_sentences(sentences),
                concurrency,
                settings.duration_s,
                settings.drain_s,
                settings.ramp_s,
                FAILED_REQUEST_RETRY_S,
            )
        else:
            result, loop_lag, gc_pauses = await clients.run()
        server: dict[str, Any] = dict(sampler.stop()) if sampler else {}
        client_usage: dict[str, Any] = dict(client.stop()) if client else {}
    finally:
        if clients is not None:
            await clients.close()
    client_usage["processes"] = 1 if clients is None else clients.count
    client_usage["loop_lag_ms"], client_usage["gc_pause_ms"] = loop_lag, gc_pauses
    machine_cpu = machine.stop()
    profile = profiler.stop() if profiler else {}
    after = await system.batch_counts()
    queue = queue_delta(queued, await _queue_totals(system))
    run = summarise_run(
        system.name, concurrency, result.records, result.wall_s, settings.underrun_tolerance_s
    )
    run.server = server
    if queue:
        run.server["triton_queue_ms"] = queue
    run.client = client_usage
    run.profile = profile
    run.machine_cpu_percent = machine_cpu
    # What neither the server nor the load generator used: other work on a shared machine.
    own = [usage.get("cpu_percent") for usage in (server, client_usage)]
    run.other_cpu_percent = max(
        0.0, machine_cpu - sum(value for value in own if isinstance(value, float))
    )
    run.batching = batching_delta(before, after)
    return run


def _client_processes(
    system: BenchSystem, concurrency: int, sentences: Sequence[str], settings: SweepSettings
) -> ClientProcesses | None:
    """The level's client processes, where more than one is asked for and the system can be
    reached from another process (`client_spec()`); None: the closed loop runs here."""
    spec = getattr(system, "client_spec", None)
    if settings.client_processes <= 1 or spec is None or concurrency < 2:
        return None
    shares = plan_shares(
        settings.client_processes,
        concurrency,
        settings.duration_s,
        settings.drain_s,
        FAILED_REQUEST_RETRY_S,
        settings.ramp_s,
    )
    return ClientProcesses(spec(), shares, sentences)


def _skipped(system: str, concurrency: int, since: int, bound_ms: float) -> RunSummary:
    nan = math.nan
    return RunSummary(
        system=system,
        concurrency=concurrency,
        first_audio_ms={"p50": nan, "p95": nan, "p99": nan},
        underrun_events=0,
        streams=0,
        rtf=nan,
        audio_seconds_per_second=nan,
        skipped=f"saturated at concurrency {since} (first-audio p95 over {bound_ms:.0f} ms)",
    )


def top_error(run: RunSummary) -> str:
    """The run's most frequent kind of error and its count, for the progress line."""
    kind, count = next(iter(run.errors_by_kind.items()), ("?", run.errors))
    return f"{count} {kind[:60]}"


def _progress_line(run: RunSummary) -> str:
    fa = run.first_audio_ms
    cpu = run.server.get("cpu_percent")
    lag = run.client.get("loop_lag_ms", {}).get("p95")
    batch = ", ".join(
        f"{model} mean batch {info['mean_batch_size']:.1f}" for model, info in run.batching.items()
    )
    return (
        f"{run.system:>16} c={run.concurrency:<3} streams={run.streams:<4} "
        f"first audio p50/p95/p99 {fa['p50']:.0f}/{fa['p95']:.0f}/{fa['p99']:.0f} ms  "
        f"underrun streams {run.underrun_streams} ({run.underrun_rate:.0%}), events "
        f"{run.underrun_events}  rtf {run.rtf:.3f}  "
        f"audio {run.audio_seconds_per_second:.1f} s/s  errors {run.errors}"
        + (f" (most: {top_error(run)})" if run.errors else "")
        + f"  refused {run.refused}"
        + (f"  server cpu {cpu:.0f}%" if isinstance(cpu, float) else "")
        + (f"  client loop lag p95 {lag:.0f} ms" if isinstance(lag, float) else "")
        + (f"  [{batch}]" if batch else "")
    )
