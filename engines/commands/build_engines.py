"""`voxfleet build-engines`: build (or find) a voice's engines in the engine cache."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from engines.contract.plan import PRECISIONS, RUNTIME_NAMES, RUNTIMES

RUNTIME_CHOICES = RUNTIME_NAMES
PRECISION_CHOICES = PRECISIONS


def runtime_help() -> str:
    return "; ".join(f"{info.name}: {info.description}" for info in RUNTIMES.values())


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build-engines",
        help="build a voice's stage engines into the content-addressed engine cache",
        description=(
            "Build the encoder, flow and vocoder engines of a voice for one runtime and "
            "precision, into CACHE/<key>/ with a manifest. Does nothing when a whole entry "
            "with the same key exists; rebuilds a damaged one. Prints the entry as JSON."
        ),
    )
    parser.add_argument(
        "--voice",
        default="joe",
        help="embedded voice name, path to a Piper .onnx (or its folder), or http(s) URL",
    )
    parser.add_argument(
        "--plan",
        metavar="JSON",
        help="the voice's serving plan (what the operator's engine-build Job passes): runtime, "
        "precision and the windows that size TensorRT's profiles come from it",
    )
    parser.add_argument(
        "--runtime",
        choices=RUNTIME_CHOICES,
        default=None,
        help=f"{runtime_help()} (default onnxruntime)",
    )
    parser.add_argument(
        "--precision",
        choices=PRECISION_CHOICES,
        default=None,
        help="default: the runtime's first ("
        + ", ".join(f"{i.name} {i.default_precision}" for i in RUNTIMES.values())
        + ")",
    )
    parser.add_argument("--cache", required=True, type=Path, help="engine cache directory")
    parser.add_argument(
        "--gpu-product",
        help="build for this GPU (node label spelling, e.g. Tesla-T4) instead of the local "
        "one; torch-cuda only, as its artifacts need no GPU to build",
    )
    parser.add_argument("--compute-capability", help="with --gpu-product, e.g. 7.5")
    parser.add_argument(
        "--max-batch", type=int, default=None, help="TensorRT profiles: most windows per call"
    )
    parser.add_argument("--force", action="store_true", help="rebuild even a whole entry")
    parser.add_argument(
        "--publish-as",
        metavar="NAME",
        help="also publish the entry as CACHE/NAME (an atomic symlink): the operator's engine "
        "key, the path its Triton pods load the voice from",
    )
    parser.add_argument(
        "--sha256",
        default=os.environ.get("VOXFLEET_VOICE_SHA256") or None,
        help="refuse a voice .onnx whose sha256 differs (default: $VOXFLEET_VOICE_SHA256)",
    )
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from engines.build.engine_build import (
        EngineBuildError,
        Target,
        build_engines,
        check_voice_digest,
        default_precision,
        publish_entry,
        resolve_voice_model,
    )
    from engines.contract.plan import ServingPlan, WindowConfig

    try:
        windows: WindowConfig | None = None
        if args.plan:
            if args.runtime or args.precision or args.max_batch is not None:
                raise EngineBuildError(
                    "--plan names the runtime, precision and batch sizes; leave out --runtime, "
                    "--precision and --max-batch"
                )
            plan = ServingPlan.from_json(args.plan)
            args.runtime, args.precision, windows = plan.runtime, plan.precision, plan.windows
        args.runtime = args.runtime or "onnxruntime"
        target = None
        if args.gpu_product or args.compute_capability:
            if args.runtime != "torch-cuda" or not (args.gpu_product and args.compute_capability):
                raise EngineBuildError(
                    "--gpu-product and --compute-capability go together, and only with "
                    "--runtime torch-cuda (TensorRT plans must be built on the GPU they run on)"
                )
            import torch

            target = Target(
                runtime_version=f"torch-{torch.__version__}-cuda-{torch.version.cuda}",
                gpu_product=args.gpu_product,
                compute_capability=args.compute_capability,
            )
        profiles = None
        if args.max_batch is not None:
            from engines.runtimes.tensorrt.profiles import ServingShapes, stage_profiles

            profiles = stage_profiles(
                ServingShapes(max_batch=args.max_batch, opt_batch=min(64, args.max_batch))
            )
        model_path = resolve_voice_model(args.voice, download_dir=args.cache / "downloads")
        if args.sha256:
            check_voice_digest(model_path, args.sha256)
        precision = args.precision or default_precision(args.runtime)
        started = time.monotonic()
        entry = build_engines(
            model_path,
            args.runtime,
            precision,
            args.cache,
            profiles=profiles,
            target=target,
            force=args.force,
            windows=windows,
        )
        published = publish_entry(entry.path, args.publish_as) if args.publish_as else None
    except (EngineBuildError, ValueError, OSError) as error:
        print(f"voxfleet build-engines: {error}", file=sys.stderr)
        return 2
    report = {
        "entry": str(entry.path),
        "key": entry.key.digest(),
        "built": entry.built,
        "seconds": round(time.monotonic() - started, 3),
        "runtime": entry.key.runtime,
        "precision": entry.key.precision,
        "gpu_product": entry.key.gpu_product,
        "files": {name: info["bytes"] for name, info in entry.files.items()},
        "published": str(published) if published else None,
    }
    print(json.dumps(report, indent=2))
    return 0
