"""The torch-cuda runtime on a real GPU (marked `gpu`; skipped where CUDA is absent).

Run on the GPU machine: ``pytest -q -m gpu tests/gpu -s`` (prints the measured SNR).
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from engines.streaming import StreamSink

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


class Sink(StreamSink):
    """A listener's chunks, in order, and how its stream ended."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.error: Exception | None = None
        self.done = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        assert not self.done.is_set(), "audio after the last chunk"
        self.chunks.append(np.array(pcm))

    def finish(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()


def assert_same_audio(reference: list[np.ndarray], heard: list[np.ndarray]) -> None:
    """Each listener's audio in `heard` is as long as its counterpart's in `reference` and
    the same above 50 dB (calls batch other rows together: the float sums differ slightly)."""
    for expected, audio in zip(reference, heard, strict=True):
        assert expected.shape == audio.shape
        noise = np.sum((audio - expected) ** 2)
        assert 10 * np.log10(np.sum(expected**2) / max(noise, 1e-9)) > 50.0


@pytest.fixture(scope="module")
def entry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.build.engine_build import build_engines, resolve_voice_model

    cache = tmp_path_factory.mktemp("engine-cache")
    return build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", cache).path


def test_fp16_audio_is_within_30_db_of_fp32_on_the_corpus(
    entry_dir: Path, corpus_ids: list[list[int]]
) -> None:
    from lab.gpu_bench import fp16_quality

    quality = fp16_quality(entry_dir, corpus_ids, sentences=40)
    print(f"\nFP16 vs FP32 on {quality['sentences']} corpus sentences: {quality}")
    assert quality["snr_db_all"] >= 30.0
    assert quality["snr_db_min"] >= 30.0


def test_fp32_on_the_gpu_matches_onnxruntime(entry_dir: Path) -> None:
    import onnxruntime as ort

    from engines.runtimes.torch_cuda.stages import TorchCudaStages

    latent = np.random.default_rng(4).standard_normal((2, 192, 48)).astype(np.float32)
    expected = (
        ort.InferenceSession(str(entry_dir / "vocoder.onnx"), providers=["CPUExecutionProvider"])
        .run(None, {"latent": latent})[0]
        .reshape(2, -1)
    )
    stages = TorchCudaStages(entry_dir, precision="fp32")
    actual = stages.vocode(latent)
    assert np.linalg.norm(actual - expected) / np.linalg.norm(expected) < 1e-4


def test_graph_replay_equals_eager_and_padding_rows_do_not_leak(entry_dir: Path) -> None:
    from engines.runtimes.torch_cuda.stages import TorchCudaStages

    graphed = TorchCudaStages(entry_dir, precision="fp16")
    eager = TorchCudaStages(entry_dir, precision="fp16", use_graphs=False)
    rng = np.random.default_rng(5)
    for batch in (3, 5, 3):  # buckets 4, 8, then 4 again (a replay, not a capture)
        latent = rng.standard_normal((batch, 192, 48)).astype(np.float32)
        a, b = graphed.vocode(latent), eager.vocode(latent)
        assert a.shape == b.shape == (batch, 48 * 256)
        assert np.allclose(a, b, atol=2e-3)
    assert len(graphed.vocoder_stage.graphs) == 2


def test_stream_scheduler_runs_on_the_gpu_runtime(entry_dir: Path, corpus_ids) -> None:
    from engines.runtimes.torch_cuda.stages import TorchCudaStages
    from lab.gpu_bench import simulate_streams

    stages = TorchCudaStages(entry_dir, precision="fp16")
    result = simulate_streams(stages, corpus_ids, streams=16, seconds=4.0, ramp_seconds=0.5)
    assert result["completed_streams"] > 0
    assert result["audio_seconds_per_second"] > 16  # faster than real time for 16 listeners


def test_the_encoder_beside_the_windows_gives_the_audio_of_the_encoder_in_the_step(
    entry_dir: Path, corpus_ids, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoder launched and taken up later, on its own CUDA stream (the plan's
    encoder_launch "beside": its own graph pool, its tensors read on the other stream) or
    queued on the windows' stream ("queued"), must give every stream the audio it gets with
    the encoder in the step ("inline")."""
    from engines.runtimes.torch_cuda.stages import TorchCudaStages
    from engines.streaming import StreamScheduler, SynthesisParams
    from engines.text.frontend import Sentence

    quiet = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    texts = [[Sentence("", corpus_ids[i]), Sentence("", corpus_ids[i + 1])] for i in range(12)]
    audio: dict[str, list[np.ndarray]] = {}
    for beside in ("inline", "beside", "queued"):
        stages = TorchCudaStages(entry_dir, precision="fp32", encoder_launch=beside)
        scheduler = StreamScheduler(stages, 22050)
        assert scheduler.backend.features.encodes_beside is (beside != "inline")
        scheduler.start()
        try:
            sinks = [Sink() for _ in texts]
            for sentences, sink in zip(texts, sinks, strict=True):
                scheduler.submit(list(sentences), quiet, sink)
            for sink in sinks:
                assert sink.done.wait(120) and sink.error is None and sink.chunks
        finally:
            scheduler.stop()
        audio[beside] = [np.concatenate(sink.chunks).astype(np.float64) for sink in sinks]
    for launched in ("beside", "queued"):
        assert_same_audio(audio["inline"], audio[launched])


def test_unpaced_streams_next_windows_in_padding_rows_give_the_same_audio(
    entry_dir: Path, corpus_ids, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpaced listeners of two voices (the joe voice loaded twice) on the GPU runtime
    (sentences flowed whole, calls padded to the graphs' batch buckets): the padding rows that
    take the windows following a stream's own in its call (planner.fill_with_next_windows)
    give every listener the audio it gets with them turned off (VOXFLEET_NEXT_WINDOWS=0)."""
    from engines.runtimes.torch_cuda.stages import TorchCudaStages
    from engines.streaming import StreamScheduler, SynthesisParams, planner
    from engines.streaming.types import VoiceSlot
    from engines.text.frontend import Sentence

    joined: list[int] = []
    fill = planner.fill_with_next_windows

    def counted(*args):
        joined.append(fill(*args))
        return joined[-1]

    monkeypatch.setattr(planner, "fill_with_next_windows", counted)
    quiet = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    texts = [[Sentence("", corpus_ids[i]), Sentence("", corpus_ids[i + 1])] for i in range(20)]
    audio: dict[str, list[np.ndarray]] = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("VOXFLEET_NEXT_WINDOWS", setting)
        stages = TorchCudaStages(entry_dir, precision="fp32")
        voices = [VoiceSlot(name, stages.load_voice(entry_dir, name)) for name in ("a", "b")]
        scheduler = StreamScheduler(stages, 22050)
        assert scheduler.rules.next_windows is (setting == "1")
        scheduler.start()
        try:
            sinks = [Sink() for _ in texts]
            for row, (sentences, sink) in enumerate(zip(texts, sinks, strict=True)):
                scheduler.submit(list(sentences), quiet, sink, voice=voices[row % 2])
            for sink in sinks:
                assert sink.done.wait(120) and sink.error is None and sink.chunks
        finally:
            scheduler.stop()
        audio[setting] = [np.concatenate(sink.chunks).astype(np.float64) for sink in sinks]
    assert sum(joined) > 0, "no padding row took a next window"
    assert_same_audio(audio["0"], audio["1"])


def test_one_voices_two_encoder_calls_a_step_and_next_windows_give_the_same_audio(
    entry_dir: Path, corpus_ids, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unpaced listeners of one voice, more than an encoder call's rows (8 here), on the GPU
    runtime: with two encoder calls a step (VOXFLEET_ENCODER_CALLS=2, the default) a step
    takes more new sentences than one call holds, and its calls' padding rows take next
    windows; every listener hears the audio it hears with one call a step (=1), where one
    voice takes no next windows."""
    from engines.contract.plan import WindowConfig
    from engines.runtimes.torch_cuda.stages import TorchCudaStages
    from engines.streaming import StreamScheduler, SynthesisParams
    from engines.streaming import scheduler as scheduler_module
    from engines.text.frontend import Sentence

    taken: list[int] = []
    plan = scheduler_module.plan_step

    def planned(*args, **kwargs):
        step = plan(*args, **kwargs)
        taken.append(len(step.encodes))
        return step

    monkeypatch.setattr(scheduler_module, "plan_step", planned)
    quiet = SynthesisParams(noise_scale=0.0, noise_w=0.0)
    texts = [[Sentence("", corpus_ids[i]), Sentence("", corpus_ids[i + 1])] for i in range(24)]
    audio: dict[str, list[np.ndarray]] = {}
    most: dict[str, int] = {}
    for setting in ("1", "2"):
        monkeypatch.setenv("VOXFLEET_ENCODER_CALLS", setting)
        taken.clear()
        stages = TorchCudaStages(entry_dir, precision="fp32")
        scheduler = StreamScheduler(stages, 22050, windows=WindowConfig(max_encoder_batch=8))
        # The shapes captured and the cost model seeded, as a pod's are (calls that capture a
        # graph on first use cost the step a second: it would take one sentence); every
        # listener waiting before the first step, so its new sentences are more than a call's.
        scheduler.warmup()
        sinks = [Sink() for _ in texts]
        for sentences, sink in zip(texts, sinks, strict=True):
            scheduler.submit(list(sentences), quiet, sink)
        scheduler.start()
        try:
            for sink in sinks:
                assert sink.done.wait(120) and sink.error is None and sink.chunks
        finally:
            scheduler.stop()
        audio[setting] = [np.concatenate(sink.chunks).astype(np.float64) for sink in sinks]
        most[setting] = max(taken)
    assert most["1"] <= 8 < most["2"], most
    assert_same_audio(audio["1"], audio["2"])
