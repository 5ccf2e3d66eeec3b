"""The torch-cuda runtime's encoder with VOXFLEET_ENCODER_COMPILE=1 and VOXFLEET_ENCODER_TF32=1
against its default (FP32 graphs): the time to capture the encoder's graphs as the stream
model's warmup does (32 to 640 phoneme ids, batches up to 32), the core's GPU time on calls
of 24 corpus sentences, and how many phoneme durations the switches move by a frame (the
same noise each way).

Usage, on a CUDA machine with the joe voice installed (docs/gpu.md):
    OUT=results PYTHONPATH=. python3 scripts/encoder_switches_check.py
Writes $OUT/encoder-switches-check.json.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engines.bench.gpu_bench import padded_ids
from engines.engine_build import build_engines, resolve_voice_model
from engines.torch_cuda.runtime import COMPILE_ENV, TF32_ENV, TorchCudaStages
from scripts.encode_split_probe import corpus_ids
from scripts.encoder_compile_probe import compare

CALLS, ROWS, WARM = 30, 24, 5
PHONEMES = list(range(32, 641, 32))
SCALES = torch.tensor([0.667, 1.0, 0.8])


def stages_with(entry: Path, switches: str) -> tuple[TorchCudaStages, float]:
    """The runtime with both switches set to `switches`, and its encoder warmup in seconds."""
    os.environ[COMPILE_ENV] = os.environ[TF32_ENV] = switches
    stages = TorchCudaStages(entry)
    started = time.perf_counter()
    stages.warmup([], [], batches=[1], encoder_phonemes=PHONEMES, max_sentences=32)
    torch.cuda.synchronize()
    return stages, time.perf_counter() - started


def main() -> None:
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/vc").path
    variants = {}
    results: dict = {"gpu": torch.cuda.get_device_name()}
    for name, switches in (("default", "0"), ("compiled_tf32", "1")):
        variants[name], seconds = stages_with(entry, switches)
        results[f"{name}_encoder_warmup_s"] = round(seconds, 1)
    pool = corpus_ids()
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {name: [] for name in variants}
    moved = phonemes = 0
    for call in range(CALLS):
        ids, lengths = padded_ids([pool[i] for i in rng.choice(len(pool), ROWS)])
        outputs = {}
        for name, stages in variants.items():
            torch.manual_seed(call)  # the same duration noise for both
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            outputs[name], _, _ = stages._encode_core(ids, lengths, SCALES, None)
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
        moved += int(compare(outputs["default"], outputs["compiled_tf32"])["durations_changed"])
        phonemes += int(lengths.sum())
    results["core_ms_median"] = {
        name: round(statistics.median(values[WARM:]), 3) for name, values in times.items()
    }
    results.update(durations_moved=moved, phonemes=phonemes, calls=CALLS, rows=ROWS)
    print(json.dumps(results), flush=True)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "encoder-switches-check.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
