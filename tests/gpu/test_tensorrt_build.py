"""The TensorRT build itself: runs only where `tensorrt` imports (NVIDIA images), else skipped.

It has never run in this project's CI or on its machines: TensorRT is not installable there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

trt = pytest.importorskip(
    "tensorrt", reason="TensorRT is only in NVIDIA's TensorRT/Triton images (not on PyPI)"
)

pytestmark = pytest.mark.gpu


def test_fp16_plans_deserialize_with_the_serving_profiles(tmp_path: Path) -> None:
    from engines.build.engine_build import build_engines, resolve_voice_model
    from engines.runtimes.tensorrt.profiles import ServingShapes, stage_profiles

    profiles = stage_profiles(ServingShapes(max_batch=32, opt_batch=8))
    entry = build_engines(resolve_voice_model("joe"), "tensorrt", "fp16", tmp_path, profiles)
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    for stage in ("encoder", "flow", "vocoder"):
        engine = runtime.deserialize_cuda_engine(entry.stage_path(stage).read_bytes())
        assert engine is not None and engine.num_optimization_profiles == 1
    vocoder = runtime.deserialize_cuda_engine(entry.stage_path("vocoder").read_bytes())
    assert tuple(vocoder.get_tensor_profile_shape("latent", 0)[2]) == (32, 192, 48)
    again = build_engines(resolve_voice_model("joe"), "tensorrt", "fp16", tmp_path, profiles)
    assert not again.built
