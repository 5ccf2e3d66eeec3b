"""`voxfleet demo`: a local Triton with the default voice speaks the reference sentence."""

from __future__ import annotations

import argparse
import sys

REFERENCE_SENTENCE = (
    "The quick brown fox jumps over the lazy dog, while the streaming speech service answers "
    "thousands of listeners at once without a pause."
)


def handle(args: argparse.Namespace) -> int:
    from engines.client.tts import SynthesisError, synthesize, write_wav
    from engines.commands.local_serving import local_server, plan_local_voices

    print("voxfleet demo: building engines (cached after the first run)…", file=sys.stderr)
    plan = plan_local_voices([args.voice])
    server = local_server(plan)
    print("voxfleet demo: starting Triton on the CPU…", file=sys.stderr)
    with server.start():
        try:
            synthesize(server.grpc_url, "Warming up.", voice=plan[0].name)
            runs = [
                synthesize(server.grpc_url, args.text, voice=plan[0].name)
                for _ in range(args.repeat)
            ]
        except SynthesisError as error:
            print(f"voxfleet demo: {error}", file=sys.stderr)
            return 1
    best = min(runs, key=lambda r: r.first_audio_s or 0.0)
    write_wav(args.output, best.audio, best.sample_rate)
    firsts = sorted((r.first_audio_s or 0.0) * 1000 for r in runs)
    rtfs = sorted(r.rtf for r in runs)
    print(f"wrote {args.output}: {best.audio_seconds:.2f} s of audio in {len(best.chunks)} chunks")
    print(
        f"time to first audio: median {firsts[len(firsts) // 2]:.0f} ms "
        f"(min {firsts[0]:.0f}, max {firsts[-1]:.0f}) over {len(runs)} runs"
    )
    print(f"real-time factor:    median {rtfs[len(rtfs) // 2]:.3f} (min {rtfs[0]:.3f})")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("demo", help="speak the reference sentence on a local Triton")
    parser.add_argument("-o", "--output", default="demo.wav")
    parser.add_argument("--voice", default="joe")
    parser.add_argument("--text", default=REFERENCE_SENTENCE)
    parser.add_argument("--repeat", type=int, default=5, help="timed runs (default 5)")
    parser.set_defaults(func=handle)
