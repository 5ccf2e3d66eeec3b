"""Fault measurements on freshly started `voxfleet serve` servers (CPU, joe voice):

- stop:     SIGTERM-to-exit with 0 and with 8 streams in flight (each run a fresh server).
- heal:     kill -9 of the voice's backend stub with 4 streams in flight: how long until those
            streams end (and with what), until readiness fails, and until the voice serves.
- overload: `--max-streams M` and 2M closed-loop listeners (`voxfleet bench`'s streams, over
            one gRPC channel): refusals, their latency, and the admitted streams' underruns,
            counted as the benchmark counts them (a chunk that arrives after the audio before
            it has played out, playback starting at first audio); then the control, M
            listeners and nothing refused, for the server's own underruns at that load.

    python -m lab.faults stop heal overload --runs 3  # results/reliability-faults.json.gz
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from engines.bench.loadgen import run_closed_loop
from engines.bench.results import write_json
from engines.bench.stats import percentile
from engines.bench.systems import BenchSystemError, TritonSystem
from engines.bench.timeline import analyse_stream
from engines.client.tts import SynthesisError, synthesize
from engines.contract import names
from engines.pod.ports import free_port
from engines.text.corpus import load_corpus, sentence_order

REFUSED = "RESOURCE_EXHAUSTED"
LONG = "This is a sentence that takes a few seconds to say out loud. " * 3


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    grpc: str
    metrics: str
    health: str
    log: Path

    def ready(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.health}{names.READY_PATH}", timeout=2) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except OSError:
            return 0

    def live_streams(self) -> float:
        try:
            with urllib.request.urlopen(self.metrics, timeout=2) as reply:
                text = reply.read().decode()
        except OSError:
            return 0.0
        prefix = f'{names.LIVE_STREAMS}{{model="joe"}} '
        lines = [line for line in text.splitlines() if line.startswith(prefix)]
        return sum(float(line[len(prefix) :]) for line in lines)


def start(work: Path, extra: list[str] | None = None) -> Server:
    ports = [free_port() for _ in range(4)]
    log = open(work / f"serve-{ports[0]}.log", "wb")
    process = subprocess.Popen(
        [
            sys.executable, "-m", "engines.cli", "serve",
            "--grpc-port", str(ports[0]), "--http-port", str(ports[1]),
            "--metrics-port", str(ports[2]), "--health-port", str(ports[3]), *(extra or []),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    server = Server(
        process,
        f"127.0.0.1:{ports[0]}",
        f"http://127.0.0.1:{ports[2]}/metrics",
        f"http://127.0.0.1:{ports[3]}",
        Path(log.name),
    )
    deadline = time.monotonic() + 300
    while server.ready() != 200:
        if process.poll() is not None or time.monotonic() > deadline:
            stop(server)
            raise RuntimeError(f"voxfleet serve did not start; see {log.name}")
        time.sleep(0.2)
    return server


def stop_process_tree(process: subprocess.Popen[Any], grace_s: float) -> None:
    """SIGTERM, up to `grace_s` to exit, then kill whatever of its tree is left."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        tree = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for child in tree:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)


def stop(server: Server) -> None:
    stop_process_tree(server.process, grace_s=60)


def listeners(url: str, count: int, text: str = LONG) -> tuple[list[threading.Thread], list]:
    results: list[tuple[str, float]] = []

    def talk() -> None:
        try:
            synthesize(url, text, timeout_s=120)
            results.append(("completed", time.monotonic()))
        except SynthesisError as error:
            results.append((error.code or "error", time.monotonic()))

    threads = [threading.Thread(target=talk, daemon=True) for _ in range(count)]
    for thread in threads:
        thread.start()
    return threads, results


