"""Stage ONNX graphs -> serialized TensorRT plans, inside the engine-build Job.

Runs only where the `tensorrt` Python package imports (NVIDIA's TensorRT and Triton
images). It has NOT been run in this project: TensorRT cannot be installed on the machines
this project is developed and tested on (PyPI has only stubs that download it from
elsewhere), and the borrowed GPU machine has PyTorch but no TensorRT. The code follows the
TensorRT 10 Python API; `check_target` and the profile logic are tested everywhere, the build
itself only where TensorRT imports (tests/gpu/test_tensorrt_build.py, skipped elsewhere).

Precision per stage: the encoder stays FP32 whatever the entry's precision (its durations are
rounded up to whole frames, so reduced precision would move frame boundaries and change the
audio's length); the flow and the vocoder get FP16, or INT8 (with FP16 fallback) calibrated
on the shipped corpus.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engines.artifacts.engine_cache import EngineCacheError, EngineKey
from engines.artifacts.target import Target, nvidia_smi_gpu

WORKSPACE_BYTES = 4 << 30
CALIBRATION_BATCHES = 16


class TensorRTBuildError(EngineCacheError):
    """The plans cannot be built here: wrong GPU or TensorRT version, or a parser failure."""


def check_target(
    key: EngineKey, runtime_version: str, gpu_product: str, compute_capability: str
) -> None:
    """Refuse to build an entry whose key names another TensorRT version or GPU."""
    problems = []
    if key.runtime_version != runtime_version:
        problems.append(f"the key is for {key.runtime_version}, this image has {runtime_version}")
    if key.gpu_product != gpu_product or key.compute_capability != compute_capability:
        problems.append(
            f"the key is for {key.gpu_product} (compute capability {key.compute_capability}), "
            f"this node has {gpu_product} (compute capability {compute_capability})"
        )
    if problems:
        raise TensorRTBuildError(
            "TensorRT plans only run on the GPU type and TensorRT version they were built with: "
            + "; ".join(problems)
            + ". Run the engine-build Job on a node of the voice's pool, with its Triton image."
        )


def stage_precision(stage: str, precision: str) -> str:
    return "fp32" if stage == "encoder" else precision


def build_entry(
    model_path: Path,
    out_dir: Path,
    key: EngineKey,
    target: Target,
    calibration_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, str]:
    """TensorRT's build (the runtime registry's builder): split the voice, then build plans.

    INT8 is calibrated on `calibration_ids`, or on the shipped corpus through this voice.
    """
    from engines.artifacts.split import split_voice

    onnx_dir = out_dir / "onnx"
    stage_onnx = split_voice(model_path, onnx_dir)
    ids = calibration_ids
    if key.precision == "int8" and not ids:
        ids = corpus_ids(model_path.with_name(model_path.name + ".json"))
    files = build_plans(stage_onnx, out_dir, key, calibration_ids=ids, target=target)
    shutil.rmtree(onnx_dir)
    return files


def build_plans(
    stage_onnx: Mapping[str, Path],
    out_dir: Path,
    key: EngineKey,
    calibration_ids: Sequence[Sequence[int]] | None = None,
    target: Any = None,
) -> dict[str, str]:
    """Write ``<stage>.plan`` for every stage into `out_dir`; returns file name -> stage."""
    import tensorrt as trt

    gpu = nvidia_smi_gpu()
    if gpu is None:
        raise TensorRTBuildError("nvidia-smi found no GPU: TensorRT plans are built on the GPU")
    check_target(key, f"tensorrt-{trt.__version__}", gpu[0], gpu[1])
    logger = trt.Logger(trt.Logger.WARNING)
    samples = None
    if key.precision == "int8":
        samples = calibration_samples(stage_onnx, key, calibration_ids)
    files: dict[str, str] = {}
    for stage, onnx_path in stage_onnx.items():
        builder = trt.Builder(logger)
        network = builder.create_network(0)
        parser = trt.OnnxParser(network, logger)
        if not parser.parse_from_file(str(onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise TensorRTBuildError(f"TensorRT could not parse the {stage} graph: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
        profile = builder.create_optimization_profile()
        for name, (low, opt, high) in key.profiles.get(stage, {}).items():
            profile.set_shape(name, tuple(low), tuple(opt), tuple(high))
        config.add_optimization_profile(profile)
        precision = stage_precision(stage, key.precision)
        if precision == "fp32":
            # TensorRT allows TF32 by default; the encoder's durations are rounded up to whole
            # frames, so TF32's 1e-3 error could move frame boundaries (as on torch-cuda).
            config.clear_flag(trt.BuilderFlag.TF32)
        if precision in ("fp16", "int8"):
            config.set_flag(trt.BuilderFlag.FP16)
        if precision == "int8":
            assert samples is not None
            config.set_flag(trt.BuilderFlag.INT8)
            config.int8_calibrator = _calibrator(trt, samples[stage], out_dir / f"{stage}.calib")
            config.set_calibration_profile(profile)
        plan = builder.build_serialized_network(network, config)
        if plan is None:
            raise TensorRTBuildError(f"TensorRT failed to build the {stage} plan (see its log)")
        name = f"{stage}.plan"
        (out_dir / name).write_bytes(bytes(plan))
        files[name] = stage
    return files


def calibration_samples(
    stage_onnx: Mapping[str, Path],
    key: EngineKey,
    calibration_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, list[dict[str, np.ndarray]]]:
    """Real flow and vocoder inputs: corpus sentences through the FP32 graphs (onnxruntime)."""
    import onnxruntime as ort

    if not calibration_ids:
        raise TensorRTBuildError(
            "INT8 calibration needs phoneme ids (the corpus through the voice)"
        )
    sessions = {
        stage: ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        for stage, path in stage_onnx.items()
    }
    flow_frames = key.profiles["flow"]["prior"][1][2]
    vocoder_frames = key.profiles["vocoder"]["latent"][1][2]
    flow_windows: list[tuple[np.ndarray, np.ndarray]] = []
    vocoder_windows: list[np.ndarray] = []
    scales = np.array([0.667, 1.0, 0.8], dtype=np.float32)
    for ids in calibration_ids[: CALIBRATION_BATCHES * 4]:
        prior, mask = sessions["encoder"].run(
            None,
            {
                "input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64),
                "scales": scales,
            },
        )
        latent = sessions["flow"].run(None, {"prior": prior, "mask": mask})[0]
        flow_windows += [
            (w, m)
            for w, m in zip(_windows(prior, flow_frames), _windows(mask, flow_frames), strict=True)
        ]
        vocoder_windows += list(_windows(latent, vocoder_frames))
    batch = 8
    return {
        "flow": [
            {
                "prior": np.concatenate([w for w, _ in flow_windows[i : i + batch]]),
                "mask": np.concatenate([m for _, m in flow_windows[i : i + batch]]),
            }
            for i in range(0, len(flow_windows) - batch + 1, batch)
        ][:CALIBRATION_BATCHES],
        "vocoder": [
            {"latent": np.concatenate(vocoder_windows[i : i + batch])}
            for i in range(0, len(vocoder_windows) - batch + 1, batch)
        ][:CALIBRATION_BATCHES],
        "encoder": [],
    }


def _windows(values: np.ndarray, frames: int) -> Iterator[np.ndarray]:
    total = values.shape[-1]
    for start in range(0, max(1, total - frames + 1), frames):
        window = values[..., start : start + frames]
        if window.shape[-1] < frames:
            window = np.pad(window, [(0, 0)] * (window.ndim - 1) + [(0, frames - window.shape[-1])])
        yield np.ascontiguousarray(window, dtype=np.float32)


def corpus_ids(voice_config_path: Path) -> list[list[int]]:
    """Phoneme ids of the shipped benchmark corpus for this voice (needs the phonemiser)."""
    import json

    from engines.text.corpus import load_corpus
    from engines.text.frontend import text_to_sentences
    from engines.text.voice import VoiceConfig

    config = VoiceConfig.from_dict(
        json.loads(voice_config_path.read_text()), str(voice_config_path)
    )
    return [s.ids for text in load_corpus() for s in text_to_sentences(text, config)]


def _calibrator(trt: Any, batches: list[dict[str, np.ndarray]], cache_path: Path) -> Any:
    """An entropy calibrator feeding `batches` through device buffers (torch or cuda-python)."""
    try:
        import torch

        def to_device(array: np.ndarray) -> Any:
            return torch.from_numpy(array).cuda()

        def pointer(buffer: Any) -> int:
            return int(buffer.data_ptr())
    except ImportError as error:  # pragma: no cover - depends on the image
        raise TensorRTBuildError(
            "INT8 calibration needs PyTorch with CUDA in the build image for device buffers"
        ) from error

    class CorpusCalibrator(trt.IInt8EntropyCalibrator2):
        def __init__(self) -> None:
            super().__init__()
            self.batches = iter(batches)
            self.held: dict[str, Any] = {}

        def get_batch_size(self) -> int:
            return int(next(iter(batches[0].values())).shape[0]) if batches else 1

        def get_batch(self, names: list[str]) -> list[int] | None:
            try:
                batch = next(self.batches)
            except StopIteration:
                return None
            self.held = {name: to_device(batch[name]) for name in names}
            return [pointer(self.held[name]) for name in names]

        def read_calibration_cache(self) -> bytes | None:
            return cache_path.read_bytes() if cache_path.is_file() else None

        def write_calibration_cache(self, cache: bytes) -> None:
            cache_path.write_bytes(bytes(cache))

    return CorpusCalibrator()
