"""Serve voices on a real Triton with the torch-cuda runtime (the GPU benchmark's server).

    python -m engines.torch_cuda.serve_gpu --voice joe --grpc-port 18000 [--no-batching]

`voxfleet serve` with the torch-cuda runtime and GPU-sized scheduler windows: the stream
model's defaults (64 windows and 8 sentences per step) are sized for CPUs; on an H100 the
in-process benchmark holds first audio under 150 ms at 4x the load with 128 and 32
(docs/benchmarks.md#gpu). CUDA graphs for every call shape are captured while the model
loads (the stream model's warmup; ``VOXFLEET_WARMUP=0`` skips it), so the first requests
do not pay for them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--voice", action="append", default=[])
    parser.add_argument("--cache", type=Path, default=None)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--http-port", type=int, default=None)
    parser.add_argument("--no-batching", action="store_true")
    parser.add_argument("--max-batch-windows", type=int, default=128)
    parser.add_argument("--max-encoder-batch", type=int, default=32)
    args = parser.parse_args(argv)

    from engines.serving import local_server, plan_local_voices
    from engines.streaming import WindowConfig
    from engines.voice_plan import VoicePlan

    os.environ.setdefault("VOXFLEET_TORCH_MAX_WINDOWS", str(args.max_batch_windows))
    os.environ.setdefault("VOXFLEET_TORCH_MAX_SENTENCES", str(args.max_encoder_batch))
    template = VoicePlan(
        name="template",
        engine_dir="",
        voice_config_path="",
        runtime="torch-cuda",
        windows=WindowConfig(
            max_batch_windows=args.max_batch_windows, max_encoder_batch=args.max_encoder_batch
        ),
        cross_stream_batching=not args.no_batching,
    )
    plan = plan_local_voices(args.voice or ["joe"], args.cache, "torch-cuda", template)
    server = local_server(
        plan,
        args.grpc_port,
        args.http_port or args.grpc_port + 2,
        args.metrics_port or args.grpc_port + 1,
        # Requests stay in ordinary host memory: the model moves data to the GPU itself.
        extra_args=["--pinned-memory-pool-byte-size=0", "--cuda-memory-pool-byte-size=0:0"],
    )
    server.start(timeout_s=600)
    print(f"serve_gpu: ready on gRPC {server.grpc_url}; log {server.log_path}", file=sys.stderr)
    return server.run_foreground()


if __name__ == "__main__":
    raise SystemExit(main())
