"""What a speech request may say, checked field by field: `parse_speech_request` turns a
JSON body into a `SpeechRequest` or raises an `ApiError` (400) that names the field.

Pure code: no HTTP, no server. The limits are OpenAI's: `input` at most 4,096 characters,
`speed` 0.25 to 4.0, the formats mp3 (default), opus, aac, flac, wav and pcm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from engines.gateway.errors import ApiError, bad_request

MAX_INPUT_CHARS = 4096
SPEED_RANGE = (0.25, 4.0)
RESPONSE_FORMATS = ("mp3", "opus", "aac", "flac", "wav", "pcm")
DEFAULT_RESPONSE_FORMAT = "mp3"
STREAM_FORMATS = ("audio", "sse")
# Every model name does the same here (the voice decides the sound); these are the names
# clients send. `instructions` is accepted and ignored: the voices take no style prompt.
MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts", "voxfleet")
# Output rate of every format, as OpenAI's: clients assume 24 kHz for pcm.
OUTPUT_SAMPLE_RATE = 24000
# Rates a WebSocket session may ask for its pcm.
PCM_SAMPLE_RATES = (8000, 16000, 22050, 24000, 44100, 48000)


@dataclass(frozen=True)
class SpeechRequest:
    model: str
    input: str
    voice: str
    response_format: str = DEFAULT_RESPONSE_FORMAT
    speed: float = 1.0
    stream_format: str = "audio"
    instructions: str | None = None


def _string(body: dict[str, Any], name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise bad_request(f"'{name}' is required", name, "missing_required_parameter")
        return None
    if not isinstance(value, str):
        raise bad_request(
            f"'{name}' must be a string, got {type(value).__name__}", name, "invalid_type"
        )
    return value


def _choice(body: dict[str, Any], name: str, choices: tuple[str, ...], default: str) -> str:
    value = _string(body, name)
    if value is None:
        return default
    if value not in choices:
        raise bad_request(
            f"'{name}' {value!r} is not supported; choose one of {', '.join(choices)}", name
        )
    return value


def parse_voice(value: Any, param: str = "voice") -> str:
    """A voice name: a string, or OpenAI's `{"id": name}` object."""
    if isinstance(value, dict) and "id" in value:
        value = value["id"]
    if value is None:
        raise bad_request(f"'{param}' is required", param, "missing_required_parameter")
    if not isinstance(value, str) or not value.strip():
        raise bad_request(
            f"'{param}' must be a voice name (a string, or {{\"id\": name}})", param, "invalid_type"
        )
    return value.strip()


def parse_speed(value: Any, param: str = "speed") -> float:
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise bad_request(
            f"'{param}' must be a number, got {type(value).__name__}", param, "invalid_type"
        )
    low, high = SPEED_RANGE
    if not math.isfinite(value) or not low <= value <= high:
        raise bad_request(f"'{param}' {value} is outside {low:g} to {high:g}", param)
    return float(value)


def check_input(text: str, param: str = "input") -> str:
    if not text.strip():
        raise bad_request(f"'{param}' is empty; send the text to speak", param)
    if len(text) > MAX_INPUT_CHARS:
        raise bad_request(
            f"'{param}' is {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
            param,
            "string_above_max_length",
        )
    return text


def parse_speech_request(body: Any) -> SpeechRequest:
    """The request a JSON body asks for; raises ApiError (400) naming the field."""
    if not isinstance(body, dict):
        raise bad_request(f"the body must be a JSON object, got {type(body).__name__}")
    model = _string(body, "model", required=True) or ""
    if model not in MODELS:
        raise ApiError(
            404,
            f"model {model!r} is not served here; models: {', '.join(MODELS)}",
            param="model",
            code="model_not_found",
        )
    text = check_input(_string(body, "input", required=True) or "")
    return SpeechRequest(
        model=model,
        input=text,
        voice=parse_voice(body.get("voice")),
        response_format=_choice(body, "response_format", RESPONSE_FORMATS, DEFAULT_RESPONSE_FORMAT),
        speed=parse_speed(body.get("speed")),
        stream_format=_choice(body, "stream_format", STREAM_FORMATS, "audio"),
        instructions=_string(body, "instructions"),
    )
