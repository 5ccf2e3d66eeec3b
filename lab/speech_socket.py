"""The speech API's WebSocket under an LLM-like token stream: how soon the first audio comes
after the first sentence is complete, and how soon `input_text.clear` stops the audio.

Each trial opens a session, streams a reply token by token (words with their leading space,
punctuation apart) at `--tokens-per-second`, and records:
- `boundary_to_first_audio_ms`: from sending the token that completes the first sentence
  (the one after its period: only then is the end certain) to the first audio delta;
- `period_to_first_audio_ms`: the same from the token that holds the period;
- `clear_to_quiet_ms`: a second turn with a long text; once its audio flows, `clear` is sent;
  the time until `input_text.cleared` (after which no audio of the turn comes), and
  `audio_after_clear`, the deltas that still arrived in between.

    python -m lab.speech_socket --url http://127.0.0.1:8080 --trials 20 --json F
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from engines.bench.results import write_json
from engines.bench.stats import percentile

REPLY = (
    "Sure, I can help with that. The train leaves at nine in the morning from platform four. "
    "Bring your ticket and arrive a few minutes early, because the doors close on time."
)
LONG = " ".join(["This sentence is one of many in a long answer that goes on."] * 10)


def llm_tokens(text: str) -> list[str]:
    return re.findall(r"\s?\w+|\s?[^\w\s]", text)


async def _next(socket: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(socket.recv(), timeout_s))


async def trial(url: str, voice: str, tokens_per_second: float) -> dict[str, float]:
    import websockets

    socket_url = url.replace("http://", "ws://").rstrip("/") + "/v1/audio/speech/stream"
    tokens = llm_tokens(REPLY)
    period = next(i for i, t in enumerate(tokens) if t.strip() == ".")
    sent: dict[int, float] = {}
    async with websockets.connect(socket_url) as socket:
        await _next(socket)
        await socket.send(json.dumps({"type": "session.update", "session": {"voice": voice}}))
        await _next(socket)

        async def write() -> None:
            for index, token in enumerate(tokens):
                await socket.send(json.dumps({"type": "input_text.append", "text": token}))
                sent[index] = time.perf_counter()
                await asyncio.sleep(1 / tokens_per_second)
            await socket.send(json.dumps({"type": "input_text.flush"}))

        writer = asyncio.ensure_future(write())
        first = await _next(socket)
        first_audio = time.perf_counter()
        if first["type"] != "speech.audio.delta":
            raise RuntimeError(f"expected audio first, got {first}")
        while (await _next(socket))["type"] != "speech.audio.done":
            pass
        await writer

        # Barge-in: a long turn, cleared once its audio flows.
        await socket.send(json.dumps({"type": "input_text.append", "text": LONG}))
        await socket.send(json.dumps({"type": "input_text.flush"}))
        for _ in range(3):
            while (await _next(socket))["type"] != "speech.audio.delta":
                pass
        await socket.send(json.dumps({"type": "input_text.clear"}))
        cleared_at = time.perf_counter()
        late = 0
        while (event := await _next(socket))["type"] != "input_text.cleared":
            late += event["type"] == "speech.audio.delta"
        quiet = time.perf_counter()
        await socket.send(json.dumps({"type": "session.close"}))
        while (await _next(socket))["type"] != "session.closed":
            pass
    return {
        "boundary_to_first_audio_ms": (first_audio - sent[period + 1]) * 1000,
        "period_to_first_audio_ms": (first_audio - sent[period]) * 1000,
        "first_audio_before_last_token": float(first_audio < sent[len(tokens) - 1]),
        "clear_to_quiet_ms": (quiet - cleared_at) * 1000,
        "audio_after_clear": float(late),
    }


def summarise(trials: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        key: {
            "p50": percentile([t[key] for t in trials], 50),
            "p95": percentile([t[key] for t in trials], 95),
            "max": max(t[key] for t in trials),
            "mean": statistics.mean(t[key] for t in trials),
        }
        for key in trials[0]
    }


async def run(url: str, voice: str, trials: int, tokens_per_second: float) -> dict[str, Any]:
    await trial(url, voice, tokens_per_second)  # warm-up, not counted
    results = [await trial(url, voice, tokens_per_second) for _ in range(trials)]
    return {
        "url": url,
        "voice": voice,
        "tokens_per_second": tokens_per_second,
        "trials": results,
        "summary": summarise(results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.speech_socket")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--voice", default="joe")
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--tokens-per-second", type=float, default=20.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.url, args.voice, args.trials, args.tokens_per_second))
    result["date_utc"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    if args.json:
        write_json(args.json, result)
    for key, values in result["summary"].items():
        print(f"{key}: p50 {values['p50']:.1f}, p95 {values['p95']:.1f}, max {values['max']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
