"""Listeners that hang up the moment their last audio arrives, on a fresh `voxfleet serve`.

Each of 16 clients sends short texts (1 to 4 words) and cancels its call as soon as it has the
number of audio responses that text gives (counted once per text at the start) or the final
response, whichever comes first: a player that hangs up when it has its audio, as many do.
Counts the outcomes and tritonserver's restarts (from the supervisor's log). With the stream's
end in a response of its own after the last audio, such hang-ups crashed tritonserver 2.51
with SIGSEGV about once in 1,000 requests (docs/reliability.md).

    python -m lab.hangups --requests 6000 --out results/reliability-hangups.json.gz
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from engines.bench.results import write_json
from lab.faults import Server, start, stop
from lab.soak import LOST_BACKOFF_S, SoakClient, server_restarts

TEXTS = ("The", "We", "It is a", "Would", "Your appointment", "Turning the volume up.")
CLIENTS = 16


async def hang_up_at_end(server: Server, requests: int, seed: int = 0) -> dict[str, Any]:
    client = SoakClient(server.grpc, "joe")
    rng = random.Random(seed)
    try:
        audio: dict[str, int] = {}
        for text in TEXTS:  # how many audio responses each text gives
            outcome, detail = await client.stream(client.request(text, None), 1000, at_end=True)
            if outcome != "cancelled":
                raise RuntimeError(f"{text!r}: {outcome} {detail}")
            audio[text] = int(detail.split()[0])
        outcomes: Counter[str] = Counter()
        examples: list[str] = []
        sent = 0

        async def listener() -> None:
            nonlocal sent
            while sent < requests:
                sent += 1
                text = rng.choice(TEXTS)
                outcome, detail = await client.stream(
                    client.request(text, None), audio[text], at_end=True
                )
                outcomes[outcome] += 1
                if outcome != "cancelled" and len(examples) < 10:
                    examples.append(f"{text!r}: {outcome} {detail}")
                if outcome == "lost":  # the server went down: wait until it serves again
                    await asyncio.sleep(LOST_BACKOFF_S)
                    while server.ready() != 200:
                        await asyncio.sleep(0.2)

        started = time.monotonic()
        await asyncio.gather(*(listener() for _ in range(CLIENTS)))
        return {
            "requests": sent,
            "outcomes": dict(outcomes),
            "audio_responses_per_text": audio,
            "examples": examples,
            "seconds": round(time.monotonic() - started, 1),
        }
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=6000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    server = start(Path(tempfile.mkdtemp(prefix="voxfleet-hangups-")))
    try:
        result = asyncio.run(hang_up_at_end(server, args.requests))
        result["server_restarts"] = server_restarts(server)
    finally:
        stop(server)
    result["date_utc"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    result["command"] = "python -m lab.hangups " + " ".join(argv or sys.argv[1:])
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        write_json(args.out, result)
    return 1 if result["server_restarts"] or set(result["outcomes"]) - {"cancelled"} else 0


if __name__ == "__main__":
    sys.exit(main())
