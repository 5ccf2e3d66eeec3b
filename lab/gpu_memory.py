"""Where a GPU voice's memory goes: `python -m lab.gpu_memory` (a CUDA GPU).

Builds the stream model's parts one at a time in this process, on one CUDA device, and reads
the device's memory (what nvidia-smi counts for this process) beside PyTorch's allocator
statistics after each: the CUDA context, the voice's weights, the frame stores, the warmup
(captured graphs: their pool, their static buffers, and what lives outside the allocator:
graph executables, cuDNN and cuBLAS handles and workspaces, kernels loaded), the warmup's
transient peak, and, with `--voices N`, N more voices loaded as weight sets (perturbed
copies, lab/voices.py). Last it frees the graphs, and what the device gets back
beyond the allocator's blocks is the graph executables.

It imports only what every version of the data plane has (engines.runtimes.onnx, .streaming,
.plan), so running it as a script with an older `engines` on PYTHONPATH breaks that one down
too. Prints one JSON object; docs/gpu.md gives the figures.

    python -m lab.gpu_memory --windows 128 --sentences 32 --voices 100 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

MIB = 1 << 20


def process_mib() -> float | None:
    """This process's GPU memory as nvidia-smi counts it (None where it cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()):
            return float(used)
    return None


def snapshot(torch: Any) -> dict[str, float]:
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "device_used": (total - free) / MIB,
        "process": process_mib() or float("nan"),
        "allocated": torch.cuda.memory_allocated() / MIB,
        "reserved": torch.cuda.memory_reserved() / MIB,
    }


def graphs_of(runtime: Any) -> list[dict[Any, Any]]:
    stages = [
        getattr(runtime, name, None) for name in ("encoder_stage", "flow_stage", "vocoder_stage")
    ]
    return [stage.graphs for stage in stages if stage is not None]


