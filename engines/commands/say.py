"""`voxfleet say`: stream one text from a server into a WAV file (or raw PCM on stdout).

`--url` is looked up as `engines.client.tts.TtsClient` does: a name that resolves to several pods
(a voice's headless Service) sends the stream to one of them, and to another where one
refuses it before any audio (full, or stopping)."""

from __future__ import annotations

import argparse
import json
import sys

from engines.commands.arguments import seconds


def report(result, out: str, as_json: bool) -> None:  # result: engines.client.tts.StreamResult
    first_ms = (result.first_audio_s or 0.0) * 1000
    if as_json:
        print(
            json.dumps(
                {
                    "first_audio_ms": round(first_ms, 2),
                    "chunks": len(result.chunks),
                    "audio_seconds": round(result.audio_seconds, 3),
                    "rtf": round(result.rtf, 4),
                    "refusals": result.refusals,
                }
            )
        )
    else:
        target = "stdout" if out == "-" else out
        print(
            f"first audio after {first_ms:.0f} ms; {result.audio_seconds:.2f} s of audio in "
            f"{len(result.chunks)} chunks; real-time factor {result.rtf:.3f} → {target}",
            file=sys.stderr if out == "-" else sys.stdout,
        )


def handle(args: argparse.Namespace) -> int:
    from engines.client.tts import SynthesisError, synthesize, write_wav

    try:
        result = synthesize(
            args.url,
            args.text,
            voice=args.voice,
            speaker_id=args.speaker,
            connect_timeout_s=args.connect_timeout,
            refused_retry_s=args.refused_retry,
        )
    except SynthesisError as error:
        code = f" ({error.code})" if error.code else ""
        print(f"voxfleet say: {error}{code}", file=sys.stderr)
        return 1
    except Exception as error:  # connection refused and friends
        print(f"voxfleet say: cannot reach {args.url}: {error}", file=sys.stderr)
        return 1
    if args.output == "-":
        sys.stdout.buffer.write(result.audio.astype("<i2").tobytes())
        sys.stdout.buffer.flush()
    else:
        write_wav(args.output, result.audio, result.sample_rate)
    if args.json and args.output == "-":
        print("voxfleet say: --json needs -o FILE (stdout carries the audio)", file=sys.stderr)
        return 2
    report(result, args.output, args.json)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("say", help="speak TEXT through a voxfleet server")
    parser.add_argument("text", metavar="TEXT")
    parser.add_argument("-o", "--output", default="out.wav", help="WAV file, or - for raw PCM")
    parser.add_argument("--voice", default="joe")
    parser.add_argument(
        "--url",
        default="localhost:8001",
        help="Triton gRPC HOST:PORT: a server, a voice's Service, or its headless Service "
        "(<voice>-tts-pods.<namespace>.svc:8001), whose pods each get a try when one is full",
    )
    parser.add_argument("--speaker", type=int, default=None, help="speaker id (multi-speaker)")
    parser.add_argument("--json", action="store_true", help="print one JSON object of timings")
    parser.add_argument(
        "--refused-retry",
        type=seconds,
        default=10.0,
        metavar="S",
        help="ask again for S seconds when a full server refuses the stream before its first "
        "audio (RESOURCE_EXHAUSTED), over a new connection each time (default 10; 0: never)",
    )
    parser.add_argument(
        "--connect-timeout",
        type=seconds,
        default=10.0,
        metavar="SECONDS",
        help="keep trying to reach the server for this long before giving up (default 10; "
        "a Service's endpoint can lag its pods' readiness by a moment); 0: try once",
    )
    parser.set_defaults(func=handle)
