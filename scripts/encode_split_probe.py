"""Where an encoder call of the GPU stream path spends its time: the graphed encoder core, the
read of the sentences' lengths, the expansion to frames, the prior's scatter into the frame
store and the flow over whole sentences, each timed with CUDA events, for encoder batches of
corpus sentences as the scheduler sends them; the flow both as one call padded to the longest
sentence (VOXFLEET_SENTENCE_FLOW_GROUPS=0) and as one call per size the sentences need.
Then the encoder core alone: its relative-position attention over the window's diagonals
(`EncoderCore.banded`, the default) against all 2L - 1 relative positions, each a CUDA graph
on the same inputs, with the frame boundaries either moves; the core with TF32 and with FP16
autocast against FP32 (time, and frame boundaries moved); the text encoder against the
duration predictor; and the core's costliest operators (torch.profiler, run eagerly).

Usage, on a CUDA machine with the joe voice installed (docs/gpu.md):
    OUT=results PYTHONPATH=. python3 scripts/encode_split_probe.py [SENTENCES_PER_CALL]
Writes $OUT/encode-split-probe.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from engines.engine_build import build_engines, resolve_voice_model
from engines.torch_cuda import acoustic
from engines.torch_cuda.backend import DeviceBackend
from engines.torch_cuda.runtime import (
    ENCODER_BATCH_BUCKETS,
    GraphedStage,
    TorchCudaStages,
    encoder_arithmetic,
)
from scripts.encoder_compile_probe import compare, graphed, random_inputs

CALLS = 40
# The server cuts sentences into phrases of at most 120 characters (engines/frontend.py);
# the corpus file holds whole sentences, so the longest are left out.
MAX_IDS = 320
PARTS = ("core", "lengths", "expand", "store_prior", "flow")
# (rows, phoneme ids); 20 rows is a typical encoder call under load, padded to the 32 bucket.
CORE_SHAPES = [(20, 320), (20, 160), (32, 320), (32, 160), (16, 160), (8, 96)]
# The runtime's batch buckets without the 24 between 16 and 32 (the earlier ones).
COARSER_BUCKETS = tuple(b for b in ENCODER_BATCH_BUCKETS if b != 24)
REPLAYS = 30


def corpus_ids() -> list[list[int]]:
    data = json.loads(Path("tests/gpu/data/corpus_ids.json").read_text())
    return [s["ids"] for s in data["sentences"] if len(s["ids"]) <= MAX_IDS]


def one_call(backend: DeviceBackend, stages: TorchCudaStages, rows: list[list[int]]) -> dict:
    """One encoder call of `rows` as `StreamScheduler._encode` makes it, timed part by part."""
    longest = max(len(r) for r in rows)
    ids = np.zeros((len(rows), longest), dtype=np.int64)
    for row, sentence in enumerate(rows):
        ids[row, : len(sentence)] = sentence
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    scales = torch.tensor([0.667, 1.0, 0.8])
    speakers = np.zeros(len(rows), np.int64)
    events = [torch.cuda.Event(enable_timing=True) for _ in range(len(PARTS) + 1)]
    torch.cuda.synchronize()
    started = time.perf_counter()
    events[0].record()
    (m_p, logs_p, x_mask, logw), length_scale, noise_scale = stages._encode_core(
        torch.from_numpy(ids), torch.from_numpy(lengths), scales, speakers
    )
    events[1].record()
    w_ceil, y_lengths = acoustic.durations(logw, x_mask, length_scale)
    longest_frames = int(y_lengths.max())
    events[2].record()
    prior, mask = acoustic.expand_frames(
        m_p, logs_p, x_mask, w_ceil, y_lengths, longest_frames, noise_scale
    )
    frames = mask[:, 0, :].sum(dim=1).to(torch.int64).cpu().numpy()
    events[3].record()
    tables = [backend.pool.allocate(int(count)) for count in frames]
    backend.store_prior(prior, tables, frames)
    events[4].record()
    flowed = backend.flow_sentences(prior, tables, frames, speakers)
    events[5].record()
    torch.cuda.synchronize()
    wall = time.perf_counter() - started
    for table in tables:
        backend.pool.release(table)
    result = {p: events[i].elapsed_time(events[i + 1]) for i, p in enumerate(PARTS)}
    result.update(wall=wall * 1000, flowed=flowed, frames=frames.tolist())
    return result


def replay_ms(stage: GraphedStage, inputs: dict[str, torch.Tensor]) -> tuple[float, list]:
    """Mean milliseconds of REPLAYS graph replays (after capture and three warm ones)."""
    for _ in range(4):
        outputs = stage.run(inputs)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(REPLAYS):
        outputs = stage.run(inputs)
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / REPLAYS * 1000, outputs


@contextlib.contextmanager
def arithmetic(name: str) -> Iterator[None]:
    """TF32 convolutions and matrix products, or FP16 autocast, for the graphs so named
    (their kernels are chosen at capture); FP32 for the others."""
    if name == "tf32":
        with encoder_arithmetic(True):
            yield
    elif name == "fp16_autocast":
        with torch.autocast("cuda", dtype=torch.float16):
            yield
    else:
        yield


def core_probe(stages: TorchCudaStages) -> dict:
    core = stages.encoder_core
    assert core is not None
    full = acoustic.EncoderCore(core.w, core.embedding, core.exp_neg_logs, banded=False)

    graphs = {
        "banded": graphed(core, ENCODER_BATCH_BUCKETS, stages.device),
        "full": graphed(full, ENCODER_BATCH_BUCKETS, stages.device),
        "banded_without_bucket_24": graphed(core, COARSER_BUCKETS, stages.device),
        # Captured with TF32 (or FP16 autocast) allowed: what a cheaper arithmetic would save,
        # and how many frame boundaries it moves against the FP32 core.
        "tf32": graphed(core, ENCODER_BATCH_BUCKETS, stages.device),
        "fp16_autocast": graphed(core, ENCODER_BATCH_BUCKETS, stages.device),
    }
    generator = torch.Generator(device="cuda").manual_seed(1)
    results: dict = {}
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    for rows, phonemes in CORE_SHAPES:
        inputs = random_inputs(generator, rows, phonemes, shortest=1 / 3)
        ids, lengths, noise = inputs["ids"], inputs["lengths"], inputs["noise"]
        row: dict = {}
        outputs = {}
        for name, stage in graphs.items():
            with arithmetic(name):
                row[f"{name}_ms"], outputs[name] = replay_ms(stage, inputs)
            row[f"{name}_ms"] = round(row[f"{name}_ms"], 3)
        row.update(compare(outputs["banded"], outputs["full"]))
        for name in ("tf32", "fp16_autocast"):
            moved = compare(outputs["banded"], [o.float() for o in outputs[name]])
            row.update({f"{name}_{key}": value for key, value in moved.items()})
        row["phonemes"] = int(lengths.sum())
        # Eagerly, the text encoder against the duration predictor.
        marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
        for _ in range(3):
            marks[0].record()
            x, _, _, mask = core.text_encoder(ids, lengths)
            marks[1].record()
            core.duration_predictor(x, mask, noise)
            marks[2].record()
            torch.cuda.synchronize()
        row["eager_text_encoder_ms"] = round(marks[0].elapsed_time(marks[1]), 3)
        row["eager_duration_predictor_ms"] = round(marks[1].elapsed_time(marks[2]), 3)
        results[f"{rows}x{phonemes}"] = row
    rows, phonemes = CORE_SHAPES[0]
    ids = torch.randint(1, 150, (rows, phonemes), device="cuda", generator=generator)
    lengths = torch.full((rows,), phonemes, device="cuda")
    noise = torch.randn(rows, 2, phonemes, device="cuda", generator=generator)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        for _ in range(3):
            core(ids, lengths, noise)
        torch.cuda.synchronize()
    events = sorted(
        profile.key_averages(),
        key=lambda e: getattr(e, "self_device_time_total", 0),
        reverse=True,
    )
    top = []
    for event in events[:20]:
        per_call_ms = getattr(event, "self_device_time_total", 0) / 3000
        top.append(f"{per_call_ms:8.3f} ms {event.count // 3:5d}x  {event.key[:90]}")
    print("\n".join(top))
    results["profile_20x320_eager_ms_per_call"] = top
    return results


def main() -> None:
    per_call = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/vc").path
    stages = TorchCudaStages(entry)
    backend = DeviceBackend(stages, async_calls=False)
    pool = corpus_ids()
    rng = np.random.default_rng(0)
    batches = [[pool[i] for i in rng.choice(len(pool), per_call)] for _ in range(CALLS)]
    results: dict[str, list[dict]] = {"padded": [], "grouped": []}
    for warm in (True, False):  # the first pass captures the graphs
        for batch in batches:
            for mode in results:  # the two forms alternate on the same batch
                backend.sentence_flow_groups = mode == "grouped"
                call = one_call(backend, stages, batch)
                if not warm:
                    results[mode].append(call)
    summary = {
        "gpu": torch.cuda.get_device_name(),
        "sentences_per_call": per_call,
        "calls": CALLS,
        "frames_per_sentence_median": statistics.median(
            f for call in results["padded"] for f in call["frames"]
        ),
        "longest_frames_per_call_median": statistics.median(
            max(call["frames"]) for call in results["padded"]
        ),
    }
    for mode, calls in results.items():
        summary[mode] = {
            part: round(statistics.median(call[part] for call in calls), 3)
            for part in (*PARTS, "wall")
        }
        summary[mode]["flowed_calls"] = sum(call["flowed"] for call in calls)
    summary["core"] = core_probe(stages)
    print(json.dumps({k: v for k, v in summary.items() if k != "core"}, indent=1))
    print(json.dumps({k: v for k, v in summary["core"].items() if "profile" not in k}, indent=1))
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "encode-split-probe.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
