"""The torch port of the stage graphs against onnxruntime, on the CPU (runs where torch imports).

These are the checks that let the CUDA runtime be trusted before it meets a GPU: same graphs,
same inputs, same numbers as onnxruntime; and no host/device traffic in the two stages that
are captured into CUDA graphs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from engines.runtimes.torch_cuda.convert import (  # noqa: E402
    OnnxModule,
    UnsupportedGraphError,
    check_supported,
)
from engines.runtimes.torch_cuda.stages import (  # noqa: E402
    TorchCudaStages,
    bucket_for,
)


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def test_vocoder_matches_onnxruntime(stage_dir: Path) -> None:
    latent = np.random.default_rng(1).standard_normal((2, 192, 24)).astype(np.float32)
    expected = session(stage_dir / "vocoder.onnx").run(None, {"latent": latent})[0]
    module = OnnxModule(stage_dir / "vocoder.onnx")
    actual = module(latent=torch.from_numpy(latent))[0].numpy()
    assert actual.shape == expected.shape == (2, 1, 1, 24 * 256)
    assert relative_error(actual, expected) < 1e-5
    assert module.transfers == 0


def test_flow_matches_onnxruntime_with_a_partial_mask(stage_dir: Path) -> None:
    rng = np.random.default_rng(2)
    prior = rng.standard_normal((2, 192, 40)).astype(np.float32)
    mask = np.ones((2, 1, 40), dtype=np.float32)
    mask[1, :, 25:] = 0.0
    expected = session(stage_dir / "flow.onnx").run(None, {"prior": prior, "mask": mask})[0]
    module = OnnxModule(stage_dir / "flow.onnx")
    actual = module(prior=torch.from_numpy(prior), mask=torch.from_numpy(mask))[0].numpy()
    assert relative_error(actual, expected) < 1e-5
    assert np.all(actual[1, :, 25:] == 0.0)
    assert module.transfers == 0  # capturable into a CUDA graph


@pytest.mark.parametrize("stage", ["vocoder", "flow"])
def test_convolutions_as_channels_last_rows_match_onnxruntime(stage_dir: Path, stage: str) -> None:
    """A GPU module in FP16 runs its 1-D convolutions as channels-last 2-D ones (no cuDNN
    layout transposes); forced on here, on the CPU, the numbers are onnxruntime's, and each
    weight is laid out once, not on every call (a CUDA graph would replay the copy)."""
    rng = np.random.default_rng(3)
    if stage == "vocoder":
        inputs = {"latent": rng.standard_normal((2, 192, 24)).astype(np.float32)}
    else:
        mask = np.ones((2, 1, 40), dtype=np.float32)
        mask[1, :, 25:] = 0.0
        inputs = {"prior": rng.standard_normal((2, 192, 40)).astype(np.float32), "mask": mask}
    expected = session(stage_dir / f"{stage}.onnx").run(None, inputs)[0]
    module = OnnxModule(stage_dir / f"{stage}.onnx")
    assert not module.channels_last  # only on a GPU in FP16
    module.channels_last = True
    feeds = {name: torch.from_numpy(value) for name, value in inputs.items()}
    actual = module(**feeds)[0].numpy()
    assert relative_error(actual, expected) < 1e-5
    laid_out = len(module._channels_last_weights)
    assert laid_out > 0
    module(**feeds)
    assert len(module._channels_last_weights) == laid_out and module.transfers == 0


def test_encoder_matches_onnxruntime(stage_dir: Path, corpus_ids: list[list[int]]) -> None:
    short = sorted(corpus_ids, key=len)[:2]
    ids = np.zeros((2, max(map(len, short))), dtype=np.int64)
    for row, sentence in enumerate(short):
        ids[row, : len(sentence)] = sentence
    lengths = np.array([len(s) for s in short], dtype=np.int64)
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)  # noise off: deterministic
    feeds = {"input": ids, "input_lengths": lengths, "scales": scales}
    prior, mask = session(stage_dir / "encoder.onnx").run(None, feeds)
    module = OnnxModule(stage_dir / "encoder.onnx")
    got_prior, got_mask = module(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    assert got_mask.shape == mask.shape and np.array_equal(got_mask.numpy(), mask)
    assert relative_error(got_prior.numpy(), prior) < 1e-4


def test_flow_frame_padding_changes_nothing(stage_dir: Path) -> None:
    rng = np.random.default_rng(3)
    prior = torch.from_numpy(rng.standard_normal((3, 192, 37)).astype(np.float32))
    mask = torch.ones(3, 1, 37)
    exact = TorchCudaStages(stage_dir, device="cpu", precision="fp32", flow_frame_multiple=1)
    padded = TorchCudaStages(stage_dir, device="cpu", precision="fp32", flow_frame_multiple=32)
    a, b = exact.flow_tensor(prior, mask), padded.flow_tensor(prior, mask)
    assert b.shape == (3, 192, 37)
    assert torch.allclose(a, b, atol=1e-5)


def _run_both(graph: onnx.GraphProto, feeds: dict[str, np.ndarray]) -> None:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    expected = ort.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, feeds)
    actual = OnnxModule(model)(**{k: torch.from_numpy(v) for k, v in feeds.items()})
    for got, want in zip(actual, expected, strict=True):
        assert got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


def test_slice_with_negative_steps_and_reverse_cumsum_match_onnxruntime() -> None:
    def const(name: str, values: list[int]) -> onnx.TensorProto:
        return helper.make_tensor(name, TensorProto.INT64, [len(values)], values)

    nodes = [
        helper.make_node("Slice", ["x", "s0", "e0", "a0", "st0"], ["flipped"]),
        helper.make_node("Slice", ["x", "s1", "e1", "a1", "st1"], ["strided"]),
        helper.make_node("CumSum", ["x", "axis"], ["cum"], exclusive=1, reverse=1),
        helper.make_node("Gather", ["x", "idx"], ["picked"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "ops",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7])],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
            for n in ("flipped", "strided", "cum", "picked")
        ],
        initializer=[
            const("s0", [-1]),
            const("e0", [-(2**63)]),
            const("a0", [1]),
            const("st0", [-1]),
            const("s1", [5]),
            const("e1", [0]),
            const("a1", [1]),
            const("st1", [-2]),
            helper.make_tensor("axis", TensorProto.INT64, [], [1]),
            const("idx", [-1, 0, 3]),
        ],
    )
    _run_both(graph, {"x": np.arange(14, dtype=np.float32).reshape(2, 7)})


def test_unsupported_operators_are_named() -> None:
    graph = helper.make_graph(
        [helper.make_node("Celu", ["x"], ["y"]), helper.make_node("Erf", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    with pytest.raises(UnsupportedGraphError, match="does not implement: Celu"):
        check_supported(model)


@pytest.mark.parametrize("batch, bucket", [(1, 1), (3, 4), (64, 64), (65, 128), (300, 256)])
def test_batches_are_padded_to_the_next_bucket(batch: int, bucket: int) -> None:
    assert bucket_for(batch, (1, 2, 4, 8, 16, 32, 64, 128, 256)) == bucket


def test_runtime_refuses_to_start_without_cuda(stage_dir: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from engines.runtimes import load_stages
    from engines.runtimes.torch_cuda.stages import TorchCudaError

    with pytest.raises(TorchCudaError, match="needs a CUDA GPU"):
        load_stages("torch-cuda", stage_dir)


def test_torch_cuda_entry_records_its_precision(tmp_path: Path) -> None:
    from engines.build.engine_build import Target, build_engines, resolve_voice_model

    target = Target(f"torch-{torch.__version__}", "NVIDIA-H100-80GB-HBM3", "9.0")
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", None, tmp_path, target=target)
    assert entry.key.precision == "fp16"
    from engines.runtimes.torch_cuda.stages import _read_precision

    assert _read_precision(entry.path) == "fp16"
    assert {info["stage"] for info in entry.files.values()} == {"encoder", "flow", "vocoder", ""}


def _padded_batch(sentences: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.zeros((len(sentences), max(map(len, sentences))), dtype=np.int64)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence)] = sentence
    return ids, np.array([len(s) for s in sentences], dtype=np.int64)


def test_encoder_modules_match_onnxruntime(stage_dir: Path, corpus_ids: list[list[int]]) -> None:
    from engines.runtimes.torch_cuda import acoustic

    ids, lengths = _padded_batch([corpus_ids[0], corpus_ids[5], corpus_ids[9]])
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    feeds = {"input": ids, "input_lengths": lengths, "scales": scales}
    prior, mask = session(stage_dir / "encoder.onnx").run(None, feeds)
    core = acoustic.from_onnx(stage_dir / "encoder.onnx", torch.device("cpu"))
    with torch.no_grad():
        outputs = core(
            torch.from_numpy(ids), torch.from_numpy(lengths), torch.zeros(3, 2, ids.shape[1])
        )
        got_prior, got_mask = acoustic.expand(*outputs, length_scale=1.0, noise_scale=0.0)
    assert np.array_equal(got_mask.numpy(), mask)  # the same durations, frame for frame
    assert relative_error(got_prior.numpy(), prior) < 1e-4


def test_encoder_modules_match_the_graph_with_noise(
    stage_dir: Path, corpus_ids: list[list[int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same noise into both: checks the spline away from 0, where noise 0 never goes."""
    from engines.runtimes.torch_cuda import acoustic, convert

    ids, lengths = _padded_batch([corpus_ids[1], corpus_ids[2]])
    z = torch.randn(2, 2, ids.shape[1], generator=torch.Generator().manual_seed(3))
    core = acoustic.from_onnx(stage_dir / "encoder.onnx", torch.device("cpu"))
    with torch.no_grad():
        outputs = core(torch.from_numpy(ids), torch.from_numpy(lengths), z * 0.8)
        prior, mask = acoustic.expand(
            *outputs,
            length_scale=1.0,
            noise_scale=0.667,
            generator=torch.Generator().manual_seed(7),
        )
    noises = [z, torch.randn(prior.shape, generator=torch.Generator().manual_seed(7))]

    def replay_noise(module: object, node: object, args: list) -> list:
        return [noises.pop(0).reshape(args[0].shape)]

    monkeypatch.setitem(convert._OPS, "RandomNormalLike", replay_noise)
    graph_prior, graph_mask = OnnxModule(stage_dir / "encoder.onnx")(
        input=torch.from_numpy(ids),
        input_lengths=torch.from_numpy(lengths),
        scales=torch.tensor([0.667, 1.0, 0.8]),
    )
    assert torch.equal(mask, graph_mask)
    assert torch.allclose(prior, graph_prior, atol=1e-4)


