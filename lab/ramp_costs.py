"""What a new stream costs the CPU before its steady windows: the encoder call of a median
phrase and the calls of its window ramp, each timed alone on onnxruntime (median of 15).

    python -m lab.ramp_costs [--doubling]

The phrase is the median (in phoneme ids) of the phrases of the corpus's first 40 texts, as
the frontend cuts them; the encoder is timed on 2 threads and on 1. The ramp is what the
planner (`next_window`, `window_calls`, with the CPU's rules, `cpu_rules`) cuts for a long
sentence: windows of 16, 24, 36, 54, 81, 121 and 128 frames and the flow chunks they need,
context included, on 2 threads. `--doubling` cuts it as fixed-shape engines do (16, 32, 64,
128, with context past the sentence's edges), for comparison. Prints a Markdown table;
docs/benchmarks.md quotes a run.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np

from engines.build.engine_build import build_engines
from engines.contract.plan import WindowConfig
from engines.runtimes.onnx import OnnxStages
from engines.streaming.planner import cpu_rules, window_calls
from engines.streaming.types import Stream, StreamSink, SynthesisParams
from engines.text.corpus import load_corpus, sentence_order
from engines.text.frontend import text_to_sentences
from engines.text.voice import load_voice
from lab.window_frames import cut_sentence

LATENT_CHANNELS = 192


def median_ms(call: Callable[[], object], repeats: int = 15) -> float:
    """The median time of `repeats` calls, after one call that allocates the shapes."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--doubling",
        action="store_true",
        help="cut the ramp as fixed-shape engines do: doubling, context past the edges",
    )
    args = parser.parse_args(argv)
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
    print(f"median phrase: {ids.shape[1]} ids of {len(phrases)} phrases\n")
    print("| call | frames | threads | ms |")
    print("|---|---:|---:|---:|")
    for threads in (2, 1):
        stages = OnnxStages(entry.path, threads=threads)
        ms = median_ms(partial(stages.encode, ids, lengths, scales))
        print(f"| encoder | {ids.shape[1]} ids | {threads} | {ms:.1f} |")
    stages = OnnxStages(entry.path, threads=2)
    rules = cpu_rules()
    if args.doubling:
        rules = replace(rules, ramp=2.0, trim_edges=False)
    stream = Stream(0, deque(), SynthesisParams(), StreamSink(), 0.0)
    for window in cut_sentence(stream, 10**6, cfg, rules):
        size = window.decode[1] - window.decode[0]
        for stage, width, _ in window_calls(window, cfg, rules):
            latent = rng.standard_normal((1, LATENT_CHANNELS, width)).astype(np.float32)
            if stage == "vocoder":
                ms = median_ms(partial(stages.vocode, latent))
                label = f"vocoder, window of {size}"
            else:
                mask = np.ones((1, 1, width), dtype=np.float32)
                ms = median_ms(partial(stages.flow, latent, mask))
                label = f"flow, chunk of {window.flow[1] - window.flow[0]}"
            print(f"| {label} | {width} | 2 | {ms:.1f} |")
        if size == cfg.window_frames:
            break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
