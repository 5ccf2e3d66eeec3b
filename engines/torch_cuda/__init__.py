"""The torch-cuda stage runtime: encoder, flow and vocoder on a CUDA GPU with PyTorch.

`load` is the runtime registry's loader (engines/plan.py); PyTorch itself is imported only
when a runtime is created, so the package imports where torch is absent.
"""

from __future__ import annotations

from pathlib import Path

from engines.plan import WindowConfig
from engines.stages import StageRuntime


def load(engine_dir: Path, windows: WindowConfig, cpu_threads: int | None = None) -> StageRuntime:
    from engines.torch_cuda.runtime import (
        DEFAULT_BATCH_BUCKETS,
        ENCODER_BATCH_BUCKETS,
        TorchCudaStages,
    )

    # Graphs are memory: capture no bucket larger than the scheduler ever sends.
    max_windows, max_sentences = windows.max_batch_windows, windows.max_encoder_batch
    stages = TorchCudaStages(
        engine_dir,
        batch_buckets=[b for b in DEFAULT_BATCH_BUCKETS if b < 2 * max_windows],
        encoder_batch_buckets=[b for b in ENCODER_BATCH_BUCKETS if b < 2 * max_sentences],
        encoder_launch=windows.encoder_launch,
    )
    return stages
