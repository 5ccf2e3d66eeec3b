"""What one streaming step costs here: the split stages timed at the stream model's windows.

The stream model runs the flow and the vocoder on windows of latent frames (with context on
both sides), batched across streams. Timing those calls at batch 1, 4 and 8 tells whether
batching buys throughput on this machine, and how long one scheduler step takes when it holds
N windows — which is what a stream waits for between two chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

LATENT_CHANNELS = 192


@dataclass(frozen=True)
class StageCost:
    stage: str
    batch: int
    frames: int  # per item, context included
    audio_frames: int  # per item, the frames it delivers (context excluded)
    ms: float  # best of the repeats: the cost without other work in the way
    ms_per_audio_second: float


def time_call(call: Callable[[], object], repeats: int = 3) -> float:
    call()  # first call allocates
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best * 1000.0


def measure_stage_costs(
    runtime: Any,
    windows: Any,
    hop: int,
    sample_rate: int,
    batches: Sequence[int] = (1, 4, 8),
) -> list[StageCost]:
    """Vocoder (first and steady windows) and flow (one chunk) at each batch size."""
    rng = np.random.default_rng(0)
    shapes = [
        ("vocoder, first window", windows.first_window_frames, windows.vocoder_context_frames),
        ("vocoder, window", windows.window_frames, windows.vocoder_context_frames),
        ("flow, chunk", windows.window_frames, windows.flow_context_frames),
    ]
    costs = []
    for stage, frames, context in shapes:
        total = frames + 2 * context
        for batch in batches:
            latent = rng.standard_normal((batch, LATENT_CHANNELS, total)).astype(np.float32)
            mask = np.ones((batch, 1, total), dtype=np.float32)

            def call(
                latent: np.ndarray = latent,
                mask: np.ndarray = mask,
                vocoder: bool = stage.startswith("vocoder"),
            ) -> object:
                return runtime.vocode(latent) if vocoder else runtime.flow(latent, mask)

            ms = time_call(call)
            audio_s = batch * frames * hop / sample_rate
            costs.append(StageCost(stage, batch, total, frames, ms, ms / audio_s))
    return costs


def measure_voice_stage_costs(voice: str = "joe") -> list[dict[str, Any]]:
    """Stage costs of a voice's onnxruntime engines (built into the engine cache if needed)."""
    from engines.commands.local_serving import plan_local_voices
    from engines.runtimes import load_stages

    plan = plan_local_voices([voice])[0]
    runtime = load_stages(plan.runtime, Path(plan.engine_dir))
    import json

    config = json.loads(Path(plan.voice_config_path).read_text("utf-8"))
    sample_rate = int(config["audio"]["sample_rate"])
    hop = int(config.get("hop_length", 256))
    windows = plan.windows
    return [asdict(cost) for cost in measure_stage_costs(runtime, windows, hop, sample_rate)]
