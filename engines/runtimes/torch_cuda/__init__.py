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
# Grouped calls over several voices (engines/runtimes/torch_cuda/weights.py, lanes): off by
# default (docs/gpu.md, "One call for several voices"); these turn them on for measuring.
VOICE_LANES_ENV = "VOXFLEET_VOICE_LANES"
GROUPED_STAGES_ENV = "VOXFLEET_GROUPED_STAGES"
# The fewest rows a graph of an autotuned stage is captured with cuDNN's autotuning at
# (stages.AUTOTUNE_MIN_ROWS; 1: every graph), for measuring.
AUTOTUNE_MIN_ROWS_ENV = "VOXFLEET_AUTOTUNE_MIN_ROWS"
# The CUDA streams the vocoder's calls are spread over (stages.VOCODER_STREAMS; 1: the
# windows' own alone).
VOCODER_STREAMS_ENV = "VOXFLEET_VOCODER_STREAMS"
# The CUDA streams a step's queued encoder calls are spread over (stages.ENCODER_STREAMS; 1:
# the windows' own alone).
ENCODER_STREAMS_ENV = "VOXFLEET_ENCODER_STREAMS"


def _settings_from_environment() -> dict:
    """`voice_lanes`, `grouped_stages`, `autotune_min_rows`, `vocoder_streams` and
    `encoder_streams` from the environment, where set; a clear error naming the variable
    where a value is not one."""
    import os

    from engines.runtimes.torch_cuda.stages import (
        GROUPABLE_STAGES,
        GROUPED_STAGES,
        TorchCudaError,
    )

    settings: dict = {}
    for variable, name in (
        (VOICE_LANES_ENV, "voice_lanes"),
        (AUTOTUNE_MIN_ROWS_ENV, "autotune_min_rows"),
        (VOCODER_STREAMS_ENV, "vocoder_streams"),
        (ENCODER_STREAMS_ENV, "encoder_streams"),
    ):
        value = os.environ.get(variable, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise TorchCudaError(f"{variable} is a whole number from 1, not {value!r}")
            settings[name] = int(value)
    stages = os.environ.get(GROUPED_STAGES_ENV, "").strip()
    if stages:
        names = tuple(name.strip() for name in stages.split(",") if name.strip())
        unknown = [name for name in names if name not in GROUPABLE_STAGES]
        if unknown:
            raise TorchCudaError(
                f"{GROUPED_STAGES_ENV} names {' or '.join(GROUPABLE_STAGES)}, "
                f"not {', '.join(unknown)}"
            )
        settings["grouped_stages"] = names
    else:
        settings["grouped_stages"] = GROUPED_STAGES
    return settings


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
        encoder_precision=windows.encoder_precision,
        **_settings_from_environment(),
    )
    return stages
