"""Where a torch-cuda architecture's start goes, by part and by captured graph, and what a
setting of the runtime changes in it: `python -m lab.warmup_costs` (a CUDA GPU).

    python -m lab.warmup_costs --engine-dir ENTRY \
        --variants VOXFLEET_AUTOTUNE_MIN_ROWS=1,default --out warmup-costs.json

A pod is ready once its first voice's architecture has captured its graphs
(`StreamScheduler.warmup`), and most of that is the vocoder's, whose captures autotune
cuDNN's algorithms (engines/runtimes/torch_cuda/stages.py, AUTOTUNED_STAGES). For each variant
(`default`: the runtime as it is; else `NAME=VALUE[+NAME=VALUE...]`, environment variables
the runtime reads, such as `VOXFLEET_AUTOTUNE_MIN_ROWS`) one fresh process, one after another
on the same GPU, reports:

- `start_s`: from the process's spawn to `import torch` done, to CUDA's first call done, to
  the runtime made from the entry (`runtime_s`), to the scheduler's warmup done (`warmup_s`,
  its calibration included);
- `warmup_report`: the runtime's own, graphs and seconds by stage;
- `captures`: each stage's capture seconds summed by batch bucket (warm runs, autotuning and
  the capture), and `slowest`: the ten slowest captures;
- `calls_ms`: after the warmup, the median time of a replayed call of each stage at each
  bucket of its widest shape (the vocoder's and flow's widest window, the encoder's
  320-phoneme sentences), so that a variant's shorter warmup is weighed against its calls.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any


def parse_variant(text: str) -> dict[str, str]:
    """`default` → {}; `A=1+B=2` → {"A": "1", "B": "2"}; ValueError otherwise."""
    if text == "default":
        return {}
    settings = {}
    for part in text.split("+"):
        name, equals, value = part.partition("=")
        if not equals or not name.strip():
            raise ValueError(f"a variant is 'default' or NAME=VALUE[+NAME=VALUE...], not {text!r}")
        settings[name.strip()] = value.strip()
    return settings


def _child(args: argparse.Namespace) -> dict[str, Any]:
    marks = {"spawned": args.spawned_at}
    import torch

    marks["torch_imported"] = time.time()
    device = args.device
    cuda = device == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    torch.zeros(1, device=device)
    sync()
    marks["cuda_ready"] = time.time()
    from engines.contract.plan import WindowConfig
    from engines.runtimes.torch_cuda import load
    from engines.runtimes.torch_cuda.stages import GraphedStage, TorchCudaStages
    from engines.streaming import StreamScheduler
    from engines.text.voice import read_voice_config
    from lab.gpu_bench import median_seconds

    def _ms(call: Any) -> float:
        return median_seconds(call, repeats=20) * 1e3

    if cuda:
        windows = WindowConfig()
        runtime: Any = load(args.engine_dir, windows)
    else:  # a smoke run of this script only: no graphs, nothing captured, small calls
        windows = WindowConfig(max_batch_windows=2, max_encoder_batch=2)
        runtime = TorchCudaStages(
            args.engine_dir, device=device, use_graphs=False, batch_buckets=(1, 2)
        )
    marks["runtime_made"] = time.time()
    names = {
        id(runtime.encoder_stage): "encoder",
        id(runtime.flow_stage): "flow",
        id(runtime.vocoder_stage): "vocoder",
    }
    captures: list[dict[str, Any]] = []
    plain = GraphedStage._capture

    def timed(self: GraphedStage, bucket: int, inputs: dict, autotune: Any = None) -> Any:
        sync()
        started = time.perf_counter()
        captured = plain(self, bucket, inputs, autotune)
        sync()
        shape = next(list(t.shape[1:]) for t in inputs.values())
        captures.append(
            {
                "stage": names.get(id(self), "?"),
                "bucket": bucket,
                "shape": shape,
                "seconds": round(time.perf_counter() - started, 4),
            }
        )
        return captured

    GraphedStage._capture = timed  # type: ignore[method-assign]
    config = read_voice_config(args.engine_dir / "voice.onnx.json")
    scheduler = StreamScheduler(
        runtime, sample_rate=config.sample_rate, hop_length=config.hop_length, windows=windows
    )
    shapes = scheduler.warmup()
    sync()
    marks["warmed"] = time.time()
    GraphedStage._capture = plain  # type: ignore[method-assign]
    by_bucket: dict[str, dict[int, float]] = {}
    for capture in captures:
        stage = by_bucket.setdefault(capture["stage"], {})
        stage[capture["bucket"]] = stage.get(capture["bucket"], 0.0) + capture["seconds"]
    vocoder_frames = max(windows.vocoder_call_frames())
    flow_frames = max(windows.flow_call_frames())
    calls: dict[str, dict[int, float]] = {"vocoder": {}, "flow": {}, "encoder": {}}
    buckets = [b for b in runtime.vocoder_stage.buckets if b <= args.max_bucket]
    scales = torch.tensor([0.667, 1.0, 0.8])
    for bucket in buckets:
        latent = torch.randn(bucket, 192, vocoder_frames, device=device)
        prior = torch.randn(bucket, 192, flow_frames, device=device)
        mask = torch.ones(bucket, 1, flow_frames, device=device)
        calls["vocoder"][bucket] = _ms(partial(runtime.vocode_tensor, latent))
        calls["flow"][bucket] = _ms(partial(runtime.flow_tensor, prior, mask))
    encoder_buckets = runtime.encoder_stage.buckets if runtime.encoder_stage is not None else ()
    for bucket in [b for b in encoder_buckets if b <= args.max_bucket]:
        ids = torch.full((bucket, 320), 20, dtype=torch.int64)
        lengths = torch.full((bucket,), 320)
        calls["encoder"][bucket] = _ms(partial(runtime.encode_tensor, ids, lengths, scales))
    order = ["spawned", "torch_imported", "cuda_ready", "runtime_made", "warmed"]
    return {
        "variant": args.variant,
        "device": torch.cuda.get_device_name(0) if cuda else device,
        "torch": torch.__version__,
        "shapes": shapes,
        "start_s": {
            later: round(marks[later] - marks[earlier], 2)
            for earlier, later in itertools.pairwise(order)
        },
        "total_s": round(marks["warmed"] - marks["spawned"], 2),
        "warmup_report": runtime.warmup_report(),
        "captures": {
            stage: {str(b): round(s, 2) for b, s in sorted(buckets.items())}
            for stage, buckets in by_bucket.items()
        },
        "slowest": sorted(captures, key=lambda c: -c["seconds"])[:10],
        "calls_ms": {
            stage: {str(b): round(ms, 3) for b, ms in sorted(by.items())}
            for stage, by in calls.items()
        },
        "vocoder_frames": vocoder_frames,
        "flow_frames": flow_frames,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.warmup_costs", description=__doc__)
    parser.add_argument("--engine-dir", type=Path, required=True, help="a torch-cuda entry")
    parser.add_argument(
        "--variants",
        default="VOXFLEET_AUTOTUNE_MIN_ROWS=1,default",
        help="comma-separated: default, or NAME=VALUE[+NAME=VALUE...]",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (no graphs)")
    parser.add_argument("--max-bucket", type=int, default=256, help="largest batch timed")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--spawned-at", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--variant", default="default", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.out.write_text(json.dumps(_child(args)))
        return 0
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    try:
        settings = [parse_variant(variant) for variant in variants]
    except ValueError as error:
        parser.error(str(error))
    runs = []
    for variant, setting in zip(variants, settings, strict=True):
        env = {**os.environ, **setting}
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [
                sys.executable,
                "-m",
                "lab.warmup_costs",
                "--child",
                f"--engine-dir={args.engine_dir}",
                f"--out={out.name}",
                f"--spawned-at={time.time()}",
                f"--variant={variant}",
                f"--device={args.device}",
                f"--max-bucket={args.max_bucket}",
            ]
            subprocess.run(command, env=env, check=True)
            run = json.loads(Path(out.name).read_text())
        runs.append(run)
        summary = {
            "variant": variant,
            "total_s": run["total_s"],
            "start_s": run["start_s"],
            "warmup": {k: v["seconds"] for k, v in run["warmup_report"].items()},
            "vocoder_ms": run["calls_ms"]["vocoder"],
        }
        print(json.dumps(summary), flush=True)
        args.out.write_text(json.dumps({"runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
