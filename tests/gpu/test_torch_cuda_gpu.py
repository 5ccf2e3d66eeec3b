"""The torch-cuda runtime on a real GPU (marked `gpu`; skipped where CUDA is absent).

Run on the GPU machine: ``pytest -q -m gpu tests/gpu -s`` (prints the measured SNR).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.fixture(scope="module")
def entry_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.engine_build import build_engines, resolve_voice_model

    cache = tmp_path_factory.mktemp("engine-cache")
    return build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", cache).path


def test_fp16_audio_is_within_30_db_of_fp32_on_the_corpus(
    entry_dir: Path, corpus_ids: list[list[int]]
) -> None:
    from engines.bench.gpu_bench import fp16_quality

    quality = fp16_quality(entry_dir, corpus_ids, sentences=40)
    print(f"\nFP16 vs FP32 on {quality['sentences']} corpus sentences: {quality}")
    assert quality["snr_db_all"] >= 30.0
    assert quality["snr_db_min"] >= 30.0


def test_fp32_on_the_gpu_matches_onnxruntime(entry_dir: Path) -> None:
    import onnxruntime as ort

    from engines.torch_cuda.runtime import TorchCudaStages

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
    from engines.torch_cuda.runtime import TorchCudaStages

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
    from engines.bench.gpu_bench import simulate_streams
    from engines.torch_cuda.runtime import TorchCudaStages

    stages = TorchCudaStages(entry_dir, precision="fp16")
    result = simulate_streams(stages, corpus_ids, streams=16, seconds=4.0, ramp_seconds=0.5)
    assert result["completed_streams"] > 0
    assert result["audio_seconds_per_second"] > 16  # faster than real time for 16 listeners
