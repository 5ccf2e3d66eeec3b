"""The scheduler's asynchronous vocoder calls (GPU backends): the audio a stream gets, and the
order of its responses, are those of the synchronous path."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from host_device import play_queued

from engines.runtimes.onnx import OnnxStages
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice

torch = pytest.importorskip("torch")

TEXT = "Streaming speech arrives chunk by chunk. A second sentence follows the first."
QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)


class OrderedSink(StreamSink):
    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.chunks_at_finish: int | None = None
        self.error: Exception | None = None
        self.done = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        assert self.chunks_at_finish is None, "audio after the final response"
        self.chunks.append(np.array(pcm))

    def finish(self, error: Exception | None = None) -> None:
        self.chunks_at_finish = len(self.chunks)
        self.error = error
        self.done.set()


class CpuTensorStages:
    """The device tensor API of a GPU runtime over onnxruntime on the CPU."""

    name = "cpu-tensors"

    def __init__(self, stages: OnnxStages, async_calls: bool) -> None:
        self.stages = stages
        self.async_calls = async_calls
        self.device = torch.device("cpu")
        self.flow_dtype = self.vocoder_dtype = torch.float32

    def stream_backend(self):
        from engines.runtimes.device_frames import DeviceBackend

        return DeviceBackend(self, initial_pages=512, async_calls=self.async_calls)

    def encode_tensor(self, ids, lengths, scales, speaker_ids=None):
        prior, mask = self.stages.encode(ids.numpy(), lengths.numpy(), scales.numpy())
        return torch.from_numpy(prior), torch.from_numpy(mask)

    def flow_tensor(self, prior, mask, speaker_ids=None):
        return torch.from_numpy(self.stages.flow(prior.numpy(), mask.numpy()))

    def vocode_tensor(self, latent, speaker_ids=None):
        return torch.from_numpy(self.stages.vocode(latent.numpy()))


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def stream(stages: OnnxStages, sentences: list[Sentence], async_calls: bool) -> list[OrderedSink]:
    scheduler = StreamScheduler(CpuTensorStages(stages, async_calls), 22050)
    assert scheduler._async is async_calls
    sinks = [OrderedSink() for _ in range(3)]
    for sink in sinks:
        scheduler.submit(list(sentences), QUIET, sink)
    play_queued(scheduler, sinks)
    return sinks


def test_asynchronous_calls_send_the_same_audio_and_the_final_response_last(
    stages, sentences
) -> None:
    assert len(sentences) == 2
    synchronous = stream(stages, sentences, async_calls=False)
    asynchronous = stream(stages, sentences, async_calls=True)
    for sync_sink, async_sink in zip(synchronous, asynchronous, strict=True):
        assert async_sink.error is None
        assert async_sink.chunks_at_finish == len(async_sink.chunks)
        assert [len(c) for c in async_sink.chunks] == [len(c) for c in sync_sink.chunks]
        reference = np.concatenate(sync_sink.chunks).astype(np.float64)
        audio = np.concatenate(async_sink.chunks).astype(np.float64)
        noise = np.sum((audio - reference) ** 2)
        assert 10 * np.log10(np.sum(reference**2) / max(noise, 1e-9)) > 60.0