def test_the_text_encoder_at_bf16_stays_near_fp32_and_hands_fp32_on(
    stage_dir: Path, corpus_ids: list[list[int]]
) -> None:
    from engines.runtimes.torch_cuda import acoustic

    ids, lengths = _padded_batch([corpus_ids[0], corpus_ids[5], corpus_ids[9]])
    feeds = (torch.from_numpy(ids), torch.from_numpy(lengths), torch.zeros(3, 2, ids.shape[1]))
    path, cpu = stage_dir / "encoder.onnx", torch.device("cpu")
    with torch.no_grad():
        m_exact, _, mask, logw_exact = acoustic.from_onnx(path, cpu)(*feeds)
        outputs = acoustic.from_onnx(path, cpu, text_precision="bf16")(*feeds)
    m_half, _, mask_half, logw_half = outputs
    # The duration predictor, and everything after the text part, stays FP32.
    assert all(tensor.dtype == torch.float32 for tensor in outputs)
    assert torch.equal(mask, mask_half)
    error = relative_error(m_half.numpy(), m_exact.numpy())
    assert 1e-4 < error < 0.05, error  # it ran at BF16, and close to FP32
    frames = torch.ceil(torch.exp(logw_exact) * mask)
    same = float((torch.ceil(torch.exp(logw_half) * mask) == frames).sum() / mask.sum())
    assert same > 0.9, f"only {same:.0%} of the phonemes kept their frame count"


