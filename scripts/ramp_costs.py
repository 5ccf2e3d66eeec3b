"""What a new stream costs the CPU before its steady windows: the encoder call of a median
phrase and the calls of its window ramp, timed alone on onnxruntime (median of 15 calls).

    .venv/bin/python scripts/ramp_costs.py

The phrase is the median (in phoneme ids) of the phrases of the corpus's first 40 texts, as
the frontend cuts them. The ramp is what `engines.streaming.planner.next_window` cuts for a
long sentence: windows of 16, 32, 64 and 128 frames with their vocoder context, and the flow
chunk each needs (twice the window, with flow context). docs/benchmarks.md quotes a run.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from engines.corpus import load_corpus, sentence_order
from engines.engine_build import build_engines
from engines.frontend import text_to_sentences
from engines.plan import WindowConfig
from engines.runtime import OnnxStages
from engines.voice import load_voice

LATENT_CHANNELS = 192


def median_ms(call: Callable[[], object], repeats: int = 15) -> float:
    call()  # the first call of a shape allocates
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    voice = load_voice("joe")
    entry = build_engines(voice.model_path, "onnxruntime", None, Path(tempfile.mkdtemp()))
    phrases = [
        sentence
        for text in sentence_order(load_corpus())[:40]
        for sentence in text_to_sentences(text, voice.config)
    ]
    phrase = sorted(phrases, key=lambda s: len(s.ids))[len(phrases) // 2]
    ids = np.array([phrase.ids], dtype=np.int64)
    lengths = np.array([ids.shape[1]], dtype=np.int64)
    scales = np.array([0.667, 1.0, 0.8], dtype=np.float32)
    cfg = WindowConfig()
    rng = np.random.default_rng(0)
    print(f"median phrase: {ids.shape[1]} ids of {len(phrases)} phrases")
    print("| call | frames | threads | ms |")
    print("|---|---:|---:|---:|")
    for threads in (2, 1):
        stages = OnnxStages(entry.path, threads=threads)
        ms = median_ms(partial(stages.encode, ids, lengths, scales))
        print(f"| encoder | {ids.shape[1]} ids | {threads} | {ms:.1f} |")
    stages = OnnxStages(entry.path, threads=2)
    size = cfg.first_window_frames
    while size <= cfg.window_frames:
        vocoder = size + 2 * cfg.vocoder_context_frames
        flow = 2 * size + 2 * cfg.flow_context_frames
        latent = rng.standard_normal((1, LATENT_CHANNELS, vocoder)).astype(np.float32)
        prior = rng.standard_normal((1, LATENT_CHANNELS, flow)).astype(np.float32)
        mask = np.ones((1, 1, flow), dtype=np.float32)
        ms = median_ms(partial(stages.vocode, latent))
        print(f"| vocoder, window of {size} | {vocoder} | 2 | {ms:.1f} |")
        ms = median_ms(partial(stages.flow, prior, mask))
        print(f"| flow, chunk of {2 * size} | {flow} | 2 | {ms:.1f} |")
        size *= 2


if __name__ == "__main__":
    main()
