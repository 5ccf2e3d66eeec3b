"""Voices as weight sets on one torch-cuda runtime (runs where torch imports: on the CPU here,
on the GPU where there is one; engines/runtimes/torch_cuda/weights.py).

Each voice must run on its own weights: a perturbed copy of joe loaded into joe's runtime
gives the audio its own runtime gives, and not joe's; streams of both voices interleaved on
one scheduler each get their own voice's audio; a voice of another architecture is refused
with the reason, and nothing of it stays loaded.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engines.artifacts.split import split_voice  # noqa: E402
from engines.contract.plan import WindowConfig  # noqa: E402
from engines.runtimes.torch_cuda.stages import TorchCudaStages  # noqa: E402
from engines.runtimes.torch_cuda.weights import ArchitectureMismatch  # noqa: E402
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams, VoiceSlot  # noqa: E402
from engines.text.frontend import Sentence  # noqa: E402
from engines.text.voice import load_voice  # noqa: E402
from lab.voices import perturbed_voice  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
PRECISION = "fp16" if DEVICE == "cuda" else "fp32"
QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)
# A grouped call's rows against their own voice's call, relative to the output's largest
# value: FP16's rounding on a GPU, FP32's on the CPU.
TOLERANCE = 4e-3 if PRECISION == "fp16" else 1e-3


def snr_db(actual: np.ndarray, expected: np.ndarray) -> float:
    n = min(len(actual), len(expected))
    a, e = actual[:n].astype(np.float64), expected[:n].astype(np.float64)
    return float(10 * np.log10(np.sum(e**2) / max(np.sum((a - e) ** 2), 1e-12)))


@pytest.fixture(scope="module")
def entries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """joe and a perturbed copy of it (its own weights, the same graphs), split for torch."""
    work = tmp_path_factory.mktemp("voices")
    joe = load_voice("joe").model_path
    other = perturbed_voice(joe, work / "voices", "joe-copy", seed=7, scale=0.01)
    entries = {}
    for name, model in (("joe", joe), ("copy", other)):
        entries[name] = work / name
        split_voice(model, entries[name])
    return entries


def one_shot(stages: TorchCudaStages, ids: list[int], voice=None) -> np.ndarray:
    """A sentence decoded in one call per stage (no windows), noise off."""
    prior, mask = stages.encode(
        np.array([ids]), np.array([len(ids)]), np.array([0.0, 1.0, 0.0], np.float32), None, voice
    )
    latent = stages.flow(prior, mask, None, voice)
    return stages.vocode(latent, None, voice)[0]


def test_a_loaded_voice_runs_on_its_own_weights(entries: dict[str, Path], corpus_ids) -> None:
    shared = TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION)
    copy = shared.load_voice(entries["copy"], "joe-copy")
    alone = TorchCudaStages(entries["copy"], device=DEVICE, precision=PRECISION)
    assert copy.nbytes == shared.weights_bytes() > 0
    ids = corpus_ids[0]
    joe_audio = one_shot(shared, ids)
    copy_audio = one_shot(shared, ids, copy)
    # The copy, bound into joe's modules, is the copy: as its own runtime decodes it.
    assert snr_db(copy_audio, one_shot(alone, ids)) > 60.0
    # and not joe (a 1 % perturbation is audible: well under 30 dB apart).
    assert snr_db(copy_audio, joe_audio) < 30.0
    # joe is still joe after the copy was bound (its buffers came back).
    assert snr_db(one_shot(shared, ids), joe_audio) > 60.0


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"vocoder_streams": 3},
        {"encoder_streams": 2, "encoder_launch": "queued"},
        {"voice_lanes": 2, "grouped_stages": ("encoder", "vocoder")},
    ],
    ids=["one-stream", "three-streams", "encoder-streams", "grouped"],
)
def test_streams_of_two_voices_on_one_scheduler_each_get_their_voice(
    entries: dict[str, Path], corpus_ids, settings: dict
) -> None:
    """With the vocoder's calls spread over three CUDA streams too (on a GPU), the encoder's
    over two, or both voices' rows in grouped calls, each listener hears its own voice, and
    the sentences' flows never overwrite what a call still reads."""
    shared = TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION, **settings)
    slots = {
        "joe": VoiceSlot("joe", shared.default_voice),
        "copy": VoiceSlot("joe-copy", shared.load_voice(entries["copy"], "joe-copy")),
    }

    class Sink(StreamSink):
        def __init__(self) -> None:
            self.chunks: list[np.ndarray] = []
            self.done = threading.Event()
            self.error: Exception | None = None

        def audio(self, pcm: np.ndarray) -> None:
            self.chunks.append(np.array(pcm))

        def finish(self, error: Exception | None = None) -> None:
            self.error = error
            self.done.set()

    scheduler = StreamScheduler(shared, 22050)
    scheduler.start()
    sinks: dict[str, list[Sink]] = {"joe": [], "copy": []}
    try:
        for _ in range(3):  # interleaved: every step has windows of both voices
            for name, slot in slots.items():
                sink = Sink()
                scheduler.submit([Sentence("", corpus_ids[1])], QUIET, sink, voice=slot)
                sinks[name].append(sink)
        for sink in [*sinks["joe"], *sinks["copy"]]:
            assert sink.done.wait(300) and sink.error is None
    finally:
        scheduler.stop()
    reference = {
        name: one_shot(shared, corpus_ids[1], slot.weights) for name, slot in slots.items()
    }
    for name, streamed in sinks.items():
        other = "copy" if name == "joe" else "joe"
        for sink in streamed:
            audio = np.concatenate(sink.chunks).astype(np.float32) / 32767.0
            # Windowed decoding is within the streaming tolerance of the one-shot decode.
            assert snr_db(audio, reference[name]) > 35.0, name
            assert snr_db(audio, reference[other]) < 30.0, name
    assert slots["joe"].stats.streams_total == slots["copy"].stats.streams_total == 3
    assert scheduler.stats.streams_total == 6
    if DEVICE == "cuda":
        # every stream ran calls: the calls of a step's voices ran side by side
        assert all(shared.vocoder_calls_by_stream), shared.vocoder_calls_by_stream
        assert len(shared.vocoder_calls_by_stream) == settings.get("vocoder_streams", 1)
        if "voice_lanes" in settings:  # and both voices' windows shared grouped calls
            assert shared.vocoder_stage.lane_histogram, "no grouped vocoder call ran"
        by_stream = shared.encoder_calls_by_stream
        assert len(by_stream) == settings.get("encoder_streams", 1)
        assert all(by_stream), by_stream


