"""Which chunks come late, and when: N closed-loop listeners against a fresh `voxfleet serve
--voice joe`, as `voxfleet bench` runs one level, then a line for every stream that underran.

    python -m lab.late_chunks LISTENERS SECONDS [-- SERVE ARGS...]

Each line says when the stream started (seconds after the level's first request), its first
audio, its chunks in frames, and each late chunk (its index, how long the listener's buffer
had been empty, ms after first audio). `voxfleet bench` gives only the totals; this says
whether the late chunks follow the start of the level (every listener's window ramp at once)
or come anywhere. The last line counts the streams with a late chunk that started in the
level's first 2 s. Arguments after `--` go to `voxfleet serve` (e.g. `--max-streams 4`).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from engines.bench.loadgen import run_closed_loop
from engines.bench.runner import FAILED_REQUEST_RETRY_S
from engines.bench.systems import TritonSystem
from engines.bench.timeline import StreamRecord, analyse_stream, late_chunks
from engines.text.corpus import load_corpus, sentence_order
from lab import faults

# The level's start: the listeners arrive within 1 s (the load generator's ramp) and their
# first sentences run their window ramps over the second after.
BURST_S = 2.0


async def listen(url: str, listeners: int, seconds: float) -> list[StreamRecord]:
    system = TritonSystem("voxfleet", url, "joe", streaming=True)
    await system.connect()

    async def open_stream(text: str) -> AsyncIterator[tuple[int, int]]:
        async for chunk in system.open_stream(text):
            yield chunk

    sentences = itertools.cycle(sentence_order(load_corpus()))
    try:
        # A refused listener backs off as the bench's do: asking again at once, 7 listeners
        # on 2 cores made 5,487 refused requests in 20 s, a load no bench level makes.
        load = await run_closed_loop(
            open_stream,
            sentences,
            listeners,
            seconds,
            drain_s=60,
            retry_after_s=FAILED_REQUEST_RETRY_S,
        )
    finally:
        await system.close()
    return load.records


def report(records: list[StreamRecord]) -> list[str]:
    """A line per stream that underran, then the count."""
    done = [r for r in records if r.error is None and r.chunks]
    if not records:
        return ["no stream ran"]
    start = min(r.sent_s for r in records)
    lines = []
    early = 0
    for record in done:
        stats = analyse_stream(record)
        if not stats.underruns:
            continue
        early += record.sent_s - start < BURST_S
        frames = [c.samples // 256 for c in record.chunks if c.samples > 0]
        late = [
            (c.index, round(c.stall_s * 1000, 1), round(c.after_first_s * 1000))
            for c in late_chunks(record)
        ]
        lines.append(
            f"started {record.sent_s - start:6.2f} s  first audio "
            f"{(stats.first_audio_s or 0) * 1000:4.0f} ms  chunks {frames}  "
            f"late (index, ms empty, ms after first) {late}"
        )
    lines.append(
        f"{len(lines)} of {len(done)} streams had a late chunk ({early} of them started in "
        f"the first {BURST_S:.0f} s); {len(records) - len(done)} failed"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("listeners", type=int, help="closed-loop listeners")
    parser.add_argument("seconds", type=float, help="seconds of load")
    parser.add_argument("serve_args", nargs="*", help="after --: arguments of voxfleet serve")
    args = parser.parse_args(argv)
    if args.listeners < 1 or args.seconds <= 0:
        parser.error("LISTENERS must be at least 1 and SECONDS more than 0")
    server = faults.start(Path(tempfile.mkdtemp(prefix="voxfleet-late-chunks-")), args.serve_args)
    try:
        records = asyncio.run(listen(server.grpc, args.listeners, args.seconds))
    finally:
        faults.stop(server)
    print("\n".join(report(records)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
