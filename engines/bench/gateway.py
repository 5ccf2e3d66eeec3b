"""The speech API as a benchmark system (`voxfleet-api`), and what it adds to direct gRPC.

`SpeechApiSystem` streams each sentence through `voxfleet api`'s `POST /v1/audio/speech`
(`response_format=pcm`, chunked), over keep-alive HTTP connections from one aiohttp session,
as an SDK would. A chunk is counted when its bytes arrive; first audio is timed from the
request being sent, as for the gRPC systems. `make bench` puts the gateway in front of the
same `voxfleet` server the `voxfleet` system streams from directly, and the sweep alternates
the two at every level, so the difference is the gateway's.

`engines.bench.stats.gateway_overhead` compares the two per level: added first-audio p50
and p95, and the gateway's own CPU (its process tree, sampled as a server's) per stream.

On a shared machine the load of others drifts between the two systems' turns at a level.
`measure_paired` takes them in the same turn instead: N listeners, each sending every
sentence twice, directly and through the gateway (in turns which goes first), so both see
the same sentences, the same server load and the same background. The commands:

    python -m engines.bench.gateway paired --grpc-url H:P --api-url http://H:P \
        --concurrency 1,12 --duration 60 --json results/F.json.gz
    python -m engines.bench.gateway summary results/F1.json.gz results/F2.json.gz ...

`summary` takes `voxfleet bench --json` files and `paired` files alike, and prints each
run's figures with their median and worst over the runs.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from engines.bench.resources import ProcessTree, find_listening_process
from engines.bench.results import read_json, write_json
from engines.bench.stats import SPEECH_API_SYSTEM, RunSummary, gateway_overhead

PCM_RATE = 24000


class SpeechApiSystem:
    """`voxfleet api` in front of a voxfleet server: HTTP in, pcm chunks out."""

    name = SPEECH_API_SYSTEM
    streaming = True

    def __init__(self, url: str, voice: str = "joe") -> None:
        self.url = url.rstrip("/")
        self.voice = voice
        self._session: Any = None

    def client_spec(self) -> tuple[type[SpeechApiSystem], dict[str, Any]]:
        return type(self), {"url": self.url, "voice": self.voice}

    async def connect(self) -> None:
        import aiohttp

        from engines.bench.systems import BenchSystemError

        if self._session is None:
            # No pool limit: each listener holds one stream, as the gRPC systems do.
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
            self._session = aiohttp.ClientSession(connector=connector)
        try:
            async with self._session.get(f"{self.url}/v1/audio/voices") as response:
                voices = (await response.json())["voices"]
        except (aiohttp.ClientError, KeyError, ValueError) as error:
            raise BenchSystemError(f"{self.name}: cannot reach {self.url}: {error}") from error
        if not any(v["id"] == self.voice and v["ready_endpoints"] for v in voices):
            raise BenchSystemError(f"{self.name}: voice {self.voice!r} is not ready at {self.url}")

    async def prepare(self, concurrency: int) -> None:
        if self._session is None:
            await self.connect()

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        from engines.bench.systems import BenchSystemError

        body = {"model": "tts-1", "voice": self.voice, "input": text, "response_format": "pcm"}
        async with self._session.post(f"{self.url}/v1/audio/speech", json=body) as response:
            if response.status != 200:
                raise BenchSystemError(f"HTTP {response.status}: {await response.text()}")
            odd = 0
            async for data in response.content.iter_any():
                samples, odd = divmod(odd + len(data), 2)
                if samples:
                    yield samples, PCM_RATE

    def server(self) -> ProcessTree | None:
        host_port = self.url.split("://", 1)[-1]
        host, _, port = host_port.rpartition(":")
        if host not in ("localhost", "127.0.0.1", "0.0.0.0") or not port.isdigit():
            return None
        return find_listening_process(int(port))

    async def batch_counts(self) -> dict[str, dict[int, int]]:
        return {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def summarise(paths: Sequence[Path]) -> dict[str, Any]:
    """Per level: each run's figures, and their median and worst (the most added time or
    CPU) over the runs."""
    per_run = []
    for path in paths:
        result = read_json(path)
        if "levels" in result:  # a paired run
            levels = result["levels"]
        else:
            runs = [RunSummary.from_json(_nan(run)) for run in result["runs"]]
            levels = gateway_overhead(runs)
        date = result.get("date_utc") or result.get("machine", {}).get("date_utc")
        per_run.append({"file": str(path), "date": date, "levels": levels})
    by_level: dict[int, list[dict[str, float]]] = {}
    for run in per_run:
        for row in run["levels"]:
            by_level.setdefault(int(row["concurrency"]), []).append(row)
    summary: dict[str, dict[str, Any]] = {}
    for level, rows in sorted(by_level.items()):
        keys = [k for k, v in rows[0].items() if k != "concurrency" and isinstance(v, (int, float))]
        summary[str(level)] = {
            key: {
                "median": statistics.median(row[key] for row in rows),
                "worst": max(row[key] for row in rows),
            }
            for key in keys
        }
        summary[str(level)]["runs"] = len(rows)
    return {"runs": per_run, "by_concurrency": summary}


def _nan(run: dict[str, Any]) -> dict[str, Any]:
    """JSON null back to NaN where a summary holds numbers."""
    fixed = dict(run)
    fixed["first_audio_ms"] = {
        k: (math.nan if v is None else v) for k, v in (run.get("first_audio_ms") or {}).items()
    }
    return fixed


async def measure_paired(
    grpc_url: str,
    api_url: str,
    concurrency: int,
    duration_s: float,
    voice: str = "joe",
    drain_s: float = 30.0,
) -> dict[str, Any]:
    """One level: `concurrency` closed-loop listeners, each speaking every sentence twice,
    once directly and once through the gateway, in turns which goes first."""
    import asyncio
    import time

    from engines.bench.resources import MachineCpuSampler, ResourceSampler
    from engines.bench.stats import summarise_run
    from engines.bench.systems import TritonSystem
    from engines.bench.timeline import Chunk, StreamRecord
    from engines.text.corpus import cycle_sentences, load_corpus, sentence_order

    direct = TritonSystem("voxfleet", grpc_url, voice, streaming=True)
    api = SpeechApiSystem(api_url, voice)
    await direct.connect()
    await api.connect()
    systems = (direct, api)
    for system in systems:  # warm both paths before anything is timed
        async for _ in system.open_stream("Warming up before the measured runs."):
            pass
    sentences = cycle_sentences(sentence_order(load_corpus()))
    records: dict[str, list[StreamRecord]] = {direct.name: [], api.name: []}
    gateway = api.server()
    sampler = ResourceSampler(gateway) if gateway is not None else None
    machine = MachineCpuSampler()
    clock = time.perf_counter
    start = clock()
    deadline = start + duration_s
    ramp_s = min(1.0, duration_s / 10)

    async def stream_into(system: Any, record: StreamRecord) -> None:
        try:
            async for samples, rate in system.open_stream(record.text):
                record.chunks.append(Chunk(clock(), samples))
                record.sample_rate = rate or record.sample_rate
            record.ended_s = clock()
        except asyncio.CancelledError:
            record.error = "cut off: still streaming when the drain time ran out"
            raise
        except Exception as error:
            record.error = f"{type(error).__name__}: {error}"

    async def listener(index: int) -> None:
        await asyncio.sleep(ramp_s * index / concurrency)
        turn = index
        while clock() < deadline:
            # The same sentence both ways, one right after the other, in turns which first:
            # first audio depends on the sentence, and the comparison should not.
            text = next(sentences)
            order = systems if turn % 2 == 0 else systems[::-1]
            turn += 1
            for system in order:
                record = StreamRecord(text=text, sent_s=clock())
                records[system.name].append(record)
                await stream_into(system, record)

    machine.start()
    if sampler is not None:
        sampler.start()
    tasks = [asyncio.ensure_future(listener(i)) for i in range(concurrency)]
    _, pending = await asyncio.wait(tasks, timeout=duration_s + drain_s)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    wall = clock() - start
    usage = sampler.stop() if sampler is not None else {}
    machine_cpu = machine.stop()
    for system in systems:
        await system.close()
    runs = []
    for system in systems:
        run = summarise_run(system.name, concurrency, records[system.name], wall)
        if system is api:
            run.server = dict(usage)
        runs.append(run)
    (row,) = gateway_overhead(runs)
    row["machine_cpu_percent"] = machine_cpu
    row["direct_streams"], row["api_streams"] = runs[0].streams, runs[1].streams
    row["direct_errors"] = runs[0].errors
    # The gateway's CPU per request is over its own requests; per stream, over its share.
    row["gateway_cpu_percent_per_stream"] = row["gateway_cpu_percent"] / (concurrency / 2)
    return {"row": row, "runs": [run.to_json() for run in runs]}


def _paired(args: Any) -> int:
    import asyncio
    import time

    from engines.bench.machine import describe_machine

    result: dict[str, Any] = {
        "command": "python -m engines.bench.gateway " + " ".join(sys.argv[1:]),
        "date_utc": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "machine": describe_machine(),
        "levels": [],
        "runs": [],
    }
    for level in args.concurrency:
        measured = asyncio.run(
            measure_paired(args.grpc_url, args.api_url, level, args.duration, args.voice)
        )
        result["levels"].append(measured["row"])
        result["runs"].extend(measured["runs"])
        row = measured["row"]
        print(
            f"c={level}: first audio p50 {row['direct_p50_ms']:.1f} ms direct, "
            f"{row['api_p50_ms']:.1f} ms via the gateway (+{row['added_p50_ms']:.1f}); p95 "
            f"{row['direct_p95_ms']:.1f} / {row['api_p95_ms']:.1f} (+{row['added_p95_ms']:.1f}); "
            f"gateway CPU {row['gateway_cpu_percent']:.1f} % "
            f"({row['gateway_cpu_ms_per_request']:.1f} ms per request); "
            f"streams {row['direct_streams']:.0f} + {row['api_streams']:.0f}",
            file=sys.stderr,
        )
    if args.json:
        write_json(args.json, result, default=str)
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m engines.bench.gateway")
    commands = parser.add_subparsers(dest="command", required=True)
    paired = commands.add_parser("paired", help="direct gRPC and the gateway, request by request")
    paired.add_argument("--grpc-url", required=True, help="the voxfleet server, HOST:PORT")
    paired.add_argument("--api-url", required=True, help="the gateway in front of it")
    paired.add_argument("--voice", default="joe")
    paired.add_argument(
        "--concurrency", type=lambda v: [int(x) for x in v.split(",")], default=[1, 12]
    )
    paired.add_argument("--duration", type=float, default=60.0)
    paired.add_argument("--json", type=Path)
    summary = commands.add_parser("summary", help="median and worst over result files")
    summary.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    if args.command == "paired":
        return _paired(args)
    print(json.dumps(summarise(args.files), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
