"""The speech API as a benchmark system (`voxfleet-api`), and what it adds to direct gRPC.

`SpeechApiSystem` streams each sentence through `voxfleet api`'s `POST /v1/audio/speech`
(`response_format=pcm`, chunked), over keep-alive HTTP connections from one aiohttp session,
as an SDK would. A chunk is counted when its bytes arrive; first audio is timed from the
request being sent, as for the gRPC systems. `make bench` puts the gateway in front of the
same `voxfleet` server the `voxfleet` system streams from directly, and the sweep alternates
the two at every level, so the difference is the gateway's.

`engines.bench.stats.gateway_overhead` compares the two per level: added first-audio p50
and p95, and the gateway's own CPU (its process tree, sampled as a server's) per stream.
`python -m engines.bench.gateway RESULT.json...` prints those figures per run and their
median and worst over the runs.
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
    """Per level: each run's figures, and their median and worst over the runs."""
    per_run = []
    for path in paths:
        result = json.loads(path.read_text("utf-8"))
        runs = [RunSummary.from_json(_nan(run)) for run in result["runs"]]
        per_run.append(
            {"file": str(path), "date": result["machine"].get("date_utc"),
             "levels": gateway_overhead(runs)}
        )  # fmt: skip
    levels: dict[int, list[dict[str, float]]] = {}
    for run in per_run:
        for row in run["levels"]:
            levels.setdefault(int(row["concurrency"]), []).append(row)
    summary: dict[str, dict[str, Any]] = {}
    for level, rows in sorted(levels.items()):
        summary[str(level)] = {
            key: {
                "median": statistics.median(row[key] for row in rows),
                "worst": max(row[key] for row in rows),  # the most added time or CPU
            }
            for key in rows[0]
            if key != "concurrency"
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


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    if not paths:
        print("usage: python -m engines.bench.gateway RESULT.json...", file=sys.stderr)
        return 2
    print(json.dumps(summarise(paths), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
