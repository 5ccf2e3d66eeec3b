"""The GPU stream path's flow over whole sentences (`DeviceBackend.flow_sentences`): an
encoder batch is flowed in one call per size its sentences need, not padded to its longest
sentence, and a sentence's latents do not depend on which call it was in."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from engines.runtimes.onnx import OnnxStages
from engines.streaming.frames import SENTENCE_FLOW_FRAMES, FramePool, sentence_flow_groups
from engines.text.frontend import text_to_sentences
from engines.text.voice import Voice

TEXTS = [
    "Hi there.",
    "The operator builds engines in jobs, caches them, and packs several voices per GPU.",
    "Okay.",
]
QUIET = np.array([0.0, 1.0, 0.0], dtype=np.float32)  # noise, length, noise_w: repeatable


class RecordingTensorStages:
    """The device tensor API of a GPU runtime over onnxruntime on the CPU, recording the
    shape of every flow call."""

    def __init__(self, stages: OnnxStages, torch: Any) -> None:
        self.stages = stages
        self.torch = torch
        self.device = torch.device("cpu")
        self.flow_dtype = self.vocoder_dtype = torch.float32
        self.flow_calls: list[tuple[int, ...]] = []

    def encode_tensor(self, ids, lengths, scales, speaker_ids=None):
        prior, mask = self.stages.encode(ids.numpy(), lengths.numpy(), scales.numpy())
        return self.torch.from_numpy(prior), self.torch.from_numpy(mask)

    def flow_tensor(self, prior, mask, speaker_ids=None):
        self.flow_calls.append(tuple(prior.shape))
        return self.torch.from_numpy(self.stages.flow(prior.numpy(), mask.numpy()))


def flow_batch(stages: OnnxStages, voice: Voice) -> tuple[RecordingTensorStages, np.ndarray, list]:
    """Encode TEXTS as one batch and flow it on `DeviceBackend` (torch on the CPU):
    (runtime, frames, each sentence's stored latents)."""
    torch = pytest.importorskip("torch")  # not in the dev environment: run it on a GPU machine
    from engines.runtimes.device_frames import DeviceBackend

    sentences = [text_to_sentences(text, voice.config)[0] for text in TEXTS]
    longest = max(len(s.ids) for s in sentences)
    ids = np.zeros((len(sentences), longest), dtype=np.int64)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence.ids)] = sentence.ids
    lengths = np.array([len(s.ids) for s in sentences], dtype=np.int64)
    speakers = np.zeros(len(sentences), np.int64)
    runtime = RecordingTensorStages(stages, torch)
    backend = DeviceBackend(runtime, initial_pages=512, async_calls=False)
    prior, frames = backend.encode(ids, lengths, QUIET, speakers)
    tables = [backend.pool.allocate(int(count)) for count in frames]
    backend.store_prior(prior, tables, frames)
    assert backend.flow_sentences(prior, tables, frames, speakers)
    latents = []
    for table, count in zip(tables, frames, strict=True):
        index, _ = FramePool.window_index([table], np.zeros(1, np.int64), np.array([count]), count)
        latents.append(backend._latent[torch.from_numpy(index[0])].numpy())
    return runtime, frames, latents


def test_a_batch_is_flowed_in_one_call_per_size_its_sentences_need(
    stages: OnnxStages, joe: Voice
) -> None:
    runtime, frames, _ = flow_batch(stages, joe)
    sizes = [next(s for s in SENTENCE_FLOW_FRAMES if s >= count) for count in frames]
    assert len(set(sizes)) == 2, f"the texts should need two sizes, got {frames}"
    # The two short sentences share the smallest size; the long one has a call of its own.
    assert sorted(runtime.flow_calls) == [(1, 192, max(sizes)), (2, 192, min(sizes))]


def test_flow_groups_follow_the_sizes_and_give_up_past_the_largest() -> None:
    frames = np.array([100, 300, 256, 2000, 90])
    groups = sentence_flow_groups(frames)
    assert groups is not None
    assert [(size, list(rows)) for size, rows in groups] == [
        (256, [0, 2, 4]),
        (512, [1]),
        (2048, [3]),
    ]
    assert sentence_flow_groups(np.array([100, 2049])) is None
