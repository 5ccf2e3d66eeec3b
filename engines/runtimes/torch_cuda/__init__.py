"""The torch-cuda stage runtime: encoder, flow and vocoder on a CUDA GPU with PyTorch.

`load` is the runtime registry's loader (engines/contract/plan.py); PyTorch itself is imported only
when a runtime is created, so the package imports where torch is absent.
"""

from __future__ import annotations

from pathlib import Path

from engines.contract.plan import WindowConfig
from engines.streaming.stages import StageRuntime

# The most windows one flow or vocoder graph takes. The graphs' memory pool holds the largest
# graph's working set: at 128 windows of 144 frames the vocoder's took the pool to 2.9 GiB of
# a 4.4 GiB pod on the H200. Its calls there cost about the same per window from 32 windows
# up (3.6 ms for 32, 13.1 ms for 128; `python -m lab.gpu_memory`, docs/gpu.md), so
# two replays of 64 should cost what one of 128 did; not measured yet.
MAX_GRAPH_WINDOWS = 64


def load(engine_dir: Path, windows: WindowConfig, cpu_threads: int | None = None) -> StageRuntime:
    from engines.runtimes.torch_cuda.stages import (
        DEFAULT_BATCH_BUCKETS,
        ENCODER_BATCH_BUCKETS,
        TorchCudaStages,
    )

    # Graphs are memory: capture no bucket larger than the scheduler ever sends, and none of
    # more than MAX_GRAPH_WINDOWS windows: a larger call replays that graph twice or more.
    max_windows, max_sentences = windows.max_batch_windows, windows.max_encoder_batch
    buckets = [b for b in DEFAULT_BATCH_BUCKETS if b < 2 * max_windows and b <= MAX_GRAPH_WINDOWS]
    stages = TorchCudaStages(
        engine_dir,
        batch_buckets=buckets,
        encoder_batch_buckets=[b for b in ENCODER_BATCH_BUCKETS if b < 2 * max_sentences],
        encoder_launch=windows.encoder_launch,
    )
    return stages
