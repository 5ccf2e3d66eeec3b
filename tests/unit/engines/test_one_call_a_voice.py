"""A busy GPU scheduler of several voices launches one vocoder call a voice a step, cut for
its widest window (`planner.VOCODER_LAUNCH_SHARE`, `_one_call_a_voice`): a narrower window
takes as much more of its sentence as that call's rows hold. Host frame stores stand in for
the GPU's, cut in its fixed window sizes; the listeners must hear the audio they hear with a
call a width."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from host_device import QUIET, TEXT, HostStages, Sink, SlowDevice

from engines.runtimes.onnx import OnnxStages
from engines.streaming import StreamScheduler, planner
from engines.streaming import scheduler as scheduler_module
from engines.streaming.types import VoiceSlot
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice

LISTENERS = 6


class SentenceFlowDevice(SlowDevice):
    """`SlowDevice` with a GPU backend's flow over whole sentences once they are encoded
    (`BackendFeatures.sentence_flow`): a window can then take any of its sentence's frames."""

    def __init__(self, runtime: Any) -> None:
        super().__init__(runtime)
        self.features = replace(self.features, sentence_flow=True)

    def flow_sentences(self, prior, tables, frames, speakers, voice=None) -> bool:
        self.store_prior(prior, tables, frames)  # the scheduler stores it only where not flowed
        for row, table in enumerate(tables):
            count = np.array([frames[row]], np.int64)
            zero = np.zeros(1, np.int64)
            self.flow([table], zero, count, int(count[0]), 0, count, speakers[row : row + 1], voice)
        return True


class VoiceOf:
    """A voice's weights: the runtime's own stages, as an object of their own."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime

    def __getattr__(self, name: str) -> Any:
        return getattr(self.runtime, name)


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def listen(stages: OnnxStages, sentences: list[Sentence], share: float | None) -> dict:
    """`LISTENERS` listeners a little apart, their audio and vocoder calls, with the launches
    held to `share` of a step (None: the default)."""
    scheduler = StreamScheduler(HostStages(stages, SentenceFlowDevice(stages)), 22050)
    if share is not None:
        scheduler.launch_share = share
    # Two voices of the same weights (each slot a voice of its own: its calls split).
    voices = [VoiceSlot(name, weights=VoiceOf(stages)) for name in ("a", "b")]
    scheduler.start()
    try:
        sinks = [Sink() for _ in range(LISTENERS)]
        for index, sink in enumerate(sinks):
            # Listeners a little apart, so that their windows are of different sizes at once.
            voice = voices[index // 2 % 2]
            scheduler.submit(list(sentences[index % 2 :]), QUIET, sink, voice=voice)
            time.sleep(0.05)
        for sink in sinks:
            assert sink.done.wait(120) and sink.error is None and sink.chunks
    finally:
        scheduler.stop()
    batches = scheduler.stats.vocoder_batches
    return {
        "audio": [np.concatenate(sink.chunks) for sink in sinks],
        "chunks": sum(len(sink.chunks) for sink in sinks),
        "calls": sum(batches.values()),
    }


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    reference, other = reference.astype(np.float64), other.astype(np.float64)
    noise = np.sum((reference - other) ** 2)
    return float(10 * np.log10(np.sum(reference**2) / max(noise, 1e-12)))


def test_one_call_a_voice_makes_the_audio_of_a_call_a_width(
    stages, sentences, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fewer calls and longer chunks, the same audio: within the windows' own error (each
    window's context frames give over 50 dB against a one-shot decode)."""
    # A busy scheduler from 2 live streams on, not 16: the CPU's calls are slow, so this many
    # listeners keep it busy for few steps.
    monkeypatch.setattr(planner, "ENCODE_HOLD_MIN_STREAMS", 2)
    held = listen(stages, sentences, None)
    width = listen(stages, sentences, 0.0)
    assert held["calls"] < width["calls"], (held["calls"], width["calls"])
    assert held["chunks"] < width["chunks"], (held["chunks"], width["chunks"])
    for mine, theirs in zip(held["audio"], width["audio"], strict=True):
        assert len(mine) == len(theirs)
        assert snr_db(theirs, mine) > 50


@pytest.mark.parametrize("value", ["half", "-0.1", "2"])
def test_a_launch_share_that_is_no_share_is_refused_by_name(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(scheduler_module.LAUNCH_SHARE_ENV, value)
    with pytest.raises(
        ValueError, match=f"VOXFLEET_LAUNCH_SHARE must be a share from 0 to 1, got '{value}'"
    ):
        scheduler_module.launch_share_from_environment()
    monkeypatch.setenv(scheduler_module.LAUNCH_SHARE_ENV, "0")
    assert scheduler_module.launch_share_from_environment() == 0.0
    monkeypatch.delenv(scheduler_module.LAUNCH_SHARE_ENV)
    assert scheduler_module.launch_share_from_environment() == planner.VOCODER_LAUNCH_SHARE
