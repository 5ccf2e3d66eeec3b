"""The tensorrt runtime's logic that needs no TensorRT: profile checks, batch splitting, errors.

Executing plans is tested only where TensorRT imports (tests/gpu/test_tensorrt_runtime_gpu.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

from engines.engine_cache import EngineKey
from engines.runtime import RUNTIMES, load_stages
from engines.tensorrt.profiles import ServingShapes, stage_profiles
from engines.tensorrt.runtime import (
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

PROFILES = stage_profiles()  # flow windows of 64 frames, vocoder 48, batch 1..256
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


def test_load_stages_registers_the_runtime_in_a_fresh_process(tmp_path: Path) -> None:
    write_plans(tmp_path, ("encoder", "flow"))
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from engines.runtime import RUNTIMES, load_stages\n"
        "assert 'tensorrt' not in RUNTIMES\n"
        "try:\n"
        "    load_stages('tensorrt', Path(sys.argv[1]))\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, '|', error)\n"
        "print('registered' if 'tensorrt' in RUNTIMES else 'absent')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    lines = result.stdout.strip().splitlines()
    assert lines[-1] == "registered"
    assert lines[0].startswith("TensorRTRuntimeError | ")
    assert "vocoder.plan" in lines[0] and "--runtime tensorrt" in lines[0]
    assert RUNTIMES["tensorrt"] is TensorRTStages


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


def test_windows_of_the_profile_width_are_taken() -> None:
    [flow] = profiles_of("flow", PROFILES)
    shapes = {"prior": (4, 192, 64), "mask": (4, 1, 64)}
    assert choose_profile("flow", [flow], shapes) is flow


def test_a_window_of_another_width_is_refused_naming_shape_and_range() -> None:
    # 16-frame windows with 8 context frames each side: what the stream model sends first.
    profiles = profiles_of("vocoder", PROFILES)
    with pytest.raises(TensorRTRuntimeError) as raised:
        choose_profile("vocoder", profiles, {"latent": (3, 192, 32)})
    message = str(raised.value)
    assert "vocoder plan" in message
    assert "latent (3, 192, 32) is outside (1, 192, 48) to (256, 192, 48)" in message


def test_too_many_phonemes_are_refused_naming_the_limit() -> None:
    profiles = profiles_of("encoder", PROFILES)
    shapes = {"input": (2, 600), "input_lengths": (2,), "scales": (3,)}
    with pytest.raises(
        TensorRTRuntimeError, match=r"input \(2, 600\) is outside \(1, 1\) to \(16, 512\)"
    ):
        choose_profile("encoder", profiles, shapes)
    assert choose_profile("encoder", profiles, {**shapes, "input": (2, 512)}).index == 0


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
    assert encoder.max_batch == 16  # scales (3,) is no batch
    assert flow.max_batch == 256
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
