"""A client that streams TEXT again and again, one new connection per stream, until FILE exists.

Run as `python e2e/stream_loop.py --url HOST:PORT --voice NAME --until FILE TEXT`; prints one
JSON line per stream: wall-clock start and end, audio seconds and chunks, or the error. It
streams with `voxfleet say`'s client (engines.client), as an application would.
"""

from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--voice", required=True)
    parser.add_argument("--until", required=True, help="stop once this file exists")
    parser.add_argument("text")
    args = parser.parse_args()
    from engines.client import synthesize

    while not os.path.exists(args.until):
        started = time.time()
        try:
            result = synthesize(args.url, args.text, voice=args.voice)
        except Exception as error:  # reported to the test, which fails on it
            print(json.dumps({"started": started, "ended": time.time(), "error": str(error)}),
                  flush=True)
            continue
        print(
            json.dumps(
                {
                    "started": started,
                    "ended": time.time(),
                    "audio_seconds": result.audio_seconds,
                    "chunks": len(result.chunks),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