@pytest.mark.skipif(DEVICE != "cuda", reason="further CUDA streams need a GPU")
def test_vocoder_calls_on_further_streams_are_their_own_voices_calls(
    entries: dict[str, Path],
) -> None:
    """Calls of two voices taking three streams in turn, queued without waiting, each give
    what the voice's call on the windows' stream gives; a call of more windows than
    SPREAD_MAX_ROWS stays on the windows' stream."""
    from engines.runtimes.torch_cuda.stages import SPREAD_MAX_ROWS

    shared = TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION, vocoder_streams=3)
    copy = shared.load_voice(entries["copy"], "joe-copy")
    # The streams take lanes of the vocoder's weights, but no grouped calls (nor their graphs).
    assert not shared.groups_voices
    assert shared.vocoder_stage.lane_shape(2, 1) is None
    rng = np.random.default_rng(8)
    latents = [
        torch.from_numpy(rng.standard_normal((rows, 192, 24)).astype(np.float32))
        for rows in (3, 5, 8, 2, 7, 4)
    ]
    voices = [copy, None, copy, None, None, copy]
    spread = []
    for latent, voice in zip(latents, voices, strict=True):
        with shared.vocoder_stream(latent.shape[0]):
            spread.append(shared.vocode_tensor(latent, None, voice))
    shared.join_vocoder_streams()
    assert shared.vocoder_calls_by_stream == (2, 2, 2)
    for latent, voice, out in zip(latents, voices, spread, strict=True):
        alone = shared.vocode_tensor(latent, None, voice).float()
        assert float((out.float() - alone).abs().max()) < TOLERANCE * float(alone.abs().max())
        other = shared.vocode_tensor(latent, None, None if voice is copy else copy).float()
        assert float((out.float() - other).abs().max()) > 1e-2 * float(other.abs().max())
    wide = torch.zeros(SPREAD_MAX_ROWS + 1, 192, 24)
    before = shared.vocoder_calls_by_stream
    with shared.vocoder_stream(wide.shape[0]):
        shared.vocode_tensor(wide)
    assert shared.vocoder_calls_by_stream[0] == before[0] + 1
    assert shared.vocoder_calls_by_stream[1:] == before[1:]


