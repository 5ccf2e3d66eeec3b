"""Window settings of the stream model, in-process on onnxruntime: how close each one's audio
is to a one-shot decode (SNR), how soon its first audio comes, and its real-time factor.

    python -m lab.window_quality [--repeat 5]

Each setting streams the reference sentence (`voxfleet demo`'s, 7.33 s of audio) through a
`StreamScheduler` of its own with the noise scales at 0, so that its audio can be compared
with a one-shot decode of the same stages: the SNR is a property of the windows and the same
on every machine; first audio and the real-time factor are this machine's, medians of
`--repeat` runs after one warm-up run. The first row is the one-shot decode itself (what a
non-streaming server does). Prints a Markdown table; docs/streaming.md quotes a run.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from engines.build.engine_build import build_engines
from engines.commands.demo import REFERENCE_SENTENCE
from engines.runtimes.onnx import OnnxStages
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams, WindowConfig
from engines.streaming.frames import to_pcm16
from engines.text.frontend import text_to_sentences
from engines.text.voice import load_voice

QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)
# The default, then one setting changed at a time.
SETTINGS = [
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


class _Recorder(StreamSink):
    """One stream's audio, when its first chunk came and when it ended."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.started = time.perf_counter()
        self.first_s: float | None = None
        self.total_s = 0.0
        self.done = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        if self.first_s is None:
            self.first_s = time.perf_counter() - self.started
        self.chunks.append(pcm)

    def finish(self, error: Exception | None = None) -> None:
        self.total_s = time.perf_counter() - self.started
        self.done.set()


def snr_db(signal: np.ndarray, reference: np.ndarray) -> float:
    """How far `signal` is from `reference`, in dB (higher is closer)."""
    signal, reference = signal.astype(np.float64), reference.astype(np.float64)
    noise = max(float(np.sum((signal - reference) ** 2)), 1e-9)
    return float(10 * np.log10(np.sum(reference**2) / noise))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per setting")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    voice = load_voice("joe")
    entry = build_engines(voice.model_path, "onnxruntime", None, Path(tempfile.mkdtemp()))
    stages = OnnxStages(entry.path)
    sentences = text_to_sentences(REFERENCE_SENTENCE, voice.config, phrase_chars=None)
    ids = np.array([sentences[0].ids], dtype=np.int64)
    lengths = np.array([ids.shape[1]], dtype=np.int64)
    scales = np.array(QUIET.scales(), dtype=np.float32)
    one_shot_s = []
    reference = np.zeros(0, dtype=np.int16)
    for _ in range(args.repeat + 1):
        started = time.perf_counter()
        reference = to_pcm16(stages.vocode(stages.flow(*stages.encode(ids, lengths, scales)))[0])
        one_shot_s.append(time.perf_counter() - started)
    seconds = len(reference) / voice.config.sample_rate
    one_shot = statistics.median(one_shot_s[1:])
    print(
        f"joe voice, reference sentence ({seconds:.2f} s of audio), "
        f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"{platform.processor() or platform.machine()}, onnxruntime CPU, "
        f"median of {args.repeat}\n"
    )
    print("| first | window | vocoder ctx | flow ctx | SNR dB | first audio ms | RTF |")
    print("|---|---|---|---|---|---|---|")
    print(f"| one-shot | | | | ref | {one_shot * 1000:.0f} | {one_shot / seconds:.3f} |")
    for setting in SETTINGS:
        scheduler = StreamScheduler(stages, voice.config.sample_rate, windows=setting)
        scheduler.start()
        firsts, totals, audio = [], [], np.zeros(0, dtype=np.int16)
        try:
            for run in range(args.repeat + 1):
                recorder = _Recorder()
                scheduler.submit(list(sentences), QUIET, recorder)
                if not recorder.done.wait(120):
                    raise SystemExit(f"window_quality: no end of stream within 120 s ({setting})")
                if run:  # the first run warms the shapes up
                    firsts.append(recorder.first_s or 0.0)
                    totals.append(recorder.total_s)
                audio = np.concatenate(recorder.chunks)
        finally:
            scheduler.stop()
        print(
            f"| {setting.first_window_frames} | {setting.window_frames} | "
            f"{setting.vocoder_context_frames} | {setting.flow_context_frames} | "
            f"{snr_db(audio, reference):.1f} | {statistics.median(firsts) * 1000:.0f} | "
            f"{statistics.median(totals) / seconds:.3f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
