"""The most sentences a second the torch-cuda runtime could encode on this GPU: the budget a
burst of new listeners draws on (docs/benchmarks.md, "What 2,000 streams need").

For encoder calls of 24, 32 and 64 corpus sentences (the largest batch buckets) this times:
- the whole call as the scheduler makes it (`encode_split_probe.one_call`: the graphed core,
  the read of the lengths, the expansion, the prior's scatter and the flow per size), in the
  runtime's arithmetic (the core in FP32, the flow in FP16);
- the core alone on the same sentences, padded to the call's phonemes, as a CUDA graph in
  FP32 (the runtime's), with TF32, compiled by torch.compile, and compiled with TF32, and how
  many phoneme durations each moves by a frame against FP32 on the same noise.
Then the vocoder's GPU time per played frame of steady windows at 8 to 128 rows a call.

The best call is then the fastest core plus the rest of the call as measured: what this
runtime could reach with every measure on the core taken at once, the compile's cost (about
half a minute a shape) and the moved frames left aside.

Usage, on a CUDA machine with the joe voice installed (docs/gpu.md):
    OUT=results PYTHONPATH=. python3 scripts/encoder_rate_probe.py [ROWS ...]
Writes $OUT/encoder-rate-probe.json.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

from engines.bench.gpu_bench import padded_ids
from engines.engine_build import build_engines, resolve_voice_model
from engines.torch_cuda.backend import DeviceBackend
from engines.torch_cuda.runtime import ENCODER_BATCH_BUCKETS, TorchCudaStages, padded_phonemes
from scripts.encode_split_probe import PARTS, arithmetic, corpus_ids, one_call, replay_ms
from scripts.encoder_compile_probe import compare, graphed

CALLS = 20
CORE_VARIANTS = ("fp32", "tf32", "compiled", "compiled_tf32")
# The vocoder's steady window (128 frames) with its context on both sides (8 + 8), and the
# latent's channels (Piper's VITS).
VOCODER_WIDTH, VOCODER_PLAYED, LATENT_CHANNELS = 144, 128, 192


def core_inputs(rows: list[list[int]], generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The core's inputs for these sentences, padded as the runtime pads them, with duration
    noise as at noise_w 0.8."""
    ids, lengths = padded_ids(rows)
    padded = padded_phonemes(ids.shape[1])
    ids = torch.nn.functional.pad(ids, (0, padded - ids.shape[1]))
    noise = torch.randn(len(rows), 2, padded, device="cuda", generator=generator) * 0.8
    return {"ids": ids.cuda(), "lengths": lengths.cuda(), "noise": noise}


def vocoder_rates(stages: TorchCudaStages) -> dict:
    """GPU microseconds per played frame of steady windows, by rows per call (CUDA graphs in
    the entry's precision, as the stream model calls them)."""
    rates = {}
    for rows in (8, 16, 32, 64, 128):
        latent = torch.randn(rows, LATENT_CHANNELS, VOCODER_WIDTH, device="cuda")
        for _ in range(4):
            stages.vocode_tensor(latent)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(30):
            stages.vocode_tensor(latent)
        end.record()
        torch.cuda.synchronize()
        rates[str(rows)] = round(start.elapsed_time(end) / 30 * 1000 / (rows * VOCODER_PLAYED), 3)
    return rates


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [24, 32, 64]
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/vc").path
    stages = TorchCudaStages(entry)
    backend = DeviceBackend(stages, async_calls=False)
    core = stages.encoder_core
    assert core is not None
    pool = corpus_ids()
    rng = np.random.default_rng(0)
    generator = torch.Generator(device="cuda").manual_seed(1)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    compiled = torch.compile(core, dynamic=False)
    # Each its own graphs: the arithmetic is chosen at capture (`arithmetic` below).
    stages_of = {
        name: graphed(
            compiled if name.startswith("compiled") else core, ENCODER_BATCH_BUCKETS, stages.device
        )
        for name in CORE_VARIANTS
    }
    results: dict = {"gpu": torch.cuda.get_device_name(), "calls_per_size": CALLS, "sizes": {}}
    for size in sizes:
        batches = [[pool[i] for i in rng.choice(len(pool), size)] for _ in range(CALLS)]
        calls = []
        for warm in (True, False):  # the first pass captures the graphs
            for batch in batches:
                call = one_call(backend, stages, batch)
                if not warm:
                    calls.append(call)
        row: dict = {
            part: round(statistics.median(c[part] for c in calls), 3) for part in (*PARTS, "wall")
        }
        row["phonemes_padded_median"] = statistics.median(
            padded_phonemes(max(len(r) for r in b)) for b in batches
        )
        row["frames_per_sentence_median"] = statistics.median(f for c in calls for f in c["frames"])
        # The core alone on one of these batches (its phonemes padded as the call pads them).
        inputs = core_inputs(batches[0], generator)
        outputs = {}
        for name in CORE_VARIANTS:
            with arithmetic("tf32" if name.endswith("tf32") else "fp32"):
                ms, outputs[name] = replay_ms(stages_of[name], inputs)
            row[f"core_{name}_ms"] = round(ms, 3)
            if name != "fp32":
                moved = compare(outputs["fp32"], outputs[name])
                row[f"core_{name}_durations_changed"] = moved["durations_changed"]
        row["phonemes_in_core_batch"] = int(inputs["lengths"].sum())
        rest = sum(row[p] for p in PARTS if p != "core")
        call_ms = row["core"] + rest
        best_core = min(row[f"core_{name}_ms"] for name in CORE_VARIANTS)
        row["call_ms_as_run"] = round(call_ms, 3)
        row["sentences_per_s_as_run"] = round(size / call_ms * 1000, 1)
        row["call_ms_best_core"] = round(best_core + rest, 3)
        row["sentences_per_s_best_core"] = round(size / (best_core + rest) * 1000, 1)
        results["sizes"][str(size)] = row
        print(size, json.dumps(row), flush=True)
    results["vocoder_us_per_played_frame_by_rows"] = vocoder_rates(stages)
    print(json.dumps(results["vocoder_us_per_played_frame_by_rows"]), flush=True)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "encoder-rate-probe.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
