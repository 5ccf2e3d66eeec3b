"""Requests checked field by field, and failures mapped to OpenAI's envelope with the status a
client acts on (400, 404, 429, 503)."""

from __future__ import annotations

import pytest

from engines.client.balancing import NoEndpoints, Refusal, StreamRefused
from engines.gateway.errors import ApiError, UpstreamError, from_failure
from engines.gateway.request import MAX_INPUT_CHARS, parse_speech_request

VALID = {"model": "tts-1", "input": "Hello.", "voice": "alloy"}


def test_a_valid_request_with_openais_defaults() -> None:
    request = parse_speech_request(VALID)
    assert (request.response_format, request.speed, request.stream_format) == ("mp3", 1.0, "audio")
    assert parse_speech_request({**VALID, "voice": {"id": "joe"}}).voice == "joe"
    request = parse_speech_request(
        {**VALID, "response_format": "pcm", "speed": 4, "instructions": "cheerful", "x": 1}
    )
    assert request.speed == 4.0 and request.instructions == "cheerful"


@pytest.mark.parametrize(
    "change, status, param, words",
    [
        ({"input": ""}, 400, "input", "empty"),
        ({"input": "   "}, 400, "input", "empty"),
        ({"input": "a" * (MAX_INPUT_CHARS + 1)}, 400, "input", "4096"),
        ({"input": 5}, 400, "input", "string"),
        ({"voice": None}, 400, "voice", "required"),
        ({"voice": ""}, 400, "voice", "voice name"),
        ({"response_format": "ogg"}, 400, "response_format", "mp3, opus"),
        ({"stream_format": "chunks"}, 400, "stream_format", "audio, sse"),
        ({"speed": 0.2}, 400, "speed", "0.25 to 4"),
        ({"speed": 4.5}, 400, "speed", "0.25 to 4"),
        ({"speed": "fast"}, 400, "speed", "number"),
        ({"speed": True}, 400, "speed", "number"),
        ({"model": "whisper-1"}, 404, "model", "tts-1"),
        ({"model": None}, 400, "model", "required"),
    ],
)
def test_each_bad_field_is_named(change: dict, status: int, param: str, words: str) -> None:
    with pytest.raises(ApiError) as error:
        parse_speech_request({**VALID, **change})
    assert error.value.status == status
    assert error.value.param == param
    assert words in error.value.message
    envelope = error.value.envelope()["error"]
    assert set(envelope) == {"message", "type", "param", "code"}
    assert envelope["type"] == "invalid_request_error"


def test_the_body_must_be_an_object() -> None:
    with pytest.raises(ApiError) as error:
        parse_speech_request(["not", "an", "object"])
    assert error.value.status == 400


def refused(*codes: str) -> StreamRefused:
    return StreamRefused(
        "joe", [Refusal(f"10.0.0.{i}:8001", c, "busy") for i, c in enumerate(codes)]
    )


@pytest.mark.parametrize(
    "failure, status, code",
    [
        (NoEndpoints("joe"), 503, "no_ready_pod"),
        (refused("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"), 429, "voice_at_capacity"),
        (refused("RESOURCE_EXHAUSTED", "UNAVAILABLE"), 503, "no_ready_pod"),
        (refused("NOT_FOUND"), 503, "no_ready_pod"),
        (UpstreamError("TEXT is 6000 bytes", "INVALID_ARGUMENT"), 400, "invalid_value"),
        (UpstreamError("limit", "RESOURCE_EXHAUSTED"), 429, "voice_at_capacity"),
        (UpstreamError("stopping", "UNAVAILABLE"), 503, "no_ready_pod"),
        (UpstreamError("model crashed", "INTERNAL"), 502, "upstream_error"),
        (RuntimeError("bug"), 500, "internal_error"),
    ],
)
def test_failures_map_to_statuses_a_client_acts_on(
    failure: Exception, status: int, code: str
) -> None:
    error = from_failure(failure)
    assert (error.status, error.code) == (status, code)
    assert error.message


def test_a_429_says_how_many_pods_refused() -> None:
    error = from_failure(refused("RESOURCE_EXHAUSTED", "RESOURCE_EXHAUSTED"))
    assert "every pod tried (2)" in error.message and error.type == "rate_limit_error"
