"""Stage runtimes: who executes the encoder, flow and vocoder graphs.

The stream model only talks to a `StageRuntime` (engines/streaming/stages.py). Each runtime is
a module or package here (`onnx`, `torch_cuda`, `tensorrt`; `device_frames` holds the frame
stores the GPU runtimes share); `load_stages` finds a runtime's loader through the runtime
registry (engines/contract/plan.py), so importing this package imports no runtime library.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from engines.contract.plan import WindowConfig, runtime_info
from engines.streaming.stages import StageRuntime

__all__ = ["StageRuntime", "load_stages"]


def load_stages(
    runtime: str,
    engine_dir: Path,
    windows: WindowConfig | None = None,
    cpu_threads: int | None = None,
) -> StageRuntime:
    """The stages of the engine entry `engine_dir` on `runtime`, sized for `windows`;
    `cpu_threads`: threads per call where the runtime runs on the CPU."""
    info = runtime_info(runtime)
    module, _, attribute = info.loader.partition(":")
    factory: Callable[..., StageRuntime] = getattr(importlib.import_module(module), attribute)
    return factory(Path(engine_dir), windows or WindowConfig(), cpu_threads=cpu_threads)
