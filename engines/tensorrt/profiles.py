"""Optimisation profiles for the three stages, derived from the voice's serving shapes.

TensorRT builds a plan for ranges of input shapes; a shape outside the range is refused at
run time, and a wide range costs speed, so each range follows what the stream model really
sends: the encoder sees a few sentences of up to `max_phonemes` ids; the flow and the vocoder
see batches of fixed-size windows (window frames plus context on both sides) from all live
streams, so only their batch dimension varies.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engines.engine_cache import ShapeRange

LATENT_CHANNELS = 192  # inter_channels of every Piper VITS voice


@dataclass(frozen=True)
class ServingShapes:
    """The shapes the stream model sends each stage (defaults: the stream model's)."""

    max_batch: int = 256  # windows of all live streams in one flow/vocoder call
    opt_batch: int = 64
    flow_window_frames: int = 32
    flow_context_frames: int = 16
    vocoder_window_frames: int = 32
    vocoder_context_frames: int = 8
    encoder_max_batch: int = 16  # sentences encoded together
    encoder_opt_batch: int = 4
    max_phonemes: int = 512
    opt_phonemes: int = 128
    latent_channels: int = LATENT_CHANNELS

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if int(value) < (0 if name.endswith("context_frames") else 1):
                raise ValueError(f"serving shape {name} must be positive, got {value}")
        if self.opt_batch > self.max_batch or self.encoder_opt_batch > self.encoder_max_batch:
            raise ValueError("the optimum batch cannot exceed the maximum batch")
        if self.opt_phonemes > self.max_phonemes:
            raise ValueError(
                f"opt_phonemes ({self.opt_phonemes}) cannot exceed max_phonemes "
                f"({self.max_phonemes})"
            )

    @property
    def flow_frames(self) -> int:
        return self.flow_window_frames + 2 * self.flow_context_frames

    @property
    def vocoder_frames(self) -> int:
        return self.vocoder_window_frames + 2 * self.vocoder_context_frames


def _batched(batch: tuple[int, int, int], rest: tuple[int, ...]) -> ShapeRange:
    low, opt, high = batch
    return ((low, *rest), (opt, *rest), (high, *rest))


def stage_profiles(shapes: ServingShapes | None = None) -> dict[str, dict[str, ShapeRange]]:
    """stage -> input name -> (min, opt, max), the form `EngineKey.profiles` takes."""
    shapes = shapes or ServingShapes()
    window_batch = (1, shapes.opt_batch, shapes.max_batch)
    channels = shapes.latent_channels
    return {
        "encoder": {
            "input": (
                (1, 1),
                (shapes.encoder_opt_batch, shapes.opt_phonemes),
                (shapes.encoder_max_batch, shapes.max_phonemes),
            ),
            "input_lengths": ((1,), (shapes.encoder_opt_batch,), (shapes.encoder_max_batch,)),
            "scales": ((3,), (3,), (3,)),
        },
        "flow": {
            "prior": _batched(window_batch, (channels, shapes.flow_frames)),
            "mask": _batched(window_batch, (1, shapes.flow_frames)),
        },
        "vocoder": {
            "latent": _batched(window_batch, (channels, shapes.vocoder_frames)),
        },
    }
