"""The WebSocket's protocol: text in as an LLM writes it, audio out sentence by sentence.

Client → server, JSON text frames:

- `{"type": "session.update", "session": {"voice", "response_format", "sample_rate",
  "speed"}}`: any of them, at any time; they apply to text appended afterwards.
- `{"type": "input_text.append", "text": "..."}`: raw tokens; the server finds the sentence
  ends (`sentences.SentenceFinder`) and speaks each sentence as soon as it is complete.
- `{"type": "input_text.flush"}`: the end of a turn: what is left is spoken, then a
  `speech.audio.done` for the turn follows its last audio. The socket stays open.
- `{"type": "input_text.clear"}`: barge-in: audio stops at once (the pod's stream is
  cancelled), text not yet spoken is dropped; `input_text.cleared` answers with `next_turn`:
  every turn before it is over, and no audio of those turns follows.
- `{"type": "session.close"}`: speak what is left, send `session.closed`, close.

Server → client: `session.created` and `session.updated` (the settings), `speech.audio.delta`
(`audio`: base64 of the format's bytes, with the `turn` it belongs to), `speech.audio.done`
(`turn`, `usage`), `input_text.cleared`, `session.closed`, and `error` (OpenAI's envelope,
with the `turn` where it concerns one). A bad frame (binary, not JSON, unknown type, bad
values) gets an `error` and the session goes on.

Turns are numbered from 0; a flush ends the current turn and starts the next. Audio of a
turn is one stream of its format: one container per turn for wav, mp3, opus, flac and aac.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from engines.gateway.audio import AvEncoder, PcmEncoder, new_encoder
from engines.gateway.errors import ApiError, bad_request, from_failure
from engines.gateway.request import (
    OUTPUT_SAMPLE_RATE,
    PCM_SAMPLE_RATES,
    RESPONSE_FORMATS,
    check_input,
    parse_speed,
    parse_voice,
)
from engines.gateway.sentences import SentenceFinder
from engines.gateway.sse import usage
from engines.gateway.synthesis import Synthesizer

Send = Callable[[dict[str, Any]], Awaitable[None]]
CLIENT_EVENTS = (
    "session.update", "input_text.append", "input_text.flush", "input_text.clear",
    "session.close",
)  # fmt: skip


@dataclass(frozen=True)
class Settings:
    voice: str | None = None
    response_format: str = "pcm"
    sample_rate: int = OUTPUT_SAMPLE_RATE
    speed: float = 1.0

    def public(self) -> dict[str, Any]:
        return {
            "voice": self.voice,
            "response_format": self.response_format,
            "sample_rate": self.sample_rate,
            "speed": self.speed,
        }


@dataclass(frozen=True)
class _Text:
    turn: int
    text: str
    settings: Settings


@dataclass(frozen=True)
class _Flush:
    turn: int


def _invalid(message: str, param: str | None = None, code: str = "invalid_event") -> ApiError:
    return bad_request(message, param, code)


class SpeechSession:
    """One socket's session; `handle` takes each frame, a worker task speaks."""

    def __init__(self, synthesizer: Synthesizer, send: Send) -> None:
        self._synthesizer = synthesizer
        self._send_raw = send
        self._send_lock = asyncio.Lock()
        self.settings = Settings()
        self._finder = SentenceFinder()
        self._queue: asyncio.Queue[_Text | _Flush | None] = asyncio.Queue()
        self._turn = 0
        self._epoch = 0  # bumped by clear: audio of an older epoch is never sent
        self._speaking: asyncio.Task[None] | None = None
        self._worker: asyncio.Task[None] | None = None
        # The current turn's encoder, characters and seconds of audio.
        self._encoder: PcmEncoder | AvEncoder | None = None
        self._characters = 0
        self._audio_s = 0.0

    async def start(self) -> None:
        self._worker = asyncio.ensure_future(self._work())
        await self._send({"type": "session.created", "session": self.settings.public()})

    async def _send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            await self._send_raw(event)

    async def _error(self, error: ApiError, **extra: Any) -> None:
        await self._send({"type": "error", **extra, **error.envelope()})

    async def handle(self, text: str | None, data: bytes | None) -> bool:
        """One frame from the client; False once the session should close."""
        if data is not None and text is None:
            await self._error(
                _invalid(
                    f"binary frames are not part of this protocol (got {len(data)} bytes); "
                    'send JSON text frames such as {"type": "input_text.append", '
                    '"text": "Hello."}',
                    code="binary_frame",
                )
            )
            return True
        try:
            event = json.loads(text or "")
        except ValueError as error:
            await self._error(
                _invalid(f"a frame must be a JSON object: {error}", code="invalid_json")
            )
            return True
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self._error(_invalid("a frame must be a JSON object with a 'type'", "type"))
            return True
        kind = event["type"]
        try:
            if kind == "session.update":
                await self._update(event.get("session"))
            elif kind == "input_text.append":
                self._append(event.get("text"))
            elif kind == "input_text.flush":
                self._flush()
            elif kind == "input_text.clear":
                await self._clear()
            elif kind == "session.close":
                await self.finish()
                return False
            else:
                raise _invalid(
                    f"unknown event type {kind!r}; send one of {', '.join(CLIENT_EVENTS)}", "type"
                )
        except ApiError as error:
            await self._error(error, event_type=kind)
        return True

    async def _update(self, session: Any) -> None:
        if not isinstance(session, dict):
            raise _invalid("session.update needs a 'session' object", "session")
        unknown = sorted(set(session) - {"voice", "response_format", "sample_rate", "speed"})
        if unknown:
            raise _invalid(
                f"unknown session field(s) {', '.join(unknown)}; the session takes voice, "
                "response_format, sample_rate and speed",
                unknown[0],
            )
        settings = self.settings
        if "voice" in session:
            requested = parse_voice(session["voice"], "session.voice")
            settings = replace(settings, voice=await self._synthesizer.resolve(requested))
        if "response_format" in session:
            fmt = session["response_format"]
            if fmt not in RESPONSE_FORMATS:
                raise _invalid(
                    f"response_format {fmt!r} is not supported; choose one of "
                    f"{', '.join(RESPONSE_FORMATS)}",
                    "session.response_format",
                )
            settings = replace(settings, response_format=fmt)
        if "sample_rate" in session:
            settings = replace(settings, sample_rate=session["sample_rate"])
        if "speed" in session:
            settings = replace(settings, speed=parse_speed(session["speed"], "session.speed"))
        if settings.sample_rate not in PCM_SAMPLE_RATES or (
            settings.response_format != "pcm" and settings.sample_rate != OUTPUT_SAMPLE_RATE
        ):
            raise _invalid(
                f"sample_rate {settings.sample_rate!r} is not available for "
                f"{settings.response_format}: pcm takes "
                f"{', '.join(map(str, PCM_SAMPLE_RATES))}, the other formats "
                f"{OUTPUT_SAMPLE_RATE}",
                "session.sample_rate",
            )
        self.settings = settings
        await self._send({"type": "session.updated", "session": settings.public()})

    def _append(self, text: Any) -> None:
        if not isinstance(text, str):
            raise _invalid("input_text.append needs a 'text' string", "text")
        if self.settings.voice is None:
            raise _invalid(
                "no voice yet: send session.update with a voice first",
                "session.voice",
                "missing_required_parameter",
            )
        if len(self._finder.pending) + len(text) > 4 * self._finder.max_chars:
            raise _invalid("text arrives faster than it can be split; send smaller pieces", "text")
        for sentence in self._finder.push(text):
            self._queue.put_nowait(_Text(self._turn, sentence, self.settings))

    def _flush(self) -> None:
        rest = self._finder.flush()
        if rest:
            check_input(rest, "text")
            self._queue.put_nowait(_Text(self._turn, rest, self.settings))
        self._queue.put_nowait(_Flush(self._turn))
        self._turn += 1

    async def _clear(self) -> None:
        self._epoch += 1
        self._finder.clear()
        while not self._queue.empty():
            self._queue.get_nowait()
        if self._speaking is not None:
            self._speaking.cancel()
        self._drop_encoder()
        self._turn += 1
        await self._send({"type": "input_text.cleared", "next_turn": self._turn})

    async def finish(self) -> None:
        """Speak what is left, then say the session is closed."""
        if self._finder.pending.strip() or not self._queue.empty():
            self._flush()
        self._queue.put_nowait(None)
        if self._worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker
        await self._send({"type": "session.closed"})

    async def close(self) -> None:
        """The socket is gone: stop at once."""
        self._epoch += 1
        for task in (self._speaking, self._worker):
            if task is not None:
                task.cancel()
        self._drop_encoder()

    def _drop_encoder(self) -> None:
        if isinstance(self._encoder, AvEncoder):
            self._encoder.close()
        self._encoder = None
        self._characters, self._audio_s = 0, 0.0

    async def _work(self) -> None:
        while True:
            item = await self._queue.get()
            if item is None:
                return
            if isinstance(item, _Flush):
                await self._end_turn(item.turn)
                continue
            # Sentences that queued up while the previous one spoke go out as one stream.
            texts = [item.text]
            while not self._queue.empty():
                following = self._queue._queue[0]  # type: ignore[attr-defined]
                if not isinstance(following, _Text) or following.settings != item.settings:
                    break
                texts.append(self._queue.get_nowait().text)  # type: ignore[union-attr]
            self._speaking = asyncio.ensure_future(
                self._speak(item.turn, " ".join(texts), item.settings, self._epoch)
            )
            await asyncio.wait({self._speaking})
            self._speaking = None

    async def _speak(self, turn: int, text: str, settings: Settings, epoch: int) -> None:
        assert settings.voice is not None
        if self._encoder is None:
            self._encoder = new_encoder(settings.response_format, settings.sample_rate)
        encoder = self._encoder
        self._characters += len(text)
        samples = self._synthesizer.stream(
            settings.voice, text, settings.speed, settings.sample_rate
        )
        try:
            async for chunk in samples:
                if epoch != self._epoch:
                    return
                self._audio_s += chunk.size / settings.sample_rate
                data = encoder.encode(chunk)
                if data:
                    await self._delta(turn, data)
        except Exception as error:
            if epoch == self._epoch:
                await self._error(from_failure(error), turn=turn)
        finally:
            await samples.aclose()  # type: ignore[attr-defined]

    async def _delta(self, turn: int, data: bytes) -> None:
        await self._send(
            {"type": "speech.audio.delta", "turn": turn, "audio": base64.b64encode(data).decode()}
        )

    async def _end_turn(self, turn: int) -> None:
        if self._encoder is not None:
            tail = self._encoder.finish()
            if tail:
                await self._delta(turn, tail)
        await self._send(
            {
                "type": "speech.audio.done",
                "turn": turn,
                "usage": usage(self._characters, self._audio_s),
            }
        )
        self._encoder = None
        self._characters, self._audio_s = 0, 0.0
