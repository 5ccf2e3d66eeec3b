"""Request decoding: a stream model request's input tensors → (text, SynthesisParams).

Pure code: plain numpy arrays in, the serving plan and the voice's defaults beside them, and
either speech parameters or a `RequestError` out. No Triton import, so every rule here is
tested without a server, and nothing a client sends can raise anything but `RequestError`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engines.contract import names
from engines.contract.errors import (
    INTERNAL,
    INVALID_ARGUMENT,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    RequestError,
)
from engines.contract.plan import ServingPlan
from engines.streaming import SynthesisParams

LENGTH_SCALE_RANGE = (0.1, 10.0)
NOISE_RANGE = (0.0, 2.0)
KNOWN_INPUTS = tuple(name for name, _, _ in names.INPUTS)


@dataclass(frozen=True)
class VoiceDefaults:
    """What a request may leave out, from the voice's own config."""

    num_speakers: int = 1
    length_scale: float = 1.0
    noise_scale: float = 0.667
    noise_w: float = 0.8


def _describe(array: np.ndarray) -> str:
    return f"dtype {array.dtype}, shape {tuple(array.shape)}"


def _as_array(name: str, value: object) -> np.ndarray:
    if not isinstance(value, np.ndarray):
        raise RequestError(f"{name} must be a tensor, got {type(value).__name__}")
    return value


def decode_text(value: object, max_text_bytes: int) -> str:
    array = _as_array(names.TEXT, value)
    values = array.reshape(-1)
    if values.size != 1:
        raise RequestError(f"TEXT must hold exactly one string, got {values.size}")
    raw = values[0]
    if isinstance(raw, (bytes, np.bytes_)):
        raw_bytes = bytes(raw)
    elif isinstance(raw, (str, np.str_)):
        raw_bytes = str(raw).encode("utf-8", errors="surrogatepass")
    else:
        raise RequestError(f"TEXT must be a UTF-8 string (BYTES), got {_describe(array)}")
    if len(raw_bytes) > max_text_bytes:
        raise RequestError(
            f"TEXT is {len(raw_bytes)} bytes; the limit is {max_text_bytes} bytes (max_text_bytes)"
        )
    try:
        text = raw_bytes.decode("utf-8")
    except UnicodeDecodeError as error:
        reason = f"{error.reason} at byte {error.start}"
        raise RequestError(f"TEXT is not valid UTF-8: {reason}") from None
    if not text.strip():
        raise RequestError("TEXT is empty; send the text to speak")
    return text


def decode_scalar(name: str, value: object) -> float | None:
    """One finite number, or None where the input is absent."""
    if value is None:
        return None
    array = _as_array(name, value)
    if array.dtype.kind not in "iuf":
        raise RequestError(f"{name} must be a number, got {_describe(array)}")
    values = array.reshape(-1)
    if values.size != 1:
        raise RequestError(f"{name} must hold exactly one value, got {values.size}")
    number = float(values[0])
    if not math.isfinite(number):
        raise RequestError(f"{name} must be a finite number, got {number}")
    return number


def _check_range(name: str, value: float, bounds: tuple[float, float]) -> None:
    low, high = bounds
    if not low <= value <= high:
        raise RequestError(f"{name} {value} is outside {low:g}..{high:g}")


def decode_request(
    inputs: Mapping[str, object], plan: ServingPlan, voice: VoiceDefaults
) -> tuple[str, SynthesisParams]:
    """The text and speech parameters of one request; raises RequestError and nothing else."""
    unknown = sorted(str(name) for name in inputs if name not in KNOWN_INPUTS)
    if unknown:
        raise RequestError(
            f"unknown input(s) {', '.join(unknown)}; the model takes {', '.join(KNOWN_INPUTS)}"
        )
    if inputs.get(names.TEXT) is None:
        raise RequestError("TEXT is missing; send the text to speak")
    text = decode_text(inputs[names.TEXT], plan.max_text_bytes)

    speakers = max(1, voice.num_speakers)
    speaker = decode_scalar(names.SPEAKER_ID, inputs.get(names.SPEAKER_ID))
    if speaker is not None and not speaker.is_integer():
        raise RequestError(f"SPEAKER_ID must be a whole number, got {speaker}")
    speaker_id = 0 if speaker is None else int(speaker)
    if not 0 <= speaker_id < speakers:
        raise RequestError(
            f"SPEAKER_ID {speaker_id} is out of range: voice {plan.name!r} has "
            f"{speakers} speaker(s), ids 0..{speakers - 1}"
        )
    length = decode_scalar(names.LENGTH_SCALE, inputs.get(names.LENGTH_SCALE))
    noise = decode_scalar(names.NOISE_SCALE, inputs.get(names.NOISE_SCALE))
    noise_w = decode_scalar(names.NOISE_W, inputs.get(names.NOISE_W))
    params = SynthesisParams(
        speaker_id=speaker_id,
        # The plan's rate is a speed (larger is faster); Piper's length scale is a duration.
        length_scale=voice.length_scale / plan.speaking_rate if length is None else length,
        noise_scale=voice.noise_scale if noise is None else noise,
        noise_w=voice.noise_w if noise_w is None else noise_w,
    )
    _check_range(names.LENGTH_SCALE, params.length_scale, LENGTH_SCALE_RANGE)
    _check_range(names.NOISE_SCALE, params.noise_scale, NOISE_RANGE)
    _check_range(names.NOISE_W, params.noise_w, NOISE_RANGE)
    return text, params


def stream_limit_error(voice: str, limit: int) -> RequestError:
    return RequestError(
        f"voice {voice!r} is serving its limit of {limit} streams on this server "
        "(max_streams_per_pod); retry later",
        RESOURCE_EXHAUSTED,
    )


__all__ = [
    "INTERNAL",
    "INVALID_ARGUMENT",
    "RESOURCE_EXHAUSTED",
    "UNAVAILABLE",
    "RequestError",
    "VoiceDefaults",
    "decode_request",
    "stream_limit_error",
]
