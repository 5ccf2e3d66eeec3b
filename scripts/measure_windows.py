"""Measure streaming window settings in-process (no Triton): SNR, first audio, real-time factor.

    .venv/bin/python scripts/measure_windows.py [--repeat 3]

Prints a Markdown table; docs/streaming.md quotes one run. The one-shot row is the same
stages run once over the whole sentence (what a non-streaming server does).
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import threading
import time
from datetime import date
from pathlib import Path

import numpy as np

from engines.commands.demo import REFERENCE_SENTENCE
from engines.engine_build import build_engines
from engines.frames import to_pcm16
from engines.frontend import text_to_sentences
from engines.runtime import OnnxStages
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams, WindowConfig
from engines.voice import load_voice

QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)
CONFIGS = [
    WindowConfig(),
    WindowConfig(vocoder_context_frames=0, flow_context_frames=0),
    WindowConfig(vocoder_context_frames=4),
    WindowConfig(vocoder_context_frames=16),
    WindowConfig(flow_context_frames=8),
    WindowConfig(flow_context_frames=16),
    WindowConfig(flow_context_frames=32),
    WindowConfig(window_frames=64),
    WindowConfig(first_window_frames=8),
    WindowConfig(first_window_frames=32),
]


class Sink(StreamSink):
    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.started = time.perf_counter()
        self.first: float | None = None
        self.total = 0.0
        self.done = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        if self.first is None:
            self.first = time.perf_counter() - self.started
        self.chunks.append(pcm)

    def finish(self, error: Exception | None = None) -> None:
        self.total = time.perf_counter() - self.started
        self.done.set()


def snr_db(signal: np.ndarray, reference: np.ndarray) -> float:
    signal, reference = signal.astype(np.float64), reference.astype(np.float64)
    noise = max(float(np.sum((signal - reference) ** 2)), 1e-9)
    return float(10 * np.log10(np.sum(reference**2) / noise))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    voice = load_voice("joe")
    entry = build_engines(voice.model_path, "onnxruntime", None, Path(tempfile.mkdtemp()))
    stages = OnnxStages(entry.path)
    sentences = text_to_sentences(REFERENCE_SENTENCE, voice.config, phrase_chars=None)
    ids = np.array([sentences[0].ids], dtype=np.int64)
    lengths = np.array([ids.shape[1]], dtype=np.int64)
    scales = np.array(QUIET.scales(), dtype=np.float32)
    oneshot_times = []
    for _ in range(args.repeat + 1):
        started = time.perf_counter()
        reference = to_pcm16(stages.vocode(stages.flow(*stages.encode(ids, lengths, scales)))[0])
        oneshot_times.append(time.perf_counter() - started)
    seconds = len(reference) / voice.config.sample_rate
    oneshot = float(np.median(oneshot_times[1:]))
    print(
        f"joe voice, reference sentence ({seconds:.2f} s of audio), {date.today()}, "
        f"{platform.processor() or platform.machine()}, onnxruntime CPU, median of {args.repeat}"
    )
    print()
    print("| first | window | vocoder ctx | flow ctx | SNR dB | first audio ms | RTF |")
    print("|---|---|---|---|---|---|---|")
    print(f"| one-shot | | | | ref | {oneshot * 1000:.0f} | {oneshot / seconds:.3f} |")
    for config in CONFIGS:
        scheduler = StreamScheduler(stages, voice.config.sample_rate, windows=config)
        scheduler.start()
        firsts, totals, audio = [], [], np.zeros(0, dtype=np.int16)
        for run in range(args.repeat + 1):
            sink = Sink()
            scheduler.submit(list(sentences), QUIET, sink)
            sink.done.wait(120)
            if run:  # the first run warms the shapes up
                firsts.append(sink.first or 0.0)
                totals.append(sink.total)
            audio = np.concatenate(sink.chunks)
        scheduler.stop()
        print(
            f"| {config.first_window_frames} | {config.window_frames} | "
            f"{config.vocoder_context_frames} | {config.flow_context_frames} | "
            f"{snr_db(audio, reference):.1f} | "
            f"{np.median(firsts) * 1000:.0f} | {np.median(totals) / seconds:.3f} |"
        )


if __name__ == "__main__":
    main()
