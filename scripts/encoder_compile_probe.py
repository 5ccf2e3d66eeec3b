"""The encoder's own cost on a GPU, per call: its CUDA graph as the torch-cuda runtime replays
it, against a CUDA graph of the same core compiled by torch.compile (inductor), on the same
inputs; and whether compiling moves any phoneme's duration (the frames are ``ceil``ed).

Usage, on a CUDA machine with the joe voice installed (docs/gpu.md):
    OUT=results PYTHONPATH=. python3 scripts/encoder_compile_probe.py
Writes $OUT/encoder-probe.json (kept as docs/bench-gpu-h100-encoder-compile-probe.json).
MODE=max-autotune-no-cudagraphs compiles with autotuning (several minutes per shape).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence

import torch

from engines.engine_build import build_engines, resolve_voice_model
from engines.torch_cuda.runtime import ENCODER_BATCH_BUCKETS, GraphedStage, TorchCudaStages

SHAPES = [(16, 160), (32, 160), (1, 64)]  # (sentences, phoneme ids)
CALLS = 30


def mean_ms(stage: GraphedStage, inputs: dict[str, torch.Tensor]) -> tuple[float, float, list]:
    """(first call in s, capture and compile included; mean of CALLS later calls in ms; outputs)"""
    started = time.perf_counter()
    outputs = stage.run(inputs)
    torch.cuda.synchronize()
    first = time.perf_counter() - started
    for _ in range(3):
        stage.run(inputs)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(CALLS):
        outputs = stage.run(inputs)
    torch.cuda.synchronize()
    return first, (time.perf_counter() - started) / CALLS * 1000, outputs


def graphed(core: Callable, buckets: Sequence[int], device: torch.device) -> GraphedStage:
    """An encoder core (ids, lengths, noise -> outputs) as CUDA graphs of its own, per bucket."""
    return GraphedStage(
        None,
        buckets,
        True,
        pool=torch.cuda.graph_pool_handle(),
        function=lambda i: list(core(i["ids"], i["lengths"], i["noise"])),
        device=device,
    )


def random_inputs(
    generator: torch.Generator, batch: int, phonemes: int, shortest: float
) -> dict[str, torch.Tensor]:
    """Encoder inputs of random ids, the first row `phonemes` long, the others at least
    `shortest` of that, and duration noise as at noise_w 0.8."""
    ids = torch.randint(1, 150, (batch, phonemes), device="cuda", generator=generator)
    lengths = torch.randint(
        int(phonemes * shortest), phonemes + 1, (batch,), device="cuda", generator=generator
    )
    lengths[0] = phonemes
    noise = torch.randn(batch, 2, phonemes, device="cuda", generator=generator) * 0.8
    return {"ids": ids, "lengths": lengths, "noise": noise}


def compare(ours: list[torch.Tensor], theirs: list[torch.Tensor]) -> dict[str, float | int]:
    """How far two encoder cores' outputs are apart, and how many frame counts that moves."""
    (m1, _, x1, w1), (m2, _, x2, w2) = ours, theirs
    moved = torch.ceil(torch.exp(w1) * x1) != torch.ceil(torch.exp(w2) * x2)
    return {
        "m_p_max_abs_diff": float((m1 - m2).abs().max()),
        "logw_max_abs_diff": float((w1 - w2).abs().max()),
        "durations_changed": int(moved.sum()),
    }


def main() -> None:
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/vc").path
    stages = TorchCudaStages(entry)
    core = stages.encoder_core
    assert core is not None and stages.encoder_stage is not None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    compiled = torch.compile(core, dynamic=False, mode=os.environ.get("MODE") or None)
    compiled_stage = graphed(compiled, ENCODER_BATCH_BUCKETS, stages.device)
    generator = torch.Generator(device="cuda").manual_seed(1)
    results = {}
    for batch, phonemes in SHAPES:
        inputs = random_inputs(generator, batch, phonemes, shortest=0.5)
        row: dict[str, float | int] = {}
        outputs = {}
        for name, stage in (("graph", stages.encoder_stage), ("compiled", compiled_stage)):
            first, mean, outputs[name] = mean_ms(stage, inputs)
            row[f"{name}_ms"] = round(mean, 3)
            row[f"{name}_first_s"] = round(first, 2)
        row.update(compare(outputs["graph"], outputs["compiled"]))
        row["phonemes"] = int(inputs["lengths"].sum())
        results[f"{batch}x{phonemes}"] = row
        print(batch, phonemes, json.dumps(row), flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "encoder-probe.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