def test_an_unknown_encoder_precision_is_refused_by_name(stage_dir: Path) -> None:
    from engines.runtimes.torch_cuda.stages import TorchCudaError

    with pytest.raises(TorchCudaError, match="runs fp32, bf16, fp16, not 'int8'"):
        TorchCudaStages(stage_dir, device="cpu", precision="fp32", encoder_precision="int8")


def test_the_precision_bench_sets_moved_durations_apart_from_the_audio_snr(
    stage_dir: Path, corpus_ids: list[list[int]]
) -> None:
    from lab.encoder_precision import compare

    def runtime(precision: str) -> TorchCudaStages:
        return TorchCudaStages(
            stage_dir, device="cpu", precision="fp32", use_graphs=False,
            encoder_precision=precision,
        )  # fmt: skip

    reference = runtime("fp32")
    same = compare(reference, runtime("fp32"), corpus_ids, sentences=2)
    assert same["phonemes_with_another_duration"] == 0
    assert same["sentences_with_a_moved_phoneme"] == 0 and same["audio_snr_db_min"] == float("inf")
    half = compare(reference, runtime("bf16"), corpus_ids, sentences=3)
    assert half["phonemes"] == same["phonemes"] + len(corpus_ids[2])
    assert 10 < half["prior_snr_db_min"] < 80
    compared = half["sentences"] - half["sentences_with_a_moved_phoneme"]
    assert (half["phonemes_with_another_duration"] == 0) == (compared == half["sentences"])
    assert (half["audio_snr_db_min"] is None) == (compared == 0)