def wait_for(condition: Any, timeout_s: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if condition():
            return time.monotonic() - started
        time.sleep(0.02)
    return None


def measure_stop(work: Path, streams: int) -> dict[str, Any]:
    server = start(work)
    try:
        threads, results = listeners(server.grpc, streams)
        if streams:
            wait_for(lambda: server.live_streams() >= streams, 60)
        signalled = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        server.process.wait(timeout=120)
        exit_s = time.monotonic() - signalled
        for thread in threads:
            thread.join(timeout=10)
        last = max((ended - signalled for _, ended in results), default=0.0)
        return {
            "streams_in_flight": streams,
            "sigterm_to_exit_s": round(exit_s, 2),
            "last_stream_end_s": round(last, 2),
            "after_last_stream_s": round(exit_s - last, 2),
            "outcomes": sorted(outcome for outcome, _ in results),
            "exit_code": server.process.returncode,
        }
    finally:
        stop(server)


def measure_heal(work: Path) -> dict[str, Any]:
    server = start(work)
    try:
        threads, results = listeners(server.grpc, 4)
        wait_for(lambda: server.live_streams() >= 4, 60)
        children = psutil.Process(server.process.pid).children(recursive=True)
        (stub,) = [c for c in children if c.name() == "triton_python_backend_stub"]
        stub.kill()
        killed = time.monotonic()
        not_ready = wait_for(lambda: server.ready() != 200, 20)
        for thread in threads:
            thread.join(timeout=30)
        ready = wait_for(lambda: server.ready() == 200, 60)
        serves = synthesize(server.grpc, "I am back.").audio_seconds > 0
        return {
            "streams_ended_s": round(max(ended - killed for _, ended in results), 2),
            "stream_outcomes": sorted(outcome for outcome, _ in results),
            "not_ready_after_s": None if not_ready is None else round(not_ready, 2),
            "ready_again_s": None if ready is None else round(time.monotonic() - killed, 2),
            "serves_again": serves,
        }
    finally:
        stop(server)


def measure_overload(
    work: Path, limit: int, seconds: float, retry_after_s: float, listeners: int
) -> dict[str, Any]:
    server = start(work, ["--max-streams", str(limit)])
    try:
        result = asyncio.run(_overload(server.grpc, listeners, seconds, retry_after_s))
    finally:
        stop(server)
    refusals_ms = sorted(r * 1000 for r in result["refusals_s"])
    admitted = result["admitted"]
    return {
        "max_streams": limit,
        "listeners": listeners,
        "seconds": seconds,
        "retry_after_s": retry_after_s,
        "admitted_streams": len(admitted),
        "admitted_streams_with_underruns": sum(1 for a in admitted if a.underruns),
        "underruns": sum(a.underruns for a in admitted),
        "admitted_first_audio_ms_p95": _percentile_ms(
            [a.first_audio_s * 1000 for a in admitted if a.first_audio_s is not None], 95
        ),
        "refusals": len(refusals_ms),
        "refusal_ms_median": round(statistics.median(refusals_ms), 1) if refusals_ms else None,
        "refusal_ms_p99": _percentile_ms(refusals_ms, 99),
        "refusal_ms_max": round(refusals_ms[-1], 1) if refusals_ms else None,
        "other_errors": result["other_errors"][:5],
    }


async def _overload(
    url: str, listeners: int, seconds: float, retry_after_s: float
) -> dict[str, Any]:
    """`listeners` closed-loop listeners through one gRPC channel, as `voxfleet bench` drives a
    server (a client service keeps its channel; a new connection per request would time the
    client's handshake, not the server's refusal). A refused listener backs off, then asks
    again with its next sentence."""
    system = TritonSystem("voxfleet", url, "joe", streaming=True)
    await system.connect()
    refusals: list[float] = []

    async def open_stream(text: str) -> AsyncIterator[tuple[int, int]]:
        sent = time.perf_counter()
        try:
            async for chunk in system.open_stream(text):
                yield chunk
        except BenchSystemError as error:
            if str(error).startswith(f"[{REFUSED}]"):
                refusals.append(time.perf_counter() - sent)
                await asyncio.sleep(retry_after_s)  # a client backing off before it retries
            raise

    try:
        sentences = itertools.cycle(sentence_order(load_corpus()))
        load = await run_closed_loop(open_stream, sentences, listeners, seconds, drain_s=60)
    finally:
        await system.close()
    admitted = [analyse_stream(r) for r in load.records if r.error is None]
    other_errors = [
        r.error for r in load.records if r.error is not None and f"[{REFUSED}]" not in r.error
    ]
    return {"refusals_s": refusals, "admitted": admitted, "other_errors": other_errors}


def _percentile_ms(values_ms: list[float], q: float) -> float | None:
    return round(percentile(values_ms, q), 1) if values_ms else None


def summary(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 2), "worst": round(max(values), 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="fault measurements on voxfleet serve")
    parser.add_argument("what", nargs="+", choices=["stop", "heal", "overload"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-streams", type=int, default=4)
    parser.add_argument("--overload-seconds", type=float, default=60)
    parser.add_argument("--listeners", type=int, help="default: twice --max-streams")
    parser.add_argument("--retry-after-s", type=float, default=0.25, help="a refused client")
    parser.add_argument("--out", type=Path, default=Path("results/reliability-faults.json.gz"))
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="voxfleet-faults-"))
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    report["machine"] = (
        f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB; load average {load} at the start"
    )
    if "stop" in args.what:
        for streams in (0, 8):
            runs = [measure_stop(work, streams) for _ in range(args.runs)]
            report[f"stop_{streams}_streams"] = {
                "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
                "sigterm_to_exit_s": summary([r["sigterm_to_exit_s"] for r in runs]),
                "runs": runs,
            }
            print(json.dumps(report[f"stop_{streams}_streams"]), flush=True)
    if "heal" in args.what:
        runs = [measure_heal(work) for _ in range(args.runs)]
        report["heal"] = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "streams_ended_s": summary([r["streams_ended_s"] for r in runs]),
            "ready_again_s": summary([r["ready_again_s"] or 999.0 for r in runs]),
            "runs": runs,
        }
        print(json.dumps(report["heal"]), flush=True)
    if "overload" in args.what:
        runs = [
            measure_overload(
                work,
                args.max_streams,
                args.overload_seconds,
                args.retry_after_s,
                args.listeners or 2 * args.max_streams,
            )
            for _ in range(args.runs)
        ]
        label = f"overload_{args.max_streams}" + (
            f"_{args.listeners}_listeners" if args.listeners else ""
        )
        report[label] = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "refusal_ms": summary([r["refusal_ms_max"] or 0.0 for r in runs]),
            "runs": runs,
        }
        print(json.dumps(report[label]), flush=True)
        # The control: as many listeners as the limit, so nothing is refused. Underruns here
        # are the server's own at that load, not the overload's.
        control = [
            measure_overload(
                work, args.max_streams, args.overload_seconds, args.retry_after_s, args.max_streams
            )
            for _ in range(args.runs)
        ]
        report[f"overload_{args.max_streams}_control"] = {
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "runs": control,
        }
        print(json.dumps(report[f"overload_{args.max_streams}_control"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
