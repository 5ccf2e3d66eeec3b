"""The torch-cuda stage runtime: encoder, flow and vocoder on a CUDA GPU with PyTorch.

Importing this package registers `RUNTIMES["torch-cuda"]`; PyTorch itself is imported only
when a runtime is created, so the package imports where torch is absent.
"""

from __future__ import annotations

from pathlib import Path

from engines.runtime import RUNTIMES, StageRuntime


def _factory(engine_dir: Path) -> StageRuntime:
    from engines.torch_cuda.runtime import TorchCudaStages

    return TorchCudaStages(engine_dir)


RUNTIMES["torch-cuda"] = _factory