def test_vocoder_streams_are_checked_and_read_from_the_environment(
    entries: dict[str, Path], monkeypatch
) -> None:
    from engines.runtimes.torch_cuda import load
    from engines.runtimes.torch_cuda.stages import TorchCudaError

    with pytest.raises(TorchCudaError, match="vocoder_streams is at least 1"):
        TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION, vocoder_streams=0)
    with pytest.raises(TorchCudaError, match=r"grouped over voices .* or spread"):
        TorchCudaStages(
            entries["joe"],
            device=DEVICE,
            precision=PRECISION,
            voice_lanes=2,
            grouped_stages=("vocoder",),
            vocoder_streams=2,
        )
    monkeypatch.setenv("VOXFLEET_VOCODER_STREAMS", "two")
    with pytest.raises(TorchCudaError, match="VOXFLEET_VOCODER_STREAMS is a whole number"):
        load(entries["joe"], WindowConfig())
    monkeypatch.setenv("VOXFLEET_VOCODER_STREAMS", "2")
    streams = load(entries["joe"], WindowConfig()).vocoder_streams
    assert streams == (2 if DEVICE == "cuda" else 1)  # one stream on the CPU


@pytest.mark.skipif(DEVICE != "cuda", reason="further CUDA streams need a GPU")
def test_encoder_calls_on_further_streams_are_their_own_voices_calls(
    entries: dict[str, Path], corpus_ids
) -> None:
    """A step's encoder calls of two voices launched one after another take three streams in
    turn; each gives the prior its voice's call on the windows' stream gives, and is charged
    its span over the streams it shared; a call of more sentences than
    ENCODER_SPREAD_MAX_ROWS stays on the windows' stream."""
    from engines.runtimes.torch_cuda.stages import ENCODER_SPREAD_MAX_ROWS

    shared = TorchCudaStages(
        entries["joe"],
        device=DEVICE,
        precision=PRECISION,
        encoder_launch="queued",
        encoder_streams=3,
    )
    copy = shared.load_voice(entries["copy"], "joe-copy")
    assert shared.encoder_streams == 3 and shared.encoder_calls_in_flight == 9
    scales = torch.tensor([0.0, 1.0, 0.0])  # no noise: the same call gives the same prior

    def batch(first: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        sentences = [corpus_ids[(first + row) % len(corpus_ids)] for row in range(rows)]
        longest = max(len(ids) for ids in sentences)
        ids = torch.zeros(rows, longest, dtype=torch.int64)
        for row, sentence in enumerate(sentences):
            ids[row, : len(sentence)] = torch.tensor(sentence)
        return ids, torch.tensor([len(ids) for ids in sentences])

    inputs = [batch(0, 3), batch(1, 2), batch(2, 4), batch(3, 1)]
    voices = [copy, None, copy, None]
    calls = [
        shared.encode_launch(ids, n, scales, None, v)
        for (ids, n), v in zip(inputs, voices, strict=True)
    ]
    assert shared.encoder_calls_by_stream == (2, 1, 1)
    priors = [call.finish() for call in calls]
    for (ids, lengths), voice, (prior, frames), call in zip(
        inputs, voices, priors, calls, strict=True
    ):
        alone, mask = shared.encode_tensor(ids, lengths, scales, None, voice)
        assert frames.tolist() == mask[:, 0, :].sum(dim=1).to(torch.int64).tolist()
        width, scale = int(frames.max()), float(alone.abs().max())
        assert float((prior[..., :width] - alone[..., :width]).abs().max()) < 1e-3 * scale
        other, _ = shared.encode_tensor(ids, lengths, scales, None, None if voice else copy)
        assert other.shape != alone.shape or float((other - alone).abs().max()) > 1e-3 * scale
        assert call.seconds() > 0
    wide = batch(0, ENCODER_SPREAD_MAX_ROWS + 1)
    shared.flow_tensor(torch.zeros(1, 192, 32), torch.ones(1, 1, 32))  # (a new group)
    before = shared.encoder_calls_by_stream
    shared.encode_launch(*wide, scales).finish()
    shared.encode_launch(*wide, scales).finish()
    after = shared.encoder_calls_by_stream
    assert after[0] == before[0] + 2 and after[1:] == before[1:]


def test_encoder_streams_are_checked_and_read_from_the_environment(
    entries: dict[str, Path], monkeypatch
) -> None:
    from engines.runtimes.torch_cuda import load
    from engines.runtimes.torch_cuda.stages import TorchCudaError

    joe = entries["joe"]
    with pytest.raises(TorchCudaError, match="encoder_streams is at least 1"):
        TorchCudaStages(joe, device=DEVICE, precision=PRECISION, encoder_streams=0)
    with pytest.raises(TorchCudaError, match="spreads queued encoder calls"):
        TorchCudaStages(
            joe, device=DEVICE, precision=PRECISION, encoder_launch="beside", encoder_streams=2
        )
    with pytest.raises(TorchCudaError, match=r"encoder's calls are grouped over voices"):
        TorchCudaStages(
            joe,
            device=DEVICE,
            precision=PRECISION,
            encoder_launch="queued",
            voice_lanes=2,
            grouped_stages=("encoder",),
            encoder_streams=2,
        )
    monkeypatch.setenv("VOXFLEET_ENCODER_STREAMS", "-1")
    with pytest.raises(TorchCudaError, match="VOXFLEET_ENCODER_STREAMS is a whole number"):
        load(joe, WindowConfig())
    monkeypatch.setenv("VOXFLEET_ENCODER_STREAMS", "2")
    streams = load(joe, WindowConfig()).encoder_streams  # (the plan's launch: queued)
    assert streams == (2 if DEVICE == "cuda" else 1)  # one stream on the CPU


def test_a_voice_of_another_architecture_is_refused_with_the_reason(
    entries: dict[str, Path], tmp_path: Path
) -> None:
    import onnx
    from onnx import numpy_helper

    shared = TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION)
    other = tmp_path / "other"
    other.mkdir()
    for path in entries["copy"].iterdir():
        (other / path.name).write_bytes(path.read_bytes())
    vocoder = onnx.load(str(other / "vocoder.onnx"))
    bias = next(i for i in vocoder.graph.initializer if i.name.endswith(".bias"))
    widened = np.concatenate([numpy_helper.to_array(bias)] * 2)
    bias.CopyFrom(numpy_helper.from_array(widened, bias.name))
    onnx.save(vocoder, str(other / "vocoder.onnx"))
    mismatch = r"vocoder: .* in the voice and .* in the architecture"
    with pytest.raises(ArchitectureMismatch, match=mismatch):
        shared.load_voice(other, "other")
    # The shared voice still speaks, and nothing of the refused one was kept.
    assert shared.default_voice.flats