def test_runtime_encode_pads_phonemes_without_changing_the_result(
    stage_dir: Path, corpus_ids: list[list[int]]
) -> None:
    ids, lengths = _padded_batch([corpus_ids[3], corpus_ids[4]])
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    expected_prior, expected_mask = session(stage_dir / "encoder.onnx").run(
        None, {"input": ids, "input_lengths": lengths, "scales": scales}
    )
    stages = TorchCudaStages(stage_dir, device="cpu", precision="fp32")
    assert stages.encoder_stage is not None  # the joe voice takes the module path
    prior, mask = stages.encode(ids, lengths, scales)
    assert np.array_equal(mask, expected_mask)
    assert relative_error(prior, expected_prior) < 1e-4


def test_frames_kept_on_the_device_stream_the_same_audio(
    stage_dir: Path, corpus_ids: list[list[int]]
) -> None:
    """The scheduler with the device frame stores (torch, here on the CPU) against the host
    stores (onnxruntime): same windows, same audio; every page comes back."""
    import threading

    from engines.runtimes.device_frames import DeviceBackend
    from engines.runtimes.onnx import OnnxStages
    from engines.streaming import StreamScheduler, StreamSink, SynthesisParams
    from engines.text.frontend import Sentence

    class Sink(StreamSink):
        def __init__(self) -> None:
            self.chunks: list[np.ndarray] = []
            self.done = threading.Event()

        def audio(self, pcm: np.ndarray) -> None:
            self.chunks.append(pcm)

        def finish(self, error: Exception | None = None) -> None:
            assert error is None
            self.done.set()

    def stream(runtime: object) -> tuple[list[list[np.ndarray]], StreamScheduler]:
        scheduler = StreamScheduler(runtime, 22050)  # type: ignore[arg-type]
        sinks = [Sink() for _ in range(3)]
        scheduler.start()
        try:
            for row, sink in enumerate(sinks):
                sentences = [Sentence(text="", ids=corpus_ids[row + k]) for k in range(2)]
                scheduler.submit(sentences, SynthesisParams(noise_scale=0.0, noise_w=0.0), sink)
            for sink in sinks:
                assert sink.done.wait(300)
        finally:
            scheduler.stop()
        return [sink.chunks for sink in sinks], scheduler

    torch_stages = TorchCudaStages(stage_dir, device="cpu", precision="fp32")
    device_chunks, scheduler = stream(torch_stages)
    assert isinstance(scheduler.backend, DeviceBackend)
    assert scheduler.backend.pool.free_pages() == scheduler.backend.pool.pages - 1
    host_chunks, _ = stream(OnnxStages(stage_dir))
    for device, host in zip(device_chunks, host_chunks, strict=True):
        device_audio, host_audio = np.concatenate(device), np.concatenate(host)
        assert device_audio.shape == host_audio.shape
        difference = device_audio.astype(np.float64) - host_audio
        snr = 10 * np.log10(np.sum(host_audio.astype(np.float64) ** 2) / np.sum(difference**2))
        assert snr > 50.0


def test_warmup_seeds_the_cost_model_with_each_stage(stage_dir: Path, monkeypatch) -> None:
    from engines.streaming import StreamScheduler, WindowConfig

    stages = TorchCudaStages(stage_dir, device="cpu", precision="fp32")
    monkeypatch.setattr(stages, "warmup", lambda **shapes: 0)  # no graphs on the CPU
    windows = WindowConfig(first_window_frames=8, window_frames=16, max_batch_windows=2)
    scheduler = StreamScheduler(stages, 22050, windows=windows)
    scheduler.warmup()
    for stage, (calls, seconds, rows, _) in scheduler.costs.totals.items():
        assert calls >= 6 and seconds > 0 and rows > calls, stage  # batch 1 and a larger one
