"""`make soak`: many requests against `voxfleet serve`, with hang-ups and bad input mixed in,
then a look at what the server kept (memory, live streams).

Each request speaks the first 1 to 4 words of a corpus sentence (`WORDS`; whole sentences
would make 10,000 requests take hours on a 2-core CPU; the soak looks for leaks, not
throughput). The length sets the pace: side by side on one machine, 1,200-request soaks ran
9.7 and 9.8 requests a second with 1 to 4 words against 6.4 and 6.5 with 2 to 6
(docs/reliability.md). A fifth of the streams are hung up at a random point (before or after
the first audio), one in twenty carries a bad input that the server must refuse. Writes
results/reliability.json.gz.

A stream that the server's process takes with it (the connection breaks: tritonserver died
and `voxfleet serve` restarts it) is an unexpected error, counted again in
`streams_lost_to_server_restarts`; `server_restarts` lists each restart with its cause.
Tritonserver 2.51 (the one nvidia-pytriton ships) crashed with SIGSEGV three times in about
57,000 soak requests, likely a race in its gRPC frontend (docs/reliability.md).

Memory is the resident set of the whole server tree, taken after a warm-up of `--warmup`
requests at the soak's own concurrency (so the start already holds that many streams' working
set), then every `--rss-every-s` seconds by process (`rss_timeline`): growth that levels off
is a working set, growth that keeps its slope is a leak.

    python -m lab.soak --requests 10000 --out results/reliability.json.gz
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engines.bench.results import write_json
from engines.client import wire
from engines.contract import names
from engines.text.corpus import load_corpus
from lab.faults import Server, start, stop

HANG_UP_SHARE = 0.20
BAD_INPUT_SHARE = 0.05
LIVE_STREAMS_DELAY_S = 5.0
LOST_BACKOFF_S = 1.0  # a client's pause after the server lost its stream, before it asks again
WORDS = (1, 4)  # each request speaks the first 1 to 4 words of a corpus sentence
_LIVE = re.compile(rf"^{names.LIVE_STREAMS}\{{[^}}]*\}} ([0-9.e+-]+)$", re.M)


def _text(values: list[bytes]) -> Callable[[Any], None]:
    return lambda request: wire.add_bytes_input(request, names.TEXT, values)


def _with_scalar(name: str, datatype: str, value: float) -> Callable[[Any], None]:
    def add(request: Any) -> None:
        wire.add_bytes_input(request, names.TEXT, [b"Hello there."])
        wire.add_scalar_input(request, name, value, datatype)

    return add


# Each bad input, as what it adds to a request.
BAD_INPUTS: dict[str, Callable[[Any], None]] = {
    "empty text": _text([b""]),
    "blank text": _text([b" \t\n"]),
    "invalid UTF-8": _text([b"caf\xc3("]),
    "text over the limit": _text([b"a" * 6000]),
    "two texts": _text([b"One.", b"Two."]),
    "NaN length scale": _with_scalar(names.LENGTH_SCALE, "FP32", math.nan),
    "huge length scale": _with_scalar(names.LENGTH_SCALE, "FP32", 1e30),
    "negative noise": _with_scalar(names.NOISE_W, "FP32", -1.0),
    "unknown speaker": _with_scalar(names.SPEAKER_ID, "INT32", 7),
    "unknown input": _with_scalar("VOLUME", "FP32", 1.0),
}


@dataclass
class Tally:
    requests: int = 0
    completed: int = 0
    cancelled: int = 0
    bad_inputs_refused: int = 0
    unexpected_errors: int = 0
    streams_lost: int = 0  # of the unexpected errors: the server's process took them with it
    examples: list[str] = field(default_factory=list)
    bad_kinds: Counter[str] = field(default_factory=Counter)

    def unexpected(self, what: str) -> None:
        self.unexpected_errors += 1
        if len(self.examples) < 10:
            self.examples.append(what[:300])


class SoakClient:
    def __init__(self, url: str, model: str) -> None:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.model = model
        self._channel = grpc.aio.insecure_channel(url)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    def request(self, text: str | None, bad: str | None) -> Any:
        if bad is None:
            assert text is not None
            return wire.speech_request(self.model, text, request_id="")
        request = wire.new_request(self.model)
        BAD_INPUTS[bad](request)
        return request

    async def stream(
        self, request: Any, hang_up_after: int | None, at_end: bool = False
    ) -> tuple[str, str]:
        """('completed' | 'cancelled' | 'error' | 'lost', detail): 'lost' is a stream the
        server's process took with it (the connection broke or was refused).

        `at_end`: count audio responses only, and hang up the moment the `hang_up_after`-th
        one or the final response arrives, whichever comes first (a listener that hangs up as
        soon as it has the audio it expects; lab.hangups)."""
        import grpc

        finished = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield request
            await finished.wait()

        call = self._stub.ModelStreamInfer(requests())
        responses = 0
        try:
            if hang_up_after == 0:
                await asyncio.sleep(random.uniform(0.0, 0.2))
                call.cancel()
                return "cancelled", "before any audio"
            async for response in call:
                if response.error_message:
                    return "error", response.error_message
                chunk = wire.decode_response(response.infer_response)
                if at_end:
                    assert hang_up_after is not None
                    responses += bool(chunk.samples.size)
                    final = chunk.final
                    if responses >= hang_up_after or final:
                        call.cancel()
                        return "cancelled", f"{responses} audio responses, final {final}"
                    continue
                responses += 1
                if chunk.final:
                    return "completed", f"{responses} responses"
                if hang_up_after is not None and responses >= hang_up_after:
                    call.cancel()
                    return "cancelled", f"after {responses} responses"
            return "error", "the stream closed without a final response"
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as error:
            kind = "lost" if error.code() == grpc.StatusCode.UNAVAILABLE else "error"
            return kind, f"{error.code().name}: {error.details()}"
        except Exception as error:
            return "error", f"{type(error).__name__}: {error}"
        finally:
            finished.set()


def process_rss_mb(pid: int) -> dict[str, float]:
    """Resident memory of each process of the server tree (supervisor, tritonserver, the
    voice's backend stub), by process name."""
    root = psutil.Process(pid)
    sizes: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            name = "supervisor" if process.pid == pid else process.name()
            sizes[name] = sizes.get(name, 0.0) + process.memory_info().rss / 2**20
        except psutil.NoSuchProcess:
            pass
    return {name: round(mb, 1) for name, mb in sorted(sizes.items())}


async def sample_rss(
    pid: int, tally: Tally, started: float, every_s: float, samples: list[dict[str, Any]]
) -> None:
    """Append the server tree's memory by process every `every_s` seconds until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        by_process = process_rss_mb(pid)
        samples.append(
            {
                "t_s": round(time.monotonic() - started, 1),
                "requests": tally.requests,
                "rss_mb": round(sum(by_process.values()), 1),
                "by_process": by_process,
            }
        )


def live_streams(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        return sum(float(v) for v in _LIVE.findall(response.read().decode()))


async def soak(
    server: Server, requests: int, concurrency: int, max_seconds: float, seed: int, tally: Tally
) -> None:
    """`requests` requests from `concurrency` closed-loop clients. A client whose stream the
    server lost (its process died) backs off for `LOST_BACKOFF_S`, then waits for the server
    to be ready again before its next request: one crash then costs the streams in flight,
    not every request the clients could fire at a dead port."""
    rng = random.Random(seed)
    sentences = load_corpus()
    client = SoakClient(server.grpc, "joe")
    deadline = time.monotonic() + max_seconds
    issued = 0
    kinds = sorted(BAD_INPUTS)

    async def worker() -> None:
        nonlocal issued
        while issued < requests and time.monotonic() < deadline:
            issued += 1
            draw = rng.random()
            bad = kinds[issued % len(kinds)] if draw < BAD_INPUT_SHARE else None
            hang_up = draw >= 1 - HANG_UP_SHARE
            words = rng.choice(sentences).split()[: rng.randint(*WORDS)]
            text = " ".join(words)
            request = client.request(text, bad)
            outcome, detail = await client.stream(request, rng.randint(0, 3) if hang_up else None)
            tally.requests += 1
            if bad is not None:
                if outcome == "error":
                    tally.bad_inputs_refused += 1
                    tally.bad_kinds[bad] += 1
                else:
                    tally.unexpected(f"bad input ({bad}) was not refused: {outcome} {detail}")
            elif outcome == "completed":
                tally.completed += 1
            elif outcome == "cancelled":
                tally.cancelled += 1
            else:
                tally.unexpected(f"{text!r}: {detail}")
            if outcome == "lost":
                tally.streams_lost += 1
                # Back off first: the health port answers ready until the supervisor has seen
                # tritonserver die (up to 0.1 s), and a refused connection fails at once.
                await asyncio.sleep(LOST_BACKOFF_S)
                deadline_ready = time.monotonic() + 120
                while (
                    time.monotonic() < deadline_ready
                    and await asyncio.to_thread(server.ready) != 200
                ):
                    await asyncio.sleep(0.5)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()


def server_restarts(server: Server) -> list[str]:
    """The supervisor's restarts of tritonserver so far, by cause (from its log)."""
    lines = server.log.read_text(errors="replace").splitlines()
    return [line for line in lines if line.endswith("; restarting tritonserver")]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-minutes", type=float, default=20.0)
    parser.add_argument(
        "--warmup",
        type=int,
        default=500,
        help="requests at the soak's concurrency before rss_start_mb, so the start is a server "
        "that already holds --concurrency streams, not one that has served a handful",
    )
    parser.add_argument("--rss-every-s", type=float, default=60.0, help="memory timeline step")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, default=Path("results/reliability.json.gz"))
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="voxfleet-soak-"))
    server = start(work)
    try:
        asyncio.run(soak(server, args.warmup, args.concurrency, 600, args.seed + 1, Tally()))
        restarts_before = len(server_restarts(server))
        rss_start_by_process = process_rss_mb(server.process.pid)
        rss_start = sum(rss_start_by_process.values())
        tally = Tally()
        timeline: list[dict[str, Any]] = []
        started = time.monotonic()

        async def run() -> None:
            sampler = asyncio.create_task(
                sample_rss(server.process.pid, tally, started, args.rss_every_s, timeline)
            )
            try:
                await soak(
                    server, args.requests, args.concurrency, args.max_minutes * 60, args.seed, tally
                )
            finally:
                sampler.cancel()

        asyncio.run(run())
        duration = time.monotonic() - started
        time.sleep(LIVE_STREAMS_DELAY_S)
        live_after = live_streams(server.metrics)
        restarts = server_restarts(server)[restarts_before:]
        rss_end_by_process = process_rss_mb(server.process.pid)
        rss_end = sum(rss_end_by_process.values())
    finally:
        stop(server)
    result = {
        "requests": tally.requests,
        "completed": tally.completed,
        "cancelled": tally.cancelled,
        "bad_inputs_refused": tally.bad_inputs_refused,
        "unexpected_errors": tally.unexpected_errors,
        "streams_lost_to_server_restarts": tally.streams_lost,
        "server_restarts": restarts,
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "live_streams_after": live_after,
        "rss_start_by_process_mb": rss_start_by_process,
        "rss_end_by_process_mb": rss_end_by_process,
        "rss_timeline": timeline,
        "warmup_requests": args.warmup,
        "duration_s": round(duration, 1),
        "concurrency": args.concurrency,
        "words_per_request": list(WORDS),
        "unexpected_examples": tally.examples,
        "bad_inputs_by_kind": dict(sorted(tally.bad_kinds.items())),
        "goals_met": tally.unexpected_errors == 0
        and rss_end - rss_start < 100
        and live_after == 0
        and tally.requests >= args.requests,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{platform.machine()}, {psutil.cpu_count()} CPUs, "
        f"{psutil.virtual_memory().total / 2**30:.0f} GiB",
        "command": "make soak",
        "server_log": str(server.log),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    print(json.dumps(result, indent=2))
    return 0 if result["goals_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
