"""The tensorrt runtime's logic that needs no TensorRT: profile checks, batch splitting, errors.

Executing plans is tested only where TensorRT imports (tests/gpu/test_tensorrt_runtime_gpu.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import types
from pathlib import Path

import numpy as np
import pytest

from engines.artifacts.engine_cache import EngineKey
from engines.runtimes import load_stages
from engines.runtimes.tensorrt.profiles import (
    MAX_PHONEMES,
    SENTENCE_FLOW_MAX_FRAMES,
    ServingShapes,
    flow_call_frames,
    stage_profiles,
    vocoder_call_frames,
)
from engines.runtimes.tensorrt.stages import (
    InputRange,
    StageProfile,
    TensorRTRuntimeError,
    TensorRTStages,
    batch_slices,
    choose_profile,
    import_tensorrt,
    plan_mismatch_error,
    read_entry_key,
    run_in_batches,
    torch_dtype,
)
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams, WindowConfig
from engines.text.frontend import Sentence

# The default WindowConfig: flow 80..304 frames (2,048 with whole sentences), vocoder 32..144.
PROFILES = stage_profiles()
KEY = EngineKey(
    model_sha256="cd" * 32,
    runtime="tensorrt",
    precision="fp16",
    runtime_version="tensorrt-10.3.0",
    gpu_product="Tesla-T4",
    compute_capability="7.5",
    profiles=PROFILES,
)


def write_plans(engine_dir: Path, stages: tuple[str, ...] = ("encoder", "flow", "vocoder")) -> None:
    engine_dir.mkdir(parents=True, exist_ok=True)
    for stage in stages:
        (engine_dir / f"{stage}.plan").write_bytes(b"not a real plan")


# -- errors a user meets before any plan runs ---------------------------------------------------


def test_missing_plans_are_named_with_the_build_command(tmp_path: Path) -> None:
    write_plans(tmp_path, ("encoder",))
    with pytest.raises(TensorRTRuntimeError) as raised:
        TensorRTStages(tmp_path)
    message = str(raised.value)
    assert "flow.plan" in message and "vocoder.plan" in message
    assert "encoder.plan" not in message
    assert "voxfleet build-engines --runtime tensorrt" in message


def test_without_tensorrt_the_error_names_the_image_and_the_other_runtimes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_plans(tmp_path)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # `import tensorrt` raises ImportError
    with pytest.raises(TensorRTRuntimeError) as raised:
        TensorRTStages(tmp_path)
    message = str(raised.value)
    assert "NVIDIA's TensorRT Python package" in message and "Triton" in message
    assert '"onnxruntime"' in message and '"torch-cuda"' in message
    with pytest.raises(TensorRTRuntimeError, match="NVIDIA's TensorRT"):
        import_tensorrt()


def test_plans_need_a_cuda_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")
    write_plans(tmp_path)
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))
    with pytest.raises(TensorRTRuntimeError, match="run on a CUDA GPU; device cpu"):
        TensorRTStages(tmp_path, device="cpu")


def test_load_stages_finds_the_runtime_through_the_registry_in_a_fresh_process(
    tmp_path: Path,
) -> None:
    write_plans(tmp_path, ("encoder", "flow"))
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engines.runtimes import load_stages\n"
        "assert 'engines.runtimes.tensorrt.stages' not in sys.modules\n"
        "try:\n"
        "    load_stages('tensorrt', Path(sys.argv[1]))\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, '|', error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[3],
        timeout=120,
    )
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("TensorRTRuntimeError | ")
    assert "vocoder.plan" in lines[0] and "--runtime tensorrt" in lines[0]


def test_load_stages_in_this_process_gives_the_same_clear_error(tmp_path: Path) -> None:
    with pytest.raises(
        TensorRTRuntimeError, match=r"has no encoder\.plan, flow\.plan, vocoder\.plan"
    ):
        load_stages("tensorrt", tmp_path)


def test_a_refused_plan_built_for_another_gpu_names_both(tmp_path: Path) -> None:
    error = plan_mismatch_error(
        "flow", tmp_path / "flow.plan", KEY, "tensorrt-10.3.0", "NVIDIA-H100-80GB-HBM3", "9.0"
    )
    message = str(error)
    assert "flow.plan" in message
    assert "Tesla-T4 (compute capability 7.5)" in message
    assert "NVIDIA-H100-80GB-HBM3 (compute capability 9.0)" in message


def test_a_refused_plan_from_another_tensorrt_version_names_both(tmp_path: Path) -> None:
    message = str(
        plan_mismatch_error(
            "encoder", tmp_path / "encoder.plan", KEY, "tensorrt-10.7.0", "Tesla-T4", "7.5"
        )
    )
    assert "the key is for tensorrt-10.3.0, this image has tensorrt-10.7.0" in message
    assert "Tesla-T4 (compute" not in message  # the GPU matches: only the version is named


@pytest.mark.parametrize("key", [KEY, None], ids=["matching-key", "no-manifest"])
def test_a_refused_plan_without_a_known_mismatch_says_what_to_rebuild(
    tmp_path: Path, key: EngineKey | None
) -> None:
    message = str(
        plan_mismatch_error(
            "vocoder", tmp_path / "vocoder.plan", key, "tensorrt-10.3.0", "Tesla-T4", "7.5"
        )
    )
    assert "vocoder.plan" in message and "damaged" in message
    assert "tensorrt-10.3.0, Tesla-T4, compute capability 7.5" in message
    assert "voxfleet build-engines --runtime tensorrt" in message


def test_the_entry_key_is_read_from_the_manifest(tmp_path: Path) -> None:
    assert read_entry_key(tmp_path) is None
    (tmp_path / "manifest.json").write_text(json.dumps({"key": KEY.fields()}))
    key = read_entry_key(tmp_path)
    assert key == KEY and key is not None and key.precision == "fp16"
    (tmp_path / "manifest.json").write_text(json.dumps({"key": {"runtime": "tensorrt"}}))
    assert read_entry_key(tmp_path) is None


# -- optimisation profiles ---------------------------------------------------------------------


def profiles_of(stage: str, *profiles: dict) -> list[StageProfile]:
    return [StageProfile.from_ranges(index, ranges[stage]) for index, ranges in enumerate(profiles)]


def window_call_shapes(windows: WindowConfig) -> dict[str, list[dict[str, tuple[int, ...]]]]:
    """Every flow and vocoder call shape a stream model with these windows can send."""
    shapes: dict[str, list[dict[str, tuple[int, ...]]]] = {"flow": [], "vocoder": []}
    for size in windows.window_sizes():
        flow = 2 * size + 2 * windows.flow_context_frames
        vocoder = size + 2 * windows.vocoder_context_frames
        for batch in range(1, windows.max_batch_windows + 1):
            shapes["flow"].append({"prior": (batch, 192, flow), "mask": (batch, 1, flow)})
            shapes["vocoder"].append({"latent": (batch, 192, vocoder)})
    return shapes


def encoder_call_shapes(windows: WindowConfig, max_phonemes: int) -> list[dict[str, tuple]]:
    return [
        {"input": (batch, phonemes), "input_lengths": (batch,), "scales": (3,)}
        for batch in range(1, windows.max_encoder_batch + 1)
        for phonemes in (1, *range(32, max_phonemes + 1, 32))
    ]


def test_every_call_of_the_default_windows_fits_the_default_profiles() -> None:
    windows = WindowConfig()
    calls = window_call_shapes(windows)
    assert len(calls["flow"]) == len(windows.window_sizes()) * windows.max_batch_windows
    for stage, stage_calls in calls.items():
        [profile] = profiles_of(stage, PROFILES)
        for shapes in stage_calls:
            assert choose_profile(stage, [profile], shapes) is profile
    [encoder] = profiles_of("encoder", PROFILES)
    for shapes in encoder_call_shapes(windows, MAX_PHONEMES):
        assert choose_profile("encoder", [encoder], shapes) is encoder


def test_default_profiles_are_tuned_for_the_steady_window_and_half_the_batch() -> None:
    windows = WindowConfig()
    steady = windows.window_frames
    assert PROFILES["flow"]["prior"][1] == (
        windows.max_batch_windows // 2,
        192,
        2 * steady + 2 * windows.flow_context_frames,
    )
    assert PROFILES["vocoder"]["latent"][1] == (
        windows.max_batch_windows // 2,
        192,
        steady + 2 * windows.vocoder_context_frames,
    )
    assert ServingShapes() == ServingShapes.from_windows(windows)


def test_other_windows_change_the_profiles() -> None:
    windows = WindowConfig(first_window_frames=8, window_frames=256, max_batch_windows=32)
    profiles = stage_profiles(ServingShapes.from_windows(windows, sentence_flow_frames=0))
    # 8..256-frame windows: vocoder 24..272 frames, flow 64..560 with 24 context frames.
    assert profiles["vocoder"]["latent"] == ((1, 192, 24), (16, 192, 272), (32, 192, 272))
    assert profiles["flow"]["mask"] == ((1, 1, 64), (16, 1, 560), (32, 1, 560))
    with_sentences = stage_profiles(ServingShapes.from_windows(windows))
    assert with_sentences["flow"]["mask"][2] == (32, 1, SENTENCE_FLOW_MAX_FRAMES)
    for stage, stage_calls in window_call_shapes(windows).items():
        [profile] = profiles_of(stage, profiles)
        for shapes in stage_calls:
            choose_profile(stage, [profile], shapes)
    # The default profiles take neither the 8-frame first window nor the 256-frame steady one.
    [vocoder] = profiles_of("vocoder", PROFILES)
    for width in (24, 272):
        with pytest.raises(TensorRTRuntimeError, match="outside"):
            choose_profile("vocoder", [vocoder], {"latent": (1, 192, width)})


class ShapeRecordingRuntime:
    """A numpy stage runtime that records every call's input shapes (zeros out)."""

    name = "shape-recorder"
    frames_per_id = 3

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, tuple[int, ...]]]] = []

    def encode(self, ids, lengths, scales, speaker_ids=None):
        self.calls.append(
            ("encoder", {"input": ids.shape, "input_lengths": lengths.shape, "scales": (3,)})
        )
        frames = np.asarray(lengths) * self.frames_per_id
        mask = (np.arange(frames.max())[None, None, :] < frames[:, None, None]).astype(np.float32)
        return np.zeros((len(frames), 192, mask.shape[-1]), np.float32), mask

    def flow(self, prior, mask, speaker_ids=None):
        self.calls.append(("flow", {"prior": prior.shape, "mask": mask.shape}))
        return np.zeros_like(prior)

    def vocode(self, latent, speaker_ids=None):
        self.calls.append(("vocoder", {"latent": latent.shape}))
        return np.zeros((latent.shape[0], latent.shape[-1] * 256), np.float32)