def grouped_vocoder(entries: dict[str, Path]) -> tuple[TorchCudaStages, object]:
    """joe's runtime with the vocoder in 8 lanes, and the copy loaded into it."""
    shared = TorchCudaStages(
        entries["joe"],
        device=DEVICE,
        precision=PRECISION,
        voice_lanes=8,
        grouped_stages=("vocoder",),
    )
    return shared, shared.load_voice(entries["copy"], "joe-copy")


def test_rows_of_several_voices_in_one_call_each_get_their_own_voice(
    entries: dict[str, Path],
) -> None:
    """A vocoder call with rows of two voices, interleaved, runs as one grouped call (each
    voice in a lane of its own); every row is what its own voice's call makes of it."""
    shared, copy = grouped_vocoder(entries)
    assert shared.groups_voices
    latent = torch.from_numpy(
        np.random.default_rng(5).standard_normal((6, 192, 24)).astype(np.float32)
    )
    voices = [None, copy, copy, shared.default_voice, copy, None]
    together = shared.vocode_tensor(latent, None, voices).float()
    assert shared.vocoder_stage.lane_histogram == {(2, 4): 1}
    for voice, rows in ((shared.default_voice, [0, 3, 5]), (copy, [1, 2, 4])):
        alone = shared.vocode_tensor(latent[rows], None, voice).float()
        scale = float(alone.abs().max())
        assert float((together[rows] - alone).abs().max()) < TOLERANCE * scale
    # and the voices differ: a row in the other voice's lane would be caught.
    joe_rows = shared.vocode_tensor(latent[[1]], None, shared.default_voice).float()
    assert float((together[[1]] - joe_rows).abs().max()) > 1e-2 * float(joe_rows.abs().max())


