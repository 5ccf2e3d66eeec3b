"""The WebSocket: text in as an LLM writes it, audio out before the text is complete; barge-in;
bad frames get an error and the session goes on."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

import pytest
import websockets

pytestmark = pytest.mark.triton

REPLY = (
    "Sure, I can help with that. The train leaves at nine in the morning from platform four. "
    "Bring your ticket and arrive a few minutes early, because the doors close on time."
)
TOKENS_PER_SECOND = 20


def llm_tokens(text: str) -> list[str]:
    """Pieces as an LLM streams them: words with their leading space, punctuation apart."""
    return re.findall(r"\s?\w+|\s?[^\w\s]", text)


def socket_url(base: str) -> str:
    return base.replace("http://", "ws://") + "/v1/audio/speech/stream"


async def receive_until(socket: Any, kind: str, timeout_s: float = 60) -> list[dict[str, Any]]:
    events = []
    while True:
        event = json.loads(await asyncio.wait_for(socket.recv(), timeout_s))
        events.append(event)
        if event["type"] == kind:
            return events


async def start(socket: Any, voice: str = "alloy") -> None:
    assert json.loads(await socket.recv())["type"] == "session.created"
    await socket.send(json.dumps({"type": "session.update", "session": {"voice": voice}}))
    updated = json.loads(await socket.recv())
    assert updated["type"] == "session.updated" and updated["session"]["voice"] == "joe"


def test_first_audio_comes_before_the_last_token(gateway: str) -> None:
    tokens = llm_tokens(REPLY)

    async def talk() -> tuple[float, float, list[dict[str, Any]]]:
        async with websockets.connect(socket_url(gateway)) as socket:
            await start(socket)
            last_token_at = 0.0

            async def write() -> None:
                nonlocal last_token_at
                for token in tokens:
                    await socket.send(json.dumps({"type": "input_text.append", "text": token}))
                    last_token_at = time.monotonic()
                    await asyncio.sleep(1 / TOKENS_PER_SECOND)
                await socket.send(json.dumps({"type": "input_text.flush"}))

            writer = asyncio.ensure_future(write())
            first = json.loads(await asyncio.wait_for(socket.recv(), 30))
            first_audio_at = time.monotonic()
            events = [first, *await receive_until(socket, "speech.audio.done")]
            await writer
            await socket.send(json.dumps({"type": "session.close"}))
            assert (await receive_until(socket, "session.closed"))[-1]["type"] == "session.closed"
            return first_audio_at, last_token_at, events

    first_audio_at, last_token_at, events = asyncio.run(talk())
    assert events[0]["type"] == "speech.audio.delta", events[0]
    assert first_audio_at < last_token_at, "no audio before the text was complete"
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if "audio" in e)
    seconds = len(audio) / 2 / 24000
    assert events[-1]["type"] == "speech.audio.done" and events[-1]["turn"] == 0
    assert events[-1]["usage"]["output_audio_seconds"] == pytest.approx(seconds, abs=0.01)
    assert 7 < seconds < 14  # the whole reply was spoken (about 10 s)


def test_clear_stops_the_audio_and_the_next_turn_speaks(gateway: str) -> None:
    async def talk() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        async with websockets.connect(socket_url(gateway)) as socket:
            await start(socket)
            long = " ".join(["This sentence is one of many in a long answer."] * 12)
            await socket.send(json.dumps({"type": "input_text.append", "text": long}))
            await socket.send(json.dumps({"type": "input_text.flush"}))
            await receive_until(socket, "speech.audio.delta")
            await socket.send(json.dumps({"type": "input_text.clear"}))
            before = await receive_until(socket, "input_text.cleared")
            # Nothing of the cleared turn follows; the next turn speaks.
            await socket.send(json.dumps({"type": "input_text.append", "text": "Okay."}))
            await socket.send(json.dumps({"type": "input_text.flush"}))
            after = await receive_until(socket, "speech.audio.done")
            return before, after

    before, after = asyncio.run(talk())
    next_turn = before[-1]["next_turn"]
    assert next_turn == 2  # turn 0 was flushed (turn 1 began), and both are over
    assert all(e["turn"] >= next_turn for e in after), "audio of a cleared turn went on"
    assert after[-1]["turn"] == next_turn
    assert any(e["type"] == "speech.audio.delta" for e in after)


def test_bad_frames_get_an_error_and_the_session_goes_on(gateway: str) -> None:
    async def talk() -> list[dict[str, Any]]:
        async with websockets.connect(socket_url(gateway)) as socket:
            assert json.loads(await socket.recv())["type"] == "session.created"
            errors = []
            for frame in (
                json.dumps({"type": "input_text.append", "text": "Too early."}),
                b"\x00\xff\xfe garbage \x89PNG",
                "not json {",
                json.dumps({"type": "input_audio.append"}),
                json.dumps({"type": "session.update", "session": {"voice": "nobody"}}),
                json.dumps({"type": "session.update", "session": {"sample_rate": 12345}}),
            ):
                await socket.send(frame)
                errors.append(json.loads(await socket.recv()))
            await start_after_errors(socket)
            await socket.send(json.dumps({"type": "input_text.append", "text": "Still here."}))
            await socket.send(json.dumps({"type": "input_text.flush"}))
            spoken = await receive_until(socket, "speech.audio.done")
            assert any(e["type"] == "speech.audio.delta" for e in spoken)
            return errors

    async def start_after_errors(socket: Any) -> None:
        update = {"voice": "joe", "sample_rate": 16000}
        await socket.send(json.dumps({"type": "session.update", "session": update}))
        assert json.loads(await socket.recv())["session"]["sample_rate"] == 16000

    errors = asyncio.run(talk())
    assert all(e["type"] == "error" for e in errors)
    codes = [e["error"]["code"] for e in errors]
    assert codes == [
        "missing_required_parameter",
        "binary_frame",
        "invalid_json",
        "invalid_event",
        "voice_not_found",
        "invalid_event",
    ]
    assert all(e["error"]["message"] for e in errors)
