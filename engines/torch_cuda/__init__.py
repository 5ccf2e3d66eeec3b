"""The torch-cuda stage runtime: encoder, flow and vocoder on a CUDA GPU with PyTorch.

Importing this package registers `RUNTIMES["torch-cuda"]`; PyTorch itself is imported only
when a runtime is created, so the package imports where torch is absent.
"""

from __future__ import annotations

from pathlib import Path

from engines.runtime import RUNTIMES, StageRuntime


def _factory(engine_dir: Path) -> StageRuntime:
    import os

    from engines.torch_cuda.runtime import (
        DEFAULT_BATCH_BUCKETS,
        ENCODER_BATCH_BUCKETS,
        TorchCudaStages,
    )

    # Graphs are memory: capture no bucket larger than the scheduler ever sends.
    max_windows = int(os.environ.get("VOXFLEET_TORCH_MAX_WINDOWS", "256"))
    max_sentences = int(os.environ.get("VOXFLEET_TORCH_MAX_SENTENCES", "64"))
    stages = TorchCudaStages(
        engine_dir,
        batch_buckets=[b for b in DEFAULT_BATCH_BUCKETS if b < 2 * max_windows],
        encoder_batch_buckets=[b for b in ENCODER_BATCH_BUCKETS if b < 2 * max_sentences],
    )
    return stages


RUNTIMES["torch-cuda"] = _factory
