"""The torch-cuda stage runtime: encoder, flow and vocoder on a CUDA GPU with PyTorch.

Importing this package registers `RUNTIMES["torch-cuda"]`; PyTorch itself is imported only
when a runtime is created, so the package imports where torch is absent.
"""

from __future__ import annotations

from pathlib import Path

from engines.runtime import RUNTIMES, StageRuntime


def _factory(engine_dir: Path) -> StageRuntime:
    import os

    from engines.torch_cuda.runtime import TorchCudaStages

    stages = TorchCudaStages(engine_dir)
    if os.environ.get("VOXFLEET_TORCH_WARMUP") == "1":
        # Capture the stream model's usual shapes before the model reports ready.
        stages.warmup(
            flow_frames=(96, 320), vocoder_frames=(32, 144), encoder_phonemes=range(32, 513, 32)
        )
    return stages


RUNTIMES["torch-cuda"] = _factory
