"""The frames the stream model's windows send through the flow and the vocoder, per frame of
audio, over the shipped corpus: what context frames, padding and a stream's window ramp cost.

    python -m lab.window_frames

The encoder (onnxruntime, noise scales 0) gives each corpus sentence's frame count; the
windows and flow chunks are then cut by the scheduler's own planner functions
(`engines.streaming.planner`) under each set of rules, one stream per corpus text as
`voxfleet bench` sends them, and the frames of every call (context and padding included) are
counted against the frames of audio. A count, not a timing: the same on every machine.
The texts are the corpus's whole sentences, its phrases of at most 120 characters (as the
frontend cuts them) and the first 1 to 4 words of each text (`make soak`'s requests). Prints
a Markdown table; docs/streaming.md quotes a run.
"""

from __future__ import annotations

import argparse
import tempfile
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engines.build.engine_build import build_engines
from engines.contract.plan import WindowConfig
from engines.runtimes.onnx import OnnxStages
from engines.streaming.planner import WindowRules, cpu_rules, next_window, window_calls
from engines.streaming.types import SentenceState, Stream, StreamSink, SynthesisParams, Window
from engines.text.corpus import load_corpus
from engines.text.frontend import text_to_sentences
from engines.text.voice import VoiceConfig, load_voice

QUIET = np.array([0.0, 1.0, 0.0], dtype=np.float32)
NO_LEAD = 10**9


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
    stream: Stream, frames: int, cfg: WindowConfig, rules: WindowRules, lead_after: int = NO_LEAD
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
    texts: list[list[int]], cfg: WindowConfig, rules: WindowRules, lead_after: int = NO_LEAD
) -> tuple[int, int]:
    """(flow frames, vocoder frames) for one stream per text; from each stream's window
    `lead_after` on, lead windows (as if every stream had its lead by then and every lead
    window fitted its step: the most they can save)."""
    flow = vocoder = 0
    for sentences in texts:
        stream = Stream(0, deque(), SynthesisParams(), StreamSink(), 0.0)
        for total in sentences:
            for window in cut_sentence(stream, total, cfg, rules, lead_after):
                for stage, width, _ in window_calls(window, cfg, rules):
                    if stage == "flow":
                        flow += width
                    else:
                        vocoder += width
    return flow, vocoder


def rule_sets(cfg: WindowConfig) -> list[tuple[str, WindowRules, int]]:
    """(label, rules, the window from which lead windows are taken) of each cut compared."""
    return [
        ("size classes, doubling ramp (fixed-shape GPU engines)", WindowRules(), NO_LEAD),
        ("exact widths, ramp by half, no context past the edges (the CPU)", cpu_rules(), NO_LEAD),
        (
            "the CPU's, with lead windows from the 3rd window on",
            cpu_rules(lead_frames=cfg.window_frames),
            2,
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0]).parse_args(argv)
    cfg = WindowConfig()
    voice = load_voice("joe")
    entry = build_engines(voice.model_path, "onnxruntime", None, Path(tempfile.mkdtemp()))
    stages = OnnxStages(entry.path)
    print(
        "| texts | rules | audio frames | flow frames per audio frame | "
        "vocoder frames per audio frame |"
    )
    print("|---|---|---:|---:|---:|")
    for label, phrase_chars, corpus in (
        ("whole sentences", None, load_corpus()),
        ("phrases of ≤ 120 chars", 120, load_corpus()),
        ("soak: first 1 to 4 words", 120, soak_texts()),
    ):
        texts = sentence_frames(stages, voice.config, corpus, phrase_chars)
        audio = sum(sum(frames) for frames in texts)
        pieces = sum(len(frames) for frames in texts)
        for name, rules, lead_after in rule_sets(cfg):
            flow, vocoder = count(texts, cfg, rules, lead_after)
            print(
                f"| {label} ({pieces}) | {name} | {audio:,} | {flow / audio:.3f} | "
                f"{vocoder / audio:.3f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