def test_a_voice_with_more_rows_than_a_lane_takes_runs_alone_and_is_still_itself(
    entries: dict[str, Path],
) -> None:
    from engines.runtimes.torch_cuda.stages import MAX_LANE_ROWS

    shared, copy = grouped_vocoder(entries)
    rows = MAX_LANE_ROWS + 2
    latent = torch.from_numpy(
        np.random.default_rng(6).standard_normal((rows + 1, 192, 8)).astype(np.float32)
    )
    voices = [copy] * rows + [None]
    together = shared.vocode_tensor(latent, None, voices).float()
    assert shared.vocoder_stage.lane_histogram == {}  # no grouped call: two calls
    alone = shared.vocode_tensor(latent[:rows], None, copy).float()
    assert float((together[:rows] - alone).abs().max()) < TOLERANCE * float(alone.abs().max())
    joe = shared.vocode_tensor(latent[rows:], None, None).float()
    assert float((together[rows:] - joe).abs().max()) < TOLERANCE * float(joe.abs().max())


def test_a_voice_alone_beside_a_grouped_call_is_still_itself(entries: dict[str, Path]) -> None:
    """Three voices in one call: two of few rows share a grouped call, the third (more rows
    than a lane takes) runs alone after it; every row is its own voice's."""
    from engines.runtimes.torch_cuda.stages import MAX_LANE_ROWS

    shared, copy = grouped_vocoder(entries)
    # (the copy's weights again, as a voice of its own: a separate lane, a separate call)
    third = shared.load_voice(entries["copy"], "joe-copy-2")
    many = MAX_LANE_ROWS + 2
    latent = torch.from_numpy(
        np.random.default_rng(8).standard_normal((many + 4, 192, 8)).astype(np.float32)
    )
    voices = [None, copy, None, copy] + [third] * many
    together = shared.vocode_tensor(latent, None, voices).float()
    assert shared.vocoder_stage.lane_histogram == {(2, 2): 1}
    for voice, rows in (
        (shared.default_voice, [0, 2]),
        (copy, [1, 3]),
        (third, list(range(4, 4 + many))),
    ):
        alone = shared.vocode_tensor(latent[rows], None, voice).float()
        scale = float(alone.abs().max())
        assert float((together[rows] - alone).abs().max()) < TOLERANCE * scale


def test_a_runtime_without_lanes_runs_each_voice_in_a_call_of_its_own(
    entries: dict[str, Path],
) -> None:
    shared = TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION, voice_lanes=1)
    copy = shared.load_voice(entries["copy"], "joe-copy")
    assert not shared.groups_voices
    latent = torch.from_numpy(
        np.random.default_rng(7).standard_normal((3, 192, 8)).astype(np.float32)
    )
    together = shared.vocode_tensor(latent, None, [copy, None, copy]).float()
    assert shared.vocoder_stage.lane_histogram == {}
    alone = shared.vocode_tensor(latent[[0, 2]], None, copy).float()
    assert float((together[[0, 2]] - alone).abs().max()) < TOLERANCE * float(alone.abs().max())


