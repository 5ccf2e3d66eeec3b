"""Optimisation profiles for the three stages, derived from the stream model's windows.

TensorRT builds a plan for ranges of input shapes; a shape outside the range is refused at
run time, and a wide range costs speed and activation memory, so each range follows what the
stream model (`WindowConfig` of the serving plan, engines/contract/plan.py) really sends:

- vocoder: batches of 1 to `max_batch_windows` windows, each `size + 2 * vocoder_context_frames`
  frames wide for every size in `window_sizes()` (defaults: 32, 48, 80 and 144 frames);
- flow: the same batches of chunks `2 * size + 2 * flow_context_frames` frames wide (defaults:
  80, 112, 176 and 304 frames);
- encoder: 1 to `max_encoder_batch` sentences of up to `MAX_PHONEMES` phoneme ids;
- flow, on the GPU stream path only: whole sentences of an encoder batch right after the
  encoder, padded up to at most `SENTENCE_FLOW_MAX_FRAMES` frames.

A profile is one box per input, so the frames range from the narrowest to the widest call
(the flow's box reaches 2,048 frames at the windows' full batch, a corner no call uses,
6.7 times as many frames as the widest window call, which TensorRT sizes its activation
memory for; unmeasured: TensorRT was never run here); the optimum is the steady window, which
nearly every call of a long stream has.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from engines.artifacts.engine_cache import ShapeRange
from engines.contract.plan import WindowConfig
from engines.streaming.frames import SENTENCE_FLOW_FRAMES

LATENT_CHANNELS = 192  # inter_channels of every Piper VITS voice
# Sentences are cut at 300 characters (engines/text/frontend.py); their ids (a pad between
# phonemes) stay under 640, the longest `StreamScheduler.warmup` prepares by default.
MAX_PHONEMES = 640
OPT_PHONEMES = 128
# The largest whole-sentence flow call of the GPU stream path (engines/runtimes/device_frames.py).
SENTENCE_FLOW_MAX_FRAMES = SENTENCE_FLOW_FRAMES[-1]
DEFAULT_WINDOWS = WindowConfig()


def vocoder_call_frames(windows: WindowConfig = DEFAULT_WINDOWS) -> list[int]:
    """Every width of a vocoder call the stream model sends, narrowest first."""
    return windows.vocoder_call_frames()


def flow_call_frames(windows: WindowConfig = DEFAULT_WINDOWS) -> list[int]:
    """Every width of a flow call (two windows' frames per chunk), narrowest first."""
    return windows.flow_call_frames()


@dataclass(frozen=True)
class ServingShapes:
    """The shapes the stream model sends each stage; the defaults are `from_windows()`'s."""

    max_batch: int = DEFAULT_WINDOWS.max_batch_windows  # windows in one flow/vocoder call
    # Under load most steps are full; half the maximum keeps the tuning near the busy case.
    opt_batch: int = DEFAULT_WINDOWS.max_batch_windows // 2
    min_flow_frames: int = min(flow_call_frames())
    opt_flow_frames: int = max(flow_call_frames())
    max_flow_frames: int = max(*flow_call_frames(), SENTENCE_FLOW_MAX_FRAMES)
    min_vocoder_frames: int = min(vocoder_call_frames())
    opt_vocoder_frames: int = max(vocoder_call_frames())
    max_vocoder_frames: int = max(vocoder_call_frames())
    encoder_max_batch: int = DEFAULT_WINDOWS.max_encoder_batch  # sentences encoded together
    # New streams arrive a few per step, so most encoder calls are small.
    encoder_opt_batch: int = max(1, DEFAULT_WINDOWS.max_encoder_batch // 4)
    max_phonemes: int = MAX_PHONEMES
    opt_phonemes: int = OPT_PHONEMES
    latent_channels: int = LATENT_CHANNELS

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if int(value) < 1:
                raise ValueError(f"serving shape {name} must be positive, got {value}")
        for stage, (low, opt, high) in {
            "batch": (1, self.opt_batch, self.max_batch),
            "encoder batch": (1, self.encoder_opt_batch, self.encoder_max_batch),
            "phonemes": (1, self.opt_phonemes, self.max_phonemes),
            "flow frames": (self.min_flow_frames, self.opt_flow_frames, self.max_flow_frames),
            "vocoder frames": (
                self.min_vocoder_frames,
                self.opt_vocoder_frames,
                self.max_vocoder_frames,
            ),
        }.items():
            if not low <= opt <= high:
                raise ValueError(
                    f"{stage}: need min <= opt <= max, got {low}, {opt}, {high} "
                    "(the optimum must lie in the range)"
                )

    @classmethod
    def from_windows(
        cls,
        windows: WindowConfig = DEFAULT_WINDOWS,
        max_phonemes: int = MAX_PHONEMES,
        opt_phonemes: int = OPT_PHONEMES,
        sentence_flow_frames: int = SENTENCE_FLOW_MAX_FRAMES,
    ) -> ServingShapes:
        """The shapes covering every call a stream model with these windows sends
        (`sentence_flow_frames=0`: windows only, for a voice off the GPU stream path)."""
        flow, vocoder = flow_call_frames(windows), vocoder_call_frames(windows)
        return cls(
            max_batch=windows.max_batch_windows,
            opt_batch=max(1, windows.max_batch_windows // 2),
            min_flow_frames=min(flow),
            opt_flow_frames=max(flow),
            max_flow_frames=max(*flow, sentence_flow_frames),
            min_vocoder_frames=min(vocoder),
            opt_vocoder_frames=max(vocoder),
            max_vocoder_frames=max(vocoder),
            encoder_max_batch=windows.max_encoder_batch,
            encoder_opt_batch=max(1, windows.max_encoder_batch // 4),
            max_phonemes=max_phonemes,
            opt_phonemes=min(opt_phonemes, max_phonemes),
        )


def _batched(
    batch: tuple[int, int, int], channels: int, frames: tuple[int, int, int]
) -> ShapeRange:
    """(batch, channels, frames) at min, opt and max."""
    low, opt, high = ((size, channels, width) for size, width in zip(batch, frames, strict=True))
    return (low, opt, high)


def stage_profiles(shapes: ServingShapes | None = None) -> dict[str, dict[str, ShapeRange]]:
    """stage -> input name -> (min, opt, max), the form `EngineKey.profiles` takes.

    Without `shapes`, those of the default `WindowConfig` (`ServingShapes.from_windows()`).
    """
    shapes = shapes or ServingShapes.from_windows()
    window_batch = (1, shapes.opt_batch, shapes.max_batch)
    flow = (shapes.min_flow_frames, shapes.opt_flow_frames, shapes.max_flow_frames)
    vocoder = (shapes.min_vocoder_frames, shapes.opt_vocoder_frames, shapes.max_vocoder_frames)
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
            "prior": _batched(window_batch, channels, flow),
            "mask": _batched(window_batch, 1, flow),
        },
        "vocoder": {
            "latent": _batched(window_batch, channels, vocoder),
        },
    }
