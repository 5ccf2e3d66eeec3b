"""The scheduler's cost model: how long each stage's call takes, learnt from the calls it runs."""

from __future__ import annotations

import numpy as np


class CostModel:
    """Each stage's call time as ``per_call + per_frame * frames`` (frames = rows x width:
    phoneme ids for the encoder), fitted by exponentially weighted least squares to the calls
    it has seen.

    The fixed part matters on a GPU, where one call of 128 windows costs little more than a
    call of one: a per-frame figure alone, measured on small calls, would forbid the big
    batches that make the GPU fast. With ``fixed_part=False`` (CPU backends) the model is
    proportional to frames, as the CPU data plane was tuned and measured with.
    """

    DECAY = 0.97  # weight of a call seen 100 calls ago: about 5 %

    def __init__(
        self, fixed_part: bool = True, stages: tuple[str, ...] = ("encoder", "flow", "vocoder")
    ) -> None:
        self.fixed_part = fixed_part  # False: proportional to frames only (CPU backends)
        # Conservative starting points (a 2-core CPU); replaced as calls are seen.
        seeds = {"encoder": 3e-4, "flow": 2e-4, "vocoder": 8e-4}
        self.per_frame = {stage: seeds.get(stage, 0.0) for stage in stages}
        self.per_call = dict.fromkeys(self.per_frame, 0.0)
        # Per stage: weighted n, sum x, sum x^2, sum y, sum x*y (x frames, y seconds).
        self._sums = {stage: np.zeros(5) for stage in self.per_frame}
        # Per stage: calls, seconds, rows, frames (rows x width) seen so far.
        self.totals = {stage: [0, 0.0, 0, 0] for stage in self.per_frame}

    def observe(self, stage: str, seconds: float, rows: int, width: int) -> None:
        frames = float(max(1, rows * width))
        total = self.totals[stage]
        total[0] += 1
        total[1] += seconds
        total[2] += rows
        total[3] += int(frames)
        sums = self._sums[stage]
        sums *= self.DECAY
        sums += (1.0, frames, frames * frames, seconds, frames * seconds)
        n, sx, sxx, sy, sxy = sums
        spread = n * sxx - sx * sx
        per_call, per_frame = 0.0, sy / sx
        if self.fixed_part and spread > 1e-6 * n * sxx:  # calls of different sizes seen
            slope = (n * sxy - sx * sy) / spread
            intercept = (sy - slope * sx) / n
            if slope > 0 and intercept >= 0:
                per_call, per_frame = intercept, slope
        self.per_call[stage], self.per_frame[stage] = per_call, per_frame

    def estimate(self, stage: str, frames: int, new_call: bool = True) -> float:
        """Seconds `frames` more frames add to a step: with the call's fixed part when they
        need a call of their own, without it when they join a call already planned."""
        return self.per_frame[stage] * frames + (self.per_call[stage] if new_call else 0.0)
