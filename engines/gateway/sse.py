"""`stream_format=sse`: OpenAI's speech events as Server-Sent Events.

`{"type": "speech.audio.delta", "audio": "<base64>"}` per chunk of the response format's
bytes, then one `{"type": "speech.audio.done", "usage": {...}}`; an error after the stream
began is an `{"type": "error", "error": {...}}` event (the status line has gone by then).
The voices count no tokens: usage says 0 tokens, and adds the characters spoken and the
seconds of audio sent.
"""

from __future__ import annotations

import base64
import json
from typing import Any

CONTENT_TYPE = "text/event-stream"


def event(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def audio_delta(data: bytes) -> bytes:
    return event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})


def usage(characters: int, audio_seconds: float) -> dict[str, Any]:
    return {
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 0,
        "input_characters": characters,
        "output_audio_seconds": round(audio_seconds, 3),
    }


def audio_done(characters: int, audio_seconds: float) -> bytes:
    return event({"type": "speech.audio.done", "usage": usage(characters, audio_seconds)})


def error_event(envelope: dict[str, Any]) -> bytes:
    return event({"type": "error", **envelope})