def test_sentences_of_several_voices_in_one_encoder_call_each_get_their_own_voice(
    entries: dict[str, Path], corpus_ids
) -> None:
    """An encoder call with sentences of two voices runs as one grouped call (the encoder's
    lanes); each sentence's prior and durations are its own voice's."""
    shared = TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION, voice_lanes=8)
    copy = shared.load_voice(entries["copy"], "joe-copy")
    assert shared.grouped_stages == ("encoder",)
    rows = corpus_ids[:4]
    ids = np.zeros((4, max(map(len, rows))), np.int64)
    for row, sentence in enumerate(rows):
        ids[row, : len(sentence)] = sentence
    lengths = np.array([len(sentence) for sentence in rows])
    scales = np.array([0.0, 1.0, 0.0], np.float32)
    prior, mask = shared.encode(ids, lengths, scales, None, [None, copy, copy, None])
    assert shared.encoder_stage.lane_histogram == {(2, 2): 1}
    for voice, picked in ((None, [0, 3]), (copy, [1, 2])):
        alone_prior, alone_mask = shared.encode(ids[picked], lengths[picked], scales, None, voice)
        np.testing.assert_array_equal(mask[picked][..., : alone_mask.shape[-1]], alone_mask)
        width = alone_prior.shape[-1]
        scale = float(np.abs(alone_prior).max())
        assert float(np.abs(prior[picked][..., :width] - alone_prior).max()) < TOLERANCE * scale


def test_grouped_calls_are_off_by_default_and_a_bad_setting_is_named(
    entries: dict[str, Path], monkeypatch
) -> None:
    from engines.runtimes.torch_cuda import load
    from engines.runtimes.torch_cuda.stages import TorchCudaError

    assert not TorchCudaStages(entries["joe"], device=DEVICE, precision=PRECISION).groups_voices
    monkeypatch.setenv("VOXFLEET_VOICE_LANES", "many")
    with pytest.raises(TorchCudaError, match="VOXFLEET_VOICE_LANES"):
        load(entries["joe"], WindowConfig())
    monkeypatch.setenv("VOXFLEET_VOICE_LANES", "8")
    monkeypatch.setenv("VOXFLEET_GROUPED_STAGES", "flow")
    with pytest.raises(TorchCudaError, match="not flow"):
        load(entries["joe"], WindowConfig())


def test_only_graphs_of_many_rows_are_autotuned_and_the_threshold_is_read(monkeypatch) -> None:
    """cuDNN's autotuning (about a second a capture) is kept for the graphs whose calls carry
    enough rows for their kernels to matter; smaller ones take its heuristics."""
    from engines.runtimes.torch_cuda import _settings_from_environment
    from engines.runtimes.torch_cuda.stages import (
        AUTOTUNE_MIN_ROWS,
        GraphedStage,
        TorchCudaError,
    )

    stage = GraphedStage(None, function=lambda inputs: [inputs["x"]], device=torch.device("cpu"))
    stage.autotune, stage.autotune_min_rows = True, AUTOTUNE_MIN_ROWS
    seen: list[bool] = []
    monkeypatch.setattr(
        stage, "_capture_now", lambda bucket, inputs: seen.append(torch.backends.cudnn.benchmark)
    )
    for bucket in (1, AUTOTUNE_MIN_ROWS // 2, AUTOTUNE_MIN_ROWS, 4 * AUTOTUNE_MIN_ROWS):
        stage._capture(bucket, {"x": torch.zeros(bucket, 2)})
    assert seen == [False, False, True, True]
    stage.autotune = False  # a stage that is not autotuned never is
    stage._capture(4 * AUTOTUNE_MIN_ROWS, {"x": torch.zeros(1, 2)})
    assert seen[-1] is False

    monkeypatch.delenv("VOXFLEET_AUTOTUNE_MIN_ROWS", raising=False)
    assert "autotune_min_rows" not in _settings_from_environment()  # AUTOTUNE_MIN_ROWS
    monkeypatch.setenv("VOXFLEET_AUTOTUNE_MIN_ROWS", "1")
    assert _settings_from_environment()["autotune_min_rows"] == 1
    monkeypatch.setenv("VOXFLEET_AUTOTUNE_MIN_ROWS", "0")
    with pytest.raises(TorchCudaError, match="VOXFLEET_AUTOTUNE_MIN_ROWS"):
        _settings_from_environment()
