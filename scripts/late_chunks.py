"""Which chunks come late, and when: N closed-loop listeners against a fresh `voxfleet serve
--voice joe` (as `voxfleet bench` runs one level), then, for every stream with an underrun,
when it started (seconds after the first request), its first audio, its chunks in frames, and
each late chunk (its index, how long the listener's buffer had been empty, ms after first
audio). `voxfleet bench` gives only the totals; this says whether the late chunks follow the
start of the level (every listener's window ramp at once) or come anywhere; the last line
counts the streams with a late chunk that started in the level's first 2 s.

    .venv/bin/python scripts/late_chunks.py LISTENERS SECONDS [serve args...]
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from engines.bench import faults
from engines.bench.loadgen import run_closed_loop
from engines.bench.systems import TritonSystem
from engines.bench.timeline import StreamRecord, analyse_stream, late_chunks
from engines.corpus import load_corpus, sentence_order

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
    load = await run_closed_loop(open_stream, sentences, listeners, seconds, drain_s=60)
    await system.close()
    return load.records


def main() -> None:
    listeners, seconds = int(sys.argv[1]), float(sys.argv[2])
    server = faults.start(Path(tempfile.mkdtemp()), sys.argv[3:])
    try:
        records = asyncio.run(listen(server.grpc, listeners, seconds))
    finally:
        faults.stop(server)
    done = [r for r in records if r.error is None and r.chunks]
    start = min(r.sent_s for r in records)
    late_streams = early = 0
    for record in done:
        stats = analyse_stream(record)
        if not stats.underruns:
            continue
        late_streams += 1
        early += record.sent_s - start < BURST_S
        frames = [c.samples // 256 for c in record.chunks if c.samples > 0]
        late = [
            (c.index, round(c.stall_s * 1000, 1), round(c.after_first_s * 1000))
            for c in late_chunks(record)
        ]
        print(
            f"started {record.sent_s - start:6.2f} s  first audio "
            f"{(stats.first_audio_s or 0) * 1000:4.0f} ms  chunks {frames}  "
            f"late (index, ms empty, ms after first) {late}"
        )
    failed = len(records) - len(done)
    print(
        f"{late_streams} of {len(done)} streams had a late chunk ({early} of them started in "
        f"the first {BURST_S:.0f} s); {failed} failed"
    )


if __name__ == "__main__":
    main()
