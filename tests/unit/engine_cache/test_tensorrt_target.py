"""The TensorRT builder's refusal to build for another GPU or TensorRT version (runs anywhere)."""

from __future__ import annotations

import pytest

from engines.artifacts.engine_cache import EngineKey
from engines.runtimes.tensorrt.build import TensorRTBuildError, check_target, stage_precision
from engines.runtimes.tensorrt.profiles import stage_profiles

KEY = EngineKey(
    model_sha256="ab" * 32,
    runtime="tensorrt",
    precision="int8",
    runtime_version="tensorrt-10.3.0",
    gpu_product="Tesla-T4",
    compute_capability="7.5",
    profiles=stage_profiles(),
)


def test_matching_node_is_accepted() -> None:
    check_target(KEY, "tensorrt-10.3.0", "Tesla-T4", "7.5")


@pytest.mark.parametrize(
    "version, gpu, capability, message",
    [
        ("tensorrt-10.4.0", "Tesla-T4", "7.5", "this image has tensorrt-10.4.0"),
        ("tensorrt-10.3.0", "NVIDIA-A10G", "8.6", "this node has NVIDIA-A10G"),
    ],
)
def test_other_gpu_or_version_is_refused_naming_both(
    version: str, gpu: str, capability: str, message: str
) -> None:
    with pytest.raises(TensorRTBuildError, match=message) as raised:
        check_target(KEY, version, gpu, capability)
    assert "tensorrt-10.3.0" in str(raised.value) or "Tesla-T4" in str(raised.value)


def test_encoder_keeps_fp32_under_reduced_precision() -> None:
    assert stage_precision("encoder", "int8") == "fp32"
    assert stage_precision("vocoder", "int8") == "int8"
    assert stage_precision("flow", "fp16") == "fp16"
