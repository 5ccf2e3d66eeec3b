"""Context-frame overhead of the stream model's windows over the shipped corpus.

The encoder (onnxruntime, noise scales 0) gives each corpus sentence's frame count; the
windows and flow chunks are then cut by the scheduler's own planner functions
(engines/streaming/planner.py) for each cutting rule, and the frames that go through the flow
and the vocoder (context and padding included) are counted against the frames of audio. A
count, not a timing: it does not depend on the machine's load. docs/streaming.md quotes it.

    .venv/bin/python scripts/window_overhead.py
"""

from __future__ import annotations

import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engines.corpus import load_corpus
from engines.engine_build import build_engines
from engines.frontend import text_to_sentences
from engines.plan import WindowConfig
from engines.runtime import OnnxStages
from engines.streaming.planner import (
    CPU_RAMP,
    WindowRules,
    cpu_rules,
    next_window,
    window_calls,
)
from engines.streaming.types import SentenceState, Stream, StreamSink, SynthesisParams, Window
from engines.voice import VoiceConfig, load_voice

QUIET = np.array([0.0, 1.0, 0.0], dtype=np.float32)


def soak_texts() -> list[str]:
    """The first 1, 2, 3 and 4 words of each corpus text: `make soak`'s requests."""
    return [" ".join(text.split()[:words]) for text in load_corpus() for words in (1, 2, 3, 4)]


def sentence_frames(
    stages: OnnxStages, config: VoiceConfig, texts: list[str], phrase_chars: int | None
) -> list[list[int]]:
    """Each text's sentences (or phrases): their frame counts."""
    frames_of_texts = []
    for text in texts:
        frames = []
        for sentence in text_to_sentences(text, config, phrase_chars=phrase_chars):
            ids = np.array([sentence.ids], dtype=np.int64)
            _, mask = stages.encode(ids, np.array([ids.shape[1]]), QUIET)
            frames.append(int(mask.sum()))
        frames_of_texts.append(frames)
    return frames_of_texts


def cut_sentence(
    stream: Stream, frames: int, cfg: WindowConfig, rules: WindowRules, lead_after: int = 10**9
) -> Iterator[Window]:
    """The windows the planner cuts `stream`'s next sentence of `frames` frames into, as if
    each ran as soon as it was cut; from the stream's window `lead_after` on, lead windows."""
    stream.current = state = SentenceState(pages=np.zeros(1, np.int64), frames=frames)
    while state.vocoded < frames:
        window = next_window(stream, cfg, rules, lead=stream.windows_sent >= lead_after)
        yield window
        state.flowed = max(state.flowed, window.flow[1])
        state.vocoded = window.decode[1]
        stream.windows_sent += 1


def count(
    texts: list[list[int]], cfg: WindowConfig, rules: WindowRules, lead_after: int
) -> tuple[int, int]:
    """(flow frames, vocoder frames) for one stream per text, as the bench sends them; from
    the stream's window `lead_after` on, lead windows (a stream with a lead by then, and
    every lead window fitting its step: the most they can save)."""
    flow = vocoder = 0
    for sentences in texts:
        stream = Stream(0, deque(), SynthesisParams(), StreamSink(), 0.0)
        for total in sentences:
            for window in cut_sentence(stream, total, cfg, rules, lead_after):
                for stage, width in window_calls(window, cfg, rules):
                    if stage == "flow":
                        flow += width
                    else:
                        vocoder += width
    return flow, vocoder


def main() -> None:
    cfg = WindowConfig()
    print(
        "| sentences | rules | audio frames | flow frames per audio frame | "
        "vocoder frames per audio frame |"
    )
    print("|---|---|---:|---:|---:|")
    voice = load_voice("joe")
    entry = build_engines(voice.model_path, "onnxruntime", None, Path(tempfile.mkdtemp()))
    stages = OnnxStages(entry.path)
    for label, phrase_chars, corpus in (
        ("whole", None, load_corpus()),
        ("phrases of ≤ 120 chars", 120, load_corpus()),
        ("soak: first 1 to 4 words", 120, soak_texts()),
    ):
        texts = sentence_frames(stages, voice.config, corpus, phrase_chars)
        audio = sum(sum(frames) for frames in texts)
        pieces = sum(len(frames) for frames in texts)
        for name, rules, lead_after in (
            ("size classes (GPU engines)", WindowRules(), 10**9),
            ("exact widths", WindowRules(exact_widths=True), 10**9),
            (
                "exact widths, lead windows from the 3rd window on",
                WindowRules(True, 2 * cfg.window_frames, 4 * cfg.window_frames),
                2,
            ),
            (
                "the same, short tails merged (VOXFLEET_LEAD_WINDOWS=1)",
                WindowRules(True, 2 * cfg.window_frames, 4 * cfg.window_frames, merge_tails=True),
                2,
            ),
            (
                "exact widths, short tails merged (the CPU before 2026-11-24)",
                WindowRules(exact_widths=True, merge_tails=True),
                10**9,
            ),
            (
                "the same, windows growing by half",
                WindowRules(exact_widths=True, merge_tails=True, ramp=CPU_RAMP),
                10**9,
            ),
            (
                "the same, no context past a sentence's edges (the CPU now)",
                cpu_rules(),
                10**9,
            ),
        ):
            flow, vocoder = count(texts, cfg, rules, lead_after)
            print(
                f"| {label} ({pieces}) | {name} | {audio:,} | {flow / audio:.3f} | "
                f"{vocoder / audio:.3f} |"
            )


if __name__ == "__main__":
    main()
