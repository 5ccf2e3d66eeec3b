"""A full server and a client that ignores its refusals: how fast refusals come, and whether the
streams it admitted notice the hammering.

    python -m lab.refusals --runs 3 --out results/refusals.json.gz

Each run on a freshly started `voxfleet serve` (CPU, the joe voice, no `--max-streams`: the
server refuses past the capacity it predicts, engines/streaming/capacity.py):

1. warm-up: `--warmup-listeners` closed-loop listeners until the server reports the real-time
   streams it holds (`voxfleet_capacity_streams`, C);
2. control: C listeners for `--seconds` (the benchmark's streams over one gRPC channel; a
   refused listener waits `RETRY_AFTER_S` and asks again);
3. hammered: the same C listeners, and beside them a client that sends `--hammer-factor` x C
   requests a second, open loop, whatever the answers (`Hi.` each, over a channel of its own),
   for `--seconds`.

Reported per phase: the listeners' admitted streams, those with an underrun (the benchmark's
rule), their first-audio p95 and how many were refused; for the hammer, its requests, how many
were refused and how fast (median, p99, worst, from the request to the refusal), and how many
the server admitted (their underruns count with the listeners'). The goals (issue 44): refusals
within 50 ms at 10 x C requests a second, and admitted streams no more late than in the control.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from engines.bench.loadgen import run_closed_loop
from engines.bench.results import write_json
from engines.bench.stats import is_refusal, percentile
from engines.bench.systems import BenchSystemError, TritonSystem
from engines.bench.timeline import Chunk, StreamRecord, analyse_stream
from engines.contract import names
from engines.text.corpus import load_corpus, sentence_order
from lab.faults import start, stop

RETRY_AFTER_S = 0.2
HAMMER_TEXT = "Hi."
REFUSAL_GOAL_MS = 50.0


def capacity(metrics_url: str) -> int:
    with urllib.request.urlopen(metrics_url, timeout=3) as reply:
        text = reply.read().decode()
    found = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(f"{names.CAPACITY_STREAMS}{{")
    ]
    return int(max(found, default=0))


def listener_summary(records: list[StreamRecord]) -> dict[str, Any]:
    admitted = [analyse_stream(r) for r in records if r.chunks]
    first = [s.first_audio_s * 1000 for s in admitted if s.first_audio_s is not None]
    return {
        "streams": len(records),
        "admitted": len(admitted),
        "admitted_with_underruns": sum(1 for s in admitted if s.underruns),
        "first_audio_ms_p95": round(percentile(first, 95), 1) if first else None,
        "refused": sum(1 for r in records if is_refusal(r.error)),
        "other_errors": sorted({r.error for r in records if r.error and not is_refusal(r.error)})[
            :5
        ],
    }


async def _listeners(url: str, count: int, seconds: float) -> list[StreamRecord]:
    system = TritonSystem("voxfleet", url, "joe", streaming=True)
    await system.connect()
    try:
        sentences = itertools.cycle(sentence_order(load_corpus()))
        load = await run_closed_loop(
            system.open_stream,
            sentences,
            count,
            seconds,
            drain_s=60,
            retry_after_s=RETRY_AFTER_S,
        )
    finally:
        await system.close()
    return load.records


async def _hammer(url: str, per_second: float, seconds: float) -> dict[str, Any]:
    """Open loop: a request every 1/per_second s, each awaited in a task of its own."""
    system = TritonSystem("hammer", url, "joe", streaming=True)
    await system.connect()
    refusals_ms: list[float] = []
    admitted: list[StreamRecord] = []
    other: list[str] = []

    async def one() -> None:
        record = StreamRecord(HAMMER_TEXT, time.perf_counter())
        try:
            async for samples, rate in system.open_stream(HAMMER_TEXT):
                record.chunks.append(Chunk(time.perf_counter(), samples))
                record.sample_rate = rate or record.sample_rate
            record.ended_s = time.perf_counter()
            admitted.append(record)
        except BenchSystemError as error:
            if error.code == "RESOURCE_EXHAUSTED":
                refusals_ms.append((time.perf_counter() - record.sent_s) * 1000)
            else:
                other.append(str(error))

    tasks: list[asyncio.Task[None]] = []
    began = time.perf_counter()
    try:
        for n in itertools.count():
            at = began + n / per_second
            if at > began + seconds:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.ensure_future(one()))
        await asyncio.gather(*tasks)
    finally:
        await system.close()
    ordered = sorted(refusals_ms)
    return {
        "requests": len(tasks),
        "per_second": per_second,
        "refused": len(ordered),
        "refusal_ms_median": round(statistics.median(ordered), 1) if ordered else None,
        "refusal_ms_p99": round(percentile(ordered, 99), 1) if ordered else None,
        "refusal_ms_max": round(ordered[-1], 1) if ordered else None,
        "admitted": len(admitted),
        "admitted_with_underruns": sum(1 for r in admitted if analyse_stream(r).underruns),
        "other_errors": sorted(set(other))[:5],
    }


def measure(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    server = start(work)
    try:
        held = 0
        deadline = time.monotonic() + 120
        while held == 0 and time.monotonic() < deadline:
            asyncio.run(_listeners(server.grpc, args.warmup_listeners, args.warmup_seconds))
            held = capacity(server.metrics)
        if held == 0:
            raise RuntimeError("the server measured no capacity: raise --warmup-listeners")
        control = listener_summary(asyncio.run(_listeners(server.grpc, held, args.seconds)))
        held_after_control = capacity(server.metrics)

        async def hammered() -> tuple[list[StreamRecord], dict[str, Any]]:
            listening = asyncio.ensure_future(_listeners(server.grpc, held, args.seconds))
            hammer = await _hammer(server.grpc, args.hammer_factor * held, args.seconds)
            return await listening, hammer

        records, hammer = asyncio.run(hammered())
        return {
            "capacity_streams": held,
            "capacity_streams_after_control": held_after_control,
            "capacity_streams_after_hammer": capacity(server.metrics),
            "control": control,
            "hammered": listener_summary(records),
            "hammer": hammer,
        }
    finally:
        stop(server)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--warmup-listeners", type=int, default=4)
    parser.add_argument("--warmup-seconds", type=float, default=20.0)
    parser.add_argument("--hammer-factor", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("results/refusals.json.gz"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="voxfleet-refusals-"))
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    report: dict[str, Any] = {
        "command": " ".join(["python -m lab.refusals", *(argv or sys.argv[1:])]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB; load average {load} at the start",
        "runs": [],
    }
    for _ in range(args.runs):
        run = measure(work, args)
        report["runs"].append(run)
        print(json.dumps(run), flush=True)
    worst = [r["hammer"]["refusal_ms_max"] or 0.0 for r in report["runs"]]
    p99 = [r["hammer"]["refusal_ms_p99"] or 0.0 for r in report["runs"]]
    report["refusal_ms_max"] = {"median": statistics.median(worst), "worst": max(worst)}
    report["refusal_ms_p99"] = {"median": statistics.median(p99), "worst": max(p99)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