class Sink(StreamSink):
    def __init__(self) -> None:
        self.error: Exception | None = None
        self.done = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        pass

    def finish(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()


def run_recorded_streams(runtime: ShapeRecordingRuntime) -> None:
    scheduler = StreamScheduler(runtime, 22050)
    # Sentences from a few ids to the longest the profiles take, in several streams at once.
    lengths = (5, 17, 64, 150, 333, MAX_PHONEMES)
    sinks = [Sink() for _ in range(12)]
    scheduler.start()
    try:
        for index, sink in enumerate(sinks):
            sentences = [Sentence("x", [1] * lengths[(index + n) % len(lengths)]) for n in range(3)]
            scheduler.submit(sentences, SynthesisParams(), sink)
        for sink in sinks:
            assert sink.done.wait(60), "a stream never finished"
    finally:
        scheduler.stop()
    assert all(sink.error is None for sink in sinks)


def test_every_call_the_stream_model_sends_fits_the_default_profiles() -> None:
    runtime = ShapeRecordingRuntime()
    run_recorded_streams(runtime)
    profiles = {stage: profiles_of(stage, PROFILES) for stage in ("encoder", "flow", "vocoder")}
    widths = {(stage, shapes[next(iter(shapes))][-1]) for stage, shapes in runtime.calls}
    assert {w for stage, w in widths if stage == "vocoder"} == set(
        vocoder_call_frames(WindowConfig())
    )
    for stage, shapes in runtime.calls:
        choose_profile(stage, profiles[stage], shapes)


class DeviceShapeRecorder(ShapeRecordingRuntime):
    """The tensor API of a GPU runtime on the CPU, so the scheduler uses `DeviceBackend`."""

    def __init__(self) -> None:
        super().__init__()
        import torch

        self.torch = torch
        self.device = torch.device("cpu")
        self.flow_dtype = self.vocoder_dtype = torch.float32

    def stream_backend(self):
        from engines.runtimes.device_frames import DeviceBackend

        return DeviceBackend(self, initial_pages=512)

    def encode_tensor(self, ids, lengths, scales, speaker_ids=None):
        prior, mask = self.encode(ids.numpy(), lengths.numpy(), scales)
        return self.torch.from_numpy(prior), self.torch.from_numpy(mask)

    def flow_tensor(self, prior, mask, speaker_ids=None):
        return self.torch.from_numpy(self.flow(prior.numpy(), mask.numpy()))

    def vocode_tensor(self, latent, speaker_ids=None):
        return self.torch.from_numpy(self.vocode(latent.numpy()))


def test_the_gpu_stream_paths_sentence_flow_fits_the_default_profiles() -> None:
    pytest.importorskip("torch")
    runtime = DeviceShapeRecorder()
    run_recorded_streams(runtime)
    flow_widths = {shapes["prior"][-1] for stage, shapes in runtime.calls if stage == "flow"}
    assert flow_widths - set(flow_call_frames()), "no whole-sentence flow call was made"
    profiles = {stage: profiles_of(stage, PROFILES) for stage in ("encoder", "flow", "vocoder")}
    for stage, shapes in runtime.calls:
        choose_profile(stage, profiles[stage], shapes)
    [windows_only] = profiles_of(
        "flow", stage_profiles(ServingShapes.from_windows(sentence_flow_frames=0))
    )
    with pytest.raises(TensorRTRuntimeError, match="outside"):
        for stage, shapes in runtime.calls:
            if stage == "flow":
                choose_profile(stage, [windows_only], shapes)


def test_windows_of_a_profile_width_are_taken() -> None:
    [flow] = profiles_of("flow", PROFILES)
    shapes = {"prior": (4, 192, 112), "mask": (4, 1, 112)}
    assert choose_profile("flow", [flow], shapes) is flow


def test_a_window_of_another_width_is_refused_naming_shape_and_range() -> None:
    # A 160-frame window with 8 context frames each side: wider than any default window.
    profiles = profiles_of("vocoder", PROFILES)
    with pytest.raises(TensorRTRuntimeError) as raised:
        choose_profile("vocoder", profiles, {"latent": (3, 192, 176)})
    message = str(raised.value)
    assert "vocoder plan" in message
    assert "latent (3, 192, 176) is outside (1, 192, 32) to (128, 192, 144)" in message


def test_too_many_phonemes_are_refused_naming_the_limit() -> None:
    profiles = profiles_of("encoder", PROFILES)
    shapes = {"input": (2, 700), "input_lengths": (2,), "scales": (3,)}
    with pytest.raises(
        TensorRTRuntimeError, match=r"input \(2, 700\) is outside \(1, 1\) to \(32, 640\)"
    ):
        choose_profile("encoder", profiles, shapes)
    assert choose_profile("encoder", profiles, {**shapes, "input": (2, 640)}).index == 0


def test_the_first_profile_that_fits_is_chosen() -> None:
    narrow = stage_profiles(ServingShapes(max_batch=8, opt_batch=8))
    wide = stage_profiles(ServingShapes(max_batch=64, opt_batch=32))
    profiles = profiles_of("vocoder", narrow, wide)
    assert choose_profile("vocoder", profiles, {"latent": (8, 192, 48)}).index == 0
    assert choose_profile("vocoder", profiles, {"latent": (9, 192, 48)}).index == 1
    with pytest.raises(TensorRTRuntimeError, match=r"profile 0: .* / profile 1: "):
        choose_profile("vocoder", profiles, {"latent": (65, 192, 48)})


def test_max_batch_ignores_unbatched_inputs() -> None:
    [encoder] = profiles_of("encoder", PROFILES)
    [flow] = profiles_of("flow", PROFILES)
    assert encoder.max_batch == WindowConfig().max_encoder_batch  # scales (3,) is no batch
    assert flow.max_batch == WindowConfig().max_batch_windows
    assert StageProfile(0, {}).max_batch == sys.maxsize  # a fully static plan: never split


def test_input_range_checks_rank_and_bounds() -> None:
    shape_range = InputRange((1, 192, 48), (64, 192, 48), (256, 192, 48))
    assert shape_range.contains((256, 192, 48))
    assert not shape_range.contains((257, 192, 48))
    assert not shape_range.contains((0, 192, 48))
    assert not shape_range.contains((4, 192))


# -- batch splitting ---------------------------------------------------------------------------


def test_batch_slices_cover_every_row_once() -> None:
    assert batch_slices(600, 256) == [slice(0, 256), slice(256, 512), slice(512, 600)]
    assert batch_slices(256, 256) == [slice(0, 256)]
    with pytest.raises(ValueError, match="at least 1"):
        batch_slices(4, 0)


def test_a_batch_above_the_maximum_runs_in_parts_and_joins_in_order() -> None:
    torch = pytest.importorskip("torch")
    calls: list[tuple[int, tuple[int, ...]]] = []

    def encoder(feeds: dict) -> dict:
        # Frames follow the part's longest sentence, as the real encoder's output does.
        calls.append((feeds["input"].shape[0], tuple(feeds["scales"].shape)))
        lengths = feeds["input_lengths"]
        frames = int(lengths.max()) * 2
        mask = (torch.arange(frames)[None, :] < (lengths[:, None] * 2)).float()[:, None, :]
        prior = feeds["input"][:, :1].float()[:, :, None].expand(-1, 192, frames) * mask
        return {"prior": prior, "mask": mask}

    lengths = torch.tensor([3, 1, 4, 1, 5])
    feeds = {
        "input": torch.arange(5)[:, None].expand(5, 6).contiguous(),
        "input_lengths": lengths,
        "scales": torch.tensor([0.667, 1.0, 0.8]),
    }
    whole = encoder(dict(feeds))
    calls.clear()
    split = run_in_batches(encoder, feeds, max_batch=2)
    assert calls == [(2, (3,)), (2, (3,)), (1, (3,))]
    for name in ("prior", "mask"):
        assert split[name].shape == whole[name].shape
        assert torch.equal(split[name], whole[name])


def test_a_batch_within_the_maximum_is_one_call() -> None:
    torch = pytest.importorskip("torch")
    calls: list[int] = []

    def vocoder(feeds: dict) -> dict:
        calls.append(feeds["latent"].shape[0])
        return {"audio": feeds["latent"].sum(dim=1, keepdim=True)}

    out = run_in_batches(vocoder, {"latent": torch.ones(4, 192, 48)}, max_batch=4)
    assert calls == [4] and out["audio"].shape == (4, 1, 48)


def test_binding_types_map_to_torch_dtypes() -> None:
    torch = pytest.importorskip("torch")
    trt = types.SimpleNamespace(
        DataType=types.SimpleNamespace(FLOAT="f32", HALF="f16", INT32="i32", INT64="i64")
    )
    assert torch_dtype(trt, "f16") is torch.float16
    assert torch_dtype(trt, "i64") is torch.int64
    with pytest.raises(TensorRTRuntimeError, match="no torch dtype"):
        torch_dtype(trt, "fp8")
