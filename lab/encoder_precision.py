"""The encoder's text part in BF16 or FP16 against FP32: `python -m lab.encoder_precision`.

    python -m lab.encoder_precision --engine-dir ENTRY \\
        --corpus-ids tests/gpu/data/corpus_ids.json --out encoder-precision.json

At the stage limit the encoder takes most of the GPU's time (58 % on the H200, 2026-11-29,
docs/gpu.md), and it runs FP32. This bench runs its text part (the transformer: embedding,
attention, feed-forward layers, projection) at each precision of
`engines.runtimes.torch_cuda.acoustic.TEXT_PRECISIONS`, the duration predictor staying FP32,
and reports for each:

- `encoder_rows`: the encoder alone at rising batch with CUDA graphs (`lab.gpu_bench.bench_stages`),
  and `stage_limit`: the three stages' limit together at the default plan, with the same flow
  and vocoder rows (FP16, as served) for every precision;
- `quality`, against the FP32 encoder on `--sentences` corpus sentences, noise scales 0 (the
  same flow and vocoder after both):
  - `phonemes_with_another_duration` (of `phonemes`): a phoneme's frame count is a rounded-up
    exponential, and a change of the text part's output moves some across a whole frame;
  - `sentences_with_a_moved_phoneme` (`sentences_shifted`): the audio after such a phoneme is
    shifted by a frame or more, so an SNR over them says nothing about how they sound;
  - `audio_snr_db_all`, `_min`, `_median`: the audio's SNR against FP32's over the other
    sentences, the guard the FP16 flow and vocoder meet (docs/gpu.md: ≥ 30 dB asserted);
  - `prior_snr_db_min`: the text part's output (the prior's means, per phoneme) over all.

Every precision is timed in one process, side by side; the figures are ratios to FP32.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engines.runtimes.torch_cuda.acoustic import TEXT_PRECISIONS
from engines.runtimes.torch_cuda.stages import TorchCudaStages, padded_phonemes
from lab.gpu_bench import bench_stages, load_corpus_ids, padded_ids, snr_db, stage_limit

NOISELESS = torch.tensor([0.0, 1.0, 0.0])  # noise scale, length scale, duration noise


def _audio(stages: TorchCudaStages, prior: torch.Tensor, mask: torch.Tensor) -> np.ndarray:
    return stages.vocode_tensor(stages.flow_tensor(prior, mask)).float().cpu().numpy()[0]


def compare(
    reference: TorchCudaStages, test: TorchCudaStages, corpus: list[list[int]], sentences: int
) -> dict[str, Any]:
    """`test`'s encoder against `reference`'s, each sentence alone, through `reference`'s flow
    and vocoder (see the module docstring)."""
    assert reference.encoder_core is not None and test.encoder_core is not None
    device = reference.device
    phonemes = moved = 0
    shifted: list[int] = []
    prior_snr, audio_snr, references, tests = [], [], [], []
    for index, sentence in enumerate(corpus[:sentences]):
        ids, lengths = padded_ids([sentence])
        # Padded as the runtime pads a call's phonemes (`encode_tensor`).
        ids = torch.nn.functional.pad(ids, (0, padded_phonemes(ids.shape[1]) - ids.shape[1]))
        noise = torch.zeros(1, 2, ids.shape[1], device=device)
        with torch.no_grad():
            m_ref, _, mask, logw_ref = reference.encoder_core(
                ids.to(device), lengths.to(device), noise
            )
            m_test, _, _, logw_test = test.encoder_core(ids.to(device), lengths.to(device), noise)
        prior_snr.append(snr_db(m_ref.cpu().numpy(), m_test.float().cpu().numpy()))
        frames_ref = torch.ceil(torch.exp(logw_ref) * mask)
        frames_test = torch.ceil(torch.exp(logw_test) * mask)
        phonemes += int(mask.sum())
        moved_here = int((frames_ref != frames_test).sum())
        moved += moved_here
        prior_a, mask_a = reference.encode_tensor(ids, lengths, NOISELESS)
        prior_b, mask_b = test.encode_tensor(ids, lengths, NOISELESS)
        if moved_here or mask_a.shape != mask_b.shape or not torch.equal(mask_a, mask_b):
            shifted.append(index)
            continue
        expected, got = _audio(reference, prior_a, mask_a), _audio(reference, prior_b, mask_b)
        audio_snr.append(snr_db(expected, got))
        references.append(expected)
        tests.append(got)
    compared = bool(audio_snr)
    return {
        "sentences": min(sentences, len(corpus)),
        "phonemes": phonemes,
        "phonemes_with_another_duration": moved,
        "sentences_with_a_moved_phoneme": len(shifted),
        "sentences_shifted": shifted,
        "audio_snr_db_all": (
            round(snr_db(np.concatenate(references), np.concatenate(tests)), 2)
            if compared
            else None
        ),
        "audio_snr_db_min": round(min(audio_snr), 2) if compared else None,
        "audio_snr_db_median": round(statistics.median(audio_snr), 2) if compared else None,
        "prior_snr_db_min": round(min(prior_snr), 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine-dir", type=Path, required=True)
    parser.add_argument("--corpus-ids", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sentences", type=int, default=40)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    from engines.streaming import WindowConfig

    corpus = load_corpus_ids(args.corpus_ids)
    plan = WindowConfig()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "precisions": {},
    }
    rows: list[dict[str, Any]] = []  # FP32's run times the flow and vocoder for every one
    for precision in TEXT_PRECISIONS:
        stages = TorchCudaStages(
            args.engine_dir, device=args.device, precision="fp16", encoder_precision=precision
        )
        first = not rows
        if first:
            timed = bench_stages(stages, corpus)
        else:  # the encoder alone
            timed = bench_stages(stages, corpus, vocoder_frames=(), flow_frames=())
        if first:
            rows = [row for row in timed["rows"] if row["stage"] != "encoder"]
        encoder = [row for row in timed["rows"] if row["stage"] == "encoder"]
        entry = result["precisions"][precision] = {
            "encoder_rows": encoder,
            "stage_limit": stage_limit(
                rows + encoder, plan.max_batch_windows, plan.max_encoder_batch
            ),
        }
        print(precision, json.dumps(entry["stage_limit"]), flush=True)
        del stages
        if args.device == "cuda":
            torch.cuda.empty_cache()
    result["flow_vocoder_rows"] = rows
    reference = TorchCudaStages(
        args.engine_dir, device=args.device, precision="fp16", use_graphs=False
    )
    for precision in TEXT_PRECISIONS:
        if precision == "fp32":
            continue
        test = TorchCudaStages(
            args.engine_dir,
            device=args.device,
            precision="fp16",
            use_graphs=False,
            encoder_precision=precision,
        )
        quality = compare(reference, test, corpus, args.sentences)
        result["precisions"][precision]["quality"] = quality
        print(precision, json.dumps(quality), flush=True)
        args.out.write_text(json.dumps(result, indent=1))
    args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
