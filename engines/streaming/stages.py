"""What the stream scheduler asks of a stage runtime: the encoder, flow and vocoder calls.

Shapes: ``ids`` int64 [B, P]; ``lengths`` int64 [B]; ``scales`` float32 [3] =
(noise_scale, length_scale, noise_w); ``prior``/``latent`` float32 [B, 192, T];
``mask`` float32 [B, 1, T]; audio float32 [B, T * hop]. The runtimes themselves
(onnxruntime, torch-cuda, tensorrt) are found through the registry in engines/contract/plan.py.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class StageRuntime(Protocol):
    name: str

    def encode(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        scales: np.ndarray,
        speaker_ids: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]: ...

    def flow(
        self, prior: np.ndarray, mask: np.ndarray, speaker_ids: np.ndarray | None = None
    ) -> np.ndarray: ...

    def vocode(self, latent: np.ndarray, speaker_ids: np.ndarray | None = None) -> np.ndarray: ...
