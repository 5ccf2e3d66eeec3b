"""The tensorrt runtime executing real plans: only where `tensorrt` imports (NVIDIA images).

It has never run in this project: TensorRT is not installable on its machines, so every test
here is skipped there with that reason. Plans are built for the joe voice with a small
profile (batch 1..8; flow windows of 64 frames, vocoder windows of 48).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

trt = pytest.importorskip(
    "tensorrt", reason="TensorRT is only in NVIDIA's TensorRT/Triton images (not on PyPI)"
)
torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

MAX_BATCH = 8


@pytest.fixture(scope="module")
def fp32_entry(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.build.engine_build import build_engines, resolve_voice_model
    from engines.runtimes.tensorrt.profiles import ServingShapes, stage_profiles

    profiles = stage_profiles(ServingShapes(max_batch=MAX_BATCH, opt_batch=4))
    cache = tmp_path_factory.mktemp("tensorrt-cache")
    return build_engines(resolve_voice_model("joe"), "tensorrt", "fp32", cache, profiles).path


@pytest.fixture(scope="module")
def stages(fp32_entry: Path):
    from engines.runtimes import load_stages

    return load_stages("tensorrt", fp32_entry)


@pytest.fixture(scope="module")
def reference(stage_dir: Path):
    from engines.runtimes.onnx import OnnxStages

    return OnnxStages(stage_dir)


def relative_error(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.linalg.norm(actual - expected) / np.linalg.norm(expected))


def test_vocoder_matches_onnxruntime(stages, reference) -> None:
    latent = np.random.default_rng(1).standard_normal((3, 192, 48)).astype(np.float32)
    actual, expected = stages.vocode(latent), reference.vocode(latent)
    assert actual.shape == expected.shape == (3, 48 * 256)
    assert relative_error(actual, expected) < 5e-3  # TF32 may be on in an fp32 plan


def test_encoder_frames_match_onnxruntime_with_noise_off(stages, reference, corpus_ids) -> None:
    sentences = corpus_ids[:3]
    width = max(len(ids) for ids in sentences)
    ids = np.zeros((3, width), dtype=np.int64)
    for row, sentence in enumerate(sentences):
        ids[row, : len(sentence)] = sentence
    lengths = np.array([len(s) for s in sentences], dtype=np.int64)
    scales = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    prior, mask = stages.encode(ids, lengths, scales)
    expected_prior, expected_mask = reference.encode(ids, lengths, scales)
    # Data-dependent output length: the frames must be the same, not just close.
    assert mask.shape == expected_mask.shape
    assert np.array_equal(mask, expected_mask)
    assert relative_error(prior, expected_prior) < 1e-3


def test_a_batch_above_the_profile_is_split_and_rejoined(stages) -> None:
    latent = np.random.default_rng(2).standard_normal((MAX_BATCH * 2 + 3, 192, 48))
    latent = latent.astype(np.float32)
    whole = stages.vocode(latent)
    rows = np.concatenate([stages.vocode(latent[i : i + 1]) for i in range(latent.shape[0])])
    assert whole.shape == (latent.shape[0], 48 * 256)
    assert relative_error(whole, rows) < 5e-3  # kernels may differ by batch size


def test_a_window_outside_the_profile_is_refused(stages) -> None:
    from engines.runtimes.tensorrt.stages import TensorRTRuntimeError

    with pytest.raises(TensorRTRuntimeError, match=r"\(1, 192, 48\) to \(8, 192, 48\)"):
        stages.vocode(np.zeros((2, 192, 32), dtype=np.float32))


def test_the_tensor_api_stays_on_the_device(stages) -> None:
    device = stages.device
    assert device.type == "cuda"
    assert isinstance(stages.flow_dtype, torch.dtype)
    assert isinstance(stages.vocoder_dtype, torch.dtype)
    ids = torch.tensor([[1, 0, 20, 0, 25, 0, 2]], dtype=torch.int64)
    prior, mask = stages.encode_tensor(ids, torch.tensor([7]), torch.tensor([0.0, 1.0, 0.0]))
    assert prior.device == device and mask.device == device
    assert prior.shape[1] == 192 and mask.shape[1] == 1 and prior.shape[2] == mask.shape[2]
    window = torch.zeros(2, 192, 64, dtype=torch.float16, device=device)  # any float dtype
    latent = stages.flow_tensor(window, torch.ones(2, 1, 64, device=device))
    assert latent.device == device and latent.shape == (2, 192, 64)
    audio = stages.vocode_tensor(latent[:, :, :48].double())
    assert audio.device == device and audio.shape == (2, 48 * 256)


def test_a_damaged_plan_is_refused_with_what_to_rebuild(fp32_entry: Path, tmp_path: Path) -> None:
    from engines.runtimes.tensorrt.stages import TensorRTRuntimeError, TensorRTStages

    copy = tmp_path / "entry"
    shutil.copytree(fp32_entry, copy)
    (copy / "flow.plan").write_bytes(b"\0" * 4096)
    with pytest.raises(TensorRTRuntimeError, match=r"flow\.plan") as raised:
        TensorRTStages(copy)
    assert "voxfleet build-engines --runtime tensorrt" in str(raised.value)
