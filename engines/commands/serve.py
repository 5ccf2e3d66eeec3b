"""`voxfleet serve`: build engines, write the model repository, run Triton in the foreground."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engines.commands.build_engines import RUNTIME_CHOICES


def add_plan_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--voice",
        action="append",
        default=[],
        metavar="NAME|PATH",
        help="a voice to serve: an embedded name (joe) or a Piper .onnx path; repeatable",
    )
    parser.add_argument("--cache", type=Path, help="engine cache directory")
    parser.add_argument(
        "--runtime",
        choices=RUNTIME_CHOICES,
        default="onnxruntime",
        help="stage runtime: onnxruntime on the CPU (default), torch-cuda (a GPU with PyTorch) "
        "or tensorrt (NVIDIA's TensorRT images only)",
    )
    parser.add_argument("--no-batching", action="store_true", help="turn cross-stream batching off")
    parser.add_argument(
        "--max-text-bytes", type=int, default=5000, help="longest TEXT accepted (default 5000)"
    )
    parser.add_argument(
        "--max-streams", type=int, default=0, help="streams per voice before UNAVAILABLE (0: none)"
    )


def plan_from_args(args: argparse.Namespace):  # -> ServingPlan, imported lazily
    from engines.serving import plan_local_voices
    from engines.voice_plan import VoicePlan

    template = VoicePlan(
        name="template",
        engine_dir="",
        voice_config_path="",
        runtime=args.runtime,
        cross_stream_batching=not args.no_batching,
        max_text_bytes=args.max_text_bytes,
        max_streams=args.max_streams,
    )
    return plan_local_voices(args.voice, args.cache, runtime=args.runtime, template=template)


def handle(args: argparse.Namespace) -> int:
    from engines.engine_build import EngineBuildError
    from engines.serving import local_server
    from engines.triton_server import TritonError
    from engines.voice import VoiceError

    try:
        plan = plan_from_args(args)
        server = local_server(plan, args.grpc_port, args.http_port, args.metrics_port)
        print(f"voxfleet: serving {', '.join(v.name for v in plan.voices)}", file=sys.stderr)
        server.start(stdout_to_log=False)
    except (VoiceError, EngineBuildError, TritonError, ValueError) as error:
        print(f"voxfleet serve: {error}", file=sys.stderr)
        return 1
    print(
        f"voxfleet: ready — gRPC {server.grpc_url}, HTTP {server.http_url}, "
        f"metrics {server.metrics_url}; Ctrl-C stops",
        file=sys.stderr,
    )
    code = server.run_foreground()
    print("voxfleet: Triton stopped", file=sys.stderr)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve voices on a local Triton server")
    add_plan_arguments(parser)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.set_defaults(func=handle)
