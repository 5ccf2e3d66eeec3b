"""The torch-cuda stage runtime: encoder, flow and vocoder on a CUDA GPU with PyTorch.

`load` is the runtime registry's loader (engines/plan.py); PyTorch itself is imported only
when a runtime is created, so the package imports where torch is absent.
"""

from __future__ import annotations

import os
from pathlib import Path

from engines.plan import WindowConfig, check_encoder_launch
from engines.stages import StageRuntime

# The plan's encoder_launch "beside": the encoder gets a CUDA stream and a graph memory pool
# of its own, so that `TorchCudaStages.encode_launch` can run it beside the windows;
# "queued": `encode_launch` queues it on the windows' own stream, in order with them, so
# that only the wait for its frame counts is gone; "inline": in the step.
# VOXFLEET_ENCODER_BESIDE=0, 1 or queued overrides the plan (A/B runs of one server plan).
BESIDE_ENV = "VOXFLEET_ENCODER_BESIDE"
_BESIDE_VALUES = {"0": "inline", "1": "beside", "queued": "queued"}


def encoder_launch_mode(planned: str) -> str:
    """How encoder calls run: `planned` (the plan's `WindowConfig.encoder_launch`), unless
    VOXFLEET_ENCODER_BESIDE is set; ValueError for a value that is neither."""
    value = os.environ.get(BESIDE_ENV)
    if value is None:
        check_encoder_launch(planned)
        return planned
    if value not in _BESIDE_VALUES:
        raise ValueError(f"{BESIDE_ENV} is 0, 1 or queued, not {value!r}")
    return _BESIDE_VALUES[value]


def load(engine_dir: Path, windows: WindowConfig) -> StageRuntime:
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