def call_times(torch: Any, runtime: Any, windows: int, sentences: int) -> dict[str, float]:
    """Milliseconds of the device per call (replayed graphs, median of 20): the vocoder at a
    full step's and at a small batch of steady windows, the flow at a full batch of sentences."""

    def timed(call: Any) -> float:
        call()
        times = []
        for _ in range(20):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return round(sorted(times)[len(times) // 2], 3)

    device = torch.device("cuda")
    calls = {
        f"vocoder_{windows}x144": lambda: runtime.vocode_tensor(
            torch.zeros(windows, 192, 144, device=device)
        ),
        "vocoder_8x144": lambda: runtime.vocode_tensor(torch.zeros(8, 192, 144, device=device)),
        f"flow_{sentences}x512": lambda: runtime.flow_tensor(
            torch.zeros(sentences, 192, 512, device=device),
            torch.ones(sentences, 1, 512, device=device),
        ),
    }
    return {name: timed(call) for name, call in calls.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.gpu_memory", description=__doc__)
    parser.add_argument(
        "--engine-dir", type=Path, help="a torch-cuda engine entry (default: joe's)"
    )
    parser.add_argument("--windows", type=int, default=128, help="max_batch_windows (128)")
    parser.add_argument("--sentences", type=int, default=32, help="max_encoder_batch (32)")
    parser.add_argument("--voices", type=int, default=0, help="more voices to load (weight sets)")
    parser.add_argument("--voices-dir", type=Path, help="engine entries of the voices to load")
    parser.add_argument("--label", default="", help="a name for this run in the output")
    parser.add_argument(
        "--no-autotune",
        action="store_true",
        help="cuDNN's heuristics choose the convolution algorithms instead of timing them",
    )
    parser.add_argument("--json", type=Path, help="also write the result here")
    args = parser.parse_args(argv)

    import torch

    from engines.contract.plan import WindowConfig
    from engines.runtimes import load_stages
    from engines.streaming import StreamScheduler

    windows = replace(
        WindowConfig(), max_batch_windows=args.windows, max_encoder_batch=args.sentences
    )
    engine_dir = args.engine_dir
    if engine_dir is None:
        from engines.build.engine_build import build_engines, resolve_voice_model

        cache = Path(os.environ.get("VOXFLEET_CACHE", "/tmp/voxfleet-cache"))
        engine_dir = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", cache).path
    steps: dict[str, dict[str, float]] = {}
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    steps["context"] = snapshot(torch)
    runtime = load_stages("torch-cuda", engine_dir, windows)
    if args.no_autotune:
        torch.backends.cudnn.benchmark = False
        runtime.autotune = False  # type: ignore[attr-defined]
    steps["runtime"] = snapshot(torch)
    scheduler = StreamScheduler(runtime, 22050, 256, windows)
    steps["scheduler"] = snapshot(torch)
    torch.cuda.reset_peak_memory_stats()
    started = time.monotonic()
    shapes = scheduler.warmup()
    warmup_s = time.monotonic() - started
    steps["warmup"] = snapshot(torch)
    peak_reserved = torch.cuda.max_memory_reserved() / MIB
    voices: dict[str, Any] = {}
    if args.voices and hasattr(runtime, "load_voice"):
        entries = sorted(p for p in (args.voices_dir or Path()).iterdir() if p.is_dir())
        loaded, times = [], []
        for entry in entries[: args.voices]:
            began = time.monotonic()
            loaded.append(runtime.load_voice(entry, entry.name))
            times.append(time.monotonic() - began)
        steps["voices"] = snapshot(torch)
        per_voice = (steps["voices"]["device_used"] - steps["warmup"]["device_used"]) / max(
            1, len(loaded)
        )
        voices = {
            "loaded": len(loaded),
            "weights_mib": round(loaded[0].nbytes / MIB, 2) if loaded else 0,
            "device_mib_per_voice": round(per_voice, 2),
            "load_s_median": round(sorted(times)[len(times) // 2], 3) if times else None,
            "load_s_max": round(max(times), 3) if times else None,
        }
        # A bind: one voice's vocoder weights copied into the bound buffer, as a call does.
        binding = runtime._bindings["vocoder"]  # type: ignore[attr-defined]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for index in range(100):
            voice = loaded[index % len(loaded)]
            binding.bind(voice, voice.flats["vocoder"])
        end.record()
        end.synchronize()
        voices["vocoder_bind_us"] = round(start.elapsed_time(end) * 10, 1)  # ms/100 -> us
    timings = call_times(torch, runtime, args.windows, args.sentences)
    graphs = sum(len(g) for g in graphs_of(runtime))
    for table in graphs_of(runtime):
        table.clear()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    steps["graphs_freed"] = snapshot(torch)

    def delta(key: str, after: str, before: str) -> float:
        return round(steps[after][key] - steps[before][key], 1)

    warm = steps["warmup"]
    outside_before = steps["scheduler"]["device_used"] - steps["scheduler"]["reserved"]
    outside_after = warm["device_used"] - warm["reserved"]
    freed_outside = outside_after - (
        steps["graphs_freed"]["device_used"] - steps["graphs_freed"]["reserved"]
    )
    result = {
        "label": args.label,
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "windows": args.windows,
        "sentences": args.sentences,
        "graphs": graphs,
        "shapes_prepared": shapes,
        "warmup_s": round(warmup_s, 1),
        "breakdown_mib": {
            "cuda_context": round(steps["context"]["device_used"], 1),
            "weights": delta("allocated", "runtime", "context"),
            "frame_stores": delta("allocated", "scheduler", "runtime"),
            "graph_tensors_live": delta("allocated", "warmup", "scheduler"),
            "graph_pool_and_cache_free": round(warm["reserved"] - warm["allocated"], 1),
            "outside_allocator_from_warmup": round(outside_after - outside_before, 1),
            "graph_executables": round(freed_outside, 1),
            "warmup_transient_peak": round(peak_reserved - warm["reserved"], 1),
            "process_total": round(warm["process"], 1),
            "device_total_used": round(warm["device_used"], 1),
        },
        "voices": voices,
        "autotune": not args.no_autotune,
        "call_ms": timings,
        "steps_mib": {k: {n: round(v, 1) for n, v in s.items()} for k, s in steps.items()},
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
