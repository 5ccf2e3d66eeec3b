"""`voxfleet serve`: build engines, write the model repository, run Triton in the foreground.

Triton runs under the supervisor of engines/pod/supervisor.py, as in a pool pod: a voice whose
backend process dies is healed by a server restart, GET /ready and /live answer on the
health port, and SIGINT or SIGTERM (whatever this process inherited) drain the streams in
flight, refuse new ones with UNAVAILABLE, and stop as soon as none is left.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engines.commands.api import DEFAULT_API_PORT, add_gateway_arguments
from engines.commands.build_engines import PRECISION_CHOICES, RUNTIME_CHOICES, runtime_help
from engines.contract import names
from engines.contract.plan import ENCODER_LAUNCHES, ENCODER_PRECISIONS

GPU_SERVER_ARGS = ["--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0"]


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
        help=f"stage runtime (default onnxruntime): {runtime_help()}",
    )
    parser.add_argument("--precision", choices=PRECISION_CHOICES, help="default: the runtime's")
    parser.add_argument(
        "--first-window-frames",
        type=int,
        default=None,
        help="frames of a stream's first window, whose audio is its first chunk; its windows "
        "then grow to the steady size (default 16; a TTSVoice's streaming.firstWindowFrames)",
    )
    parser.add_argument(
        "--max-batch-windows",
        type=int,
        default=None,
        help="most windows in one flow/vocoder call (default 128)",
    )
    parser.add_argument(
        "--max-encoder-batch",
        type=int,
        default=None,
        help="most sentences in one encoder call (default 32)",
    )
    parser.add_argument(
        "--max-lead-ms",
        type=int,
        default=None,
        help="audio a playing stream may have sent ahead of its playback before it waits "
        "(default 0: no limit)",
    )
    parser.add_argument(
        "--paced-step-ms",
        type=int,
        default=None,
        help="on a GPU, with streams resting on their lead, the least time between steps that "
        "leave no work waiting, so streams that come due meanwhile share one step's calls "
        "(default 30; 0: a step as soon as one stream is due)",
    )
    parser.add_argument(
        "--encoder-launch",
        choices=ENCODER_LAUNCHES,
        default=None,
        help="how the torch-cuda runtime runs encoder calls: queued behind the windows on "
        "their stream (the default), in the step (inline), or beside the windows on a CUDA "
        "stream of their own",
    )
    parser.add_argument(
        "--encoder-precision",
        choices=ENCODER_PRECISIONS,
        default=None,
        help="what the torch-cuda runtime runs the encoder's text part at: fp32 (the default, "
        "the voice's own audio), or fp16 or bf16 (faster; a phoneme in about a thousand is a "
        "frame longer or shorter, docs/gpu.md)",
    )
    parser.add_argument("--no-batching", action="store_true", help="turn cross-stream batching off")
    parser.add_argument(
        "--max-text-bytes", type=int, default=5000, help="longest TEXT accepted (default 5000)"
    )
    parser.add_argument(
        "--max-streams",
        type=int,
        default=0,
        help="live streams per voice before RESOURCE_EXHAUSTED (0: no limit)",
    )


def plan_from_args(args: argparse.Namespace):  # -> list[ServingPlan], imported lazily
    from dataclasses import replace

    from engines.commands.local_serving import plan_local_voices
    from engines.contract.plan import ServingPlan, WindowConfig

    # Each of these options sets the WindowConfig field of its name where it is given.
    given = {
        name: getattr(args, name)
        for name in (
            "first_window_frames",
            "max_batch_windows",
            "max_encoder_batch",
            "max_lead_ms",
            "paced_step_ms",
            "encoder_launch",
            "encoder_precision",
        )
        if getattr(args, name) is not None
    }
    windows = replace(WindowConfig(), **given)
    template = ServingPlan(
        name="template",
        engine_dir="",
        runtime=args.runtime,
        precision=args.precision or "",
        windows=windows,
        cross_stream_batching=not args.no_batching,
        max_text_bytes=args.max_text_bytes,
        max_streams_per_pod=args.max_streams,
    )
    return plan_local_voices(args.voice, args.cache, template=template)


def handle(args: argparse.Namespace) -> int:
    from engines.build.engine_build import EngineBuildError
    from engines.commands.local_serving import local_server
    from engines.contract.plan import check_mps
    from engines.pod.mps import MpsDaemon
    from engines.pod.supervisor import Supervisor, TritonEndpoints
    from engines.pod.triton_server import EXIT_TIMEOUT_SECONDS, TritonError, server_env
    from engines.pod.voice_host.process import HostOptions
    from engines.text.voice import VoiceError

    try:
        if args.mps:
            check_mps(args.runtime, "--mps")
        plans = plan_from_args(args)
        # A GPU model moves request data to the device itself: requests stay in host memory.
        gpu = any(plan.runtime_info.needs_gpu for plan in plans)
        extra = GPU_SERVER_ARGS if gpu else []
        server = local_server(
            plans,
            args.grpc_port,
            args.http_port,
            args.metrics_port,
            None,
            extra,
            instances=args.instances,
        )
        # The voice host starts each plan's architecture (its warmup: most of a GPU pod's
        # start) at once, beside tritonserver's own start, not when the voice is loaded.
        prepare = []
        for plan in plans:
            path = server.work_dir / f"prepare-{plan.name}.json"
            path.write_text(json.dumps(plan.to_dict()))
            prepare.append(str(path))
        endpoints = TritonEndpoints(
            http_port=server.http_port,
            metrics_port=server.metrics_port,
            exit_timeout_s=EXIT_TIMEOUT_SECONDS,
        )
        supervisor = Supervisor(
            server.command(),
            server_env(),
            endpoints,
            server.work_dir / "supervisor",
            health_port=args.health_port or None,
            mps=MpsDaemon(server.work_dir) if args.mps else None,
            host_options=HostOptions(prepare=tuple(prepare)),
        )
        supervisor.install_signal_handlers()
        print(f"voxfleet: serving {', '.join(p.name for p in plans)}", file=sys.stderr)
        supervisor.start()
    except (VoiceError, EngineBuildError, TritonError, ValueError, OSError) as error:
        print(f"voxfleet serve: {error}", file=sys.stderr)
        return 1
    gateway = None
    if args.api_port:
        # The speech API runs as a process of its own beside Triton (its own interpreter and
        # CPU time); it answers 503 until Triton is ready.
        from engines.commands.api import gateway_command, start_gateway_process

        gateway = start_gateway_process(
            gateway_command(
                server.grpc_url,
                args.api_host,
                args.api_port,
                args.voice_alias,
                args.default_voice,
                args.api_keys_file,
            )
        )
    try:
        return _run(args, supervisor, server, gpu)
    finally:
        if gateway is not None:
            from engines.commands.api import stop_gateway_process

            stop_gateway_process(gateway)


def _run(args: argparse.Namespace, supervisor, server, gpu: bool) -> int:
    # GPU runtimes capture CUDA graphs for every call shape before the model is ready.
    if not supervisor.wait_ready(600 if gpu else 120):
        if supervisor.stopping:
            return supervisor.run()
        print("voxfleet serve: tritonserver did not become ready", file=sys.stderr)
        supervisor.run_down()
        return 1
    health = f", health http://127.0.0.1:{args.health_port}" if args.health_port else ""
    api = f", speech API http://{args.api_host}:{args.api_port}/v1" if args.api_port else ""
    print(
        f"voxfleet: ready — gRPC {server.grpc_url}, HTTP {server.http_url}, "
        f"metrics {server.metrics_url}{health}{api}; Ctrl-C stops",
        file=sys.stderr,
    )
    code = supervisor.run()
    print("voxfleet: Triton stopped", file=sys.stderr)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve voices on a local Triton server")
    add_plan_arguments(parser)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    parser.add_argument(
        "--instances",
        type=int,
        default=1,
        help="stream-model instances per voice: processes that take its requests and send its "
        "responses, sharing the voice host's one scheduler and the voice's weights (default 1)",
    )
    parser.add_argument(
        "--mps",
        action="store_true",
        help="run the backend processes on the GPU through a CUDA MPS daemon of the server's "
        "own, so that several instances or voices run on it at once instead of in turns "
        "(needs nvidia-cuda-mps-control; docs/gpu.md)",
    )
    parser.add_argument(
        "--health-port",
        type=int,
        default=names.HEALTH_PORT,
        help=f"readiness (GET {names.READY_PATH}) and liveness (GET {names.LIVE_PATH}); 0: none",
    )
    parser.add_argument(
        "--api-port",
        type=int,
        default=DEFAULT_API_PORT,
        help=f"port of the OpenAI-compatible speech API (default {DEFAULT_API_PORT}); 0: none "
        "(docs/speech-api.md)",
    )
    parser.add_argument(
        "--api-host",
        default="127.0.0.1",
        help="address the speech API listens on (default 127.0.0.1: this machine only)",
    )
    add_gateway_arguments(parser)
    parser.set_defaults(func=handle)
