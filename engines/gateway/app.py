"""The ASGI application (Starlette): routes, auth, errors in OpenAI's envelope.

- `POST /v1/audio/speech`: the response starts once the first audio exists, so that a
  refusal (404, 429, 503) still has its status; then chunked transfer, chunk by chunk.
- `GET /v1/models`, `GET /v1/audio/voices`.
- `WS /v1/audio/speech/stream`: `session.SpeechSession`.
- `GET /metrics`: streams, refusals and failures per pod endpoint (Prometheus text).
- `GET /healthz`: the process answers (liveness and readiness; a voice with no pod is a
  503 per request, not an unready gateway).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect

from engines.client.balancing import Balancer
from engines.contract import names
from engines.gateway import sse
from engines.gateway.audio import (
    AvEncoder,
    PcmEncoder,
    StreamResampler,
    content_type,
    new_encoder,
)
from engines.gateway.auth import ApiKeys
from engines.gateway.errors import ApiError, bad_request, from_failure
from engines.gateway.request import (
    MODELS,
    OUTPUT_SAMPLE_RATE,
    RESPONSE_FORMATS,
    parse_speech_request,
)
from engines.gateway.session import SpeechSession
from engines.gateway.synthesis import Synthesizer

logger = logging.getLogger("voxfleet.api")
# WebSocket close code for a policy violation (a missing or wrong key).
POLICY_VIOLATION = 1008


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.envelope(), status_code=error.status)


async def _api_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, ApiError)
    return error_response(error)


async def _http_error(request: Request, error: Exception) -> Response:
    assert isinstance(error, HTTPException)
    message = {
        404: f"no route {request.method} {request.url.path}; the API is under /v1",
        405: f"{request.method} is not allowed on {request.url.path}",
    }.get(error.status_code, str(error.detail))
    return error_response(
        ApiError(error.status_code, message, code="not_found" if error.status_code == 404 else None)
    )


async def _audio_body(
    first: np.ndarray | None, rest: AsyncIterator[np.ndarray], encoder: PcmEncoder | AvEncoder
) -> AsyncIterator[bytes]:
    try:
        data = encoder.encode(first) if first is not None else b""
        if data:
            yield data
        async for samples in rest:
            data = encoder.encode(samples)
            if data:
                yield data
        tail = encoder.finish()
        if tail:
            yield tail
    except Exception as error:
        # The status line went out with the first audio: cutting the transfer short (no
        # last chunk) is how the client learns the audio is incomplete.
        logger.warning("stream cut short: %s", from_failure(error).message)
        raise
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
        if isinstance(encoder, AvEncoder):
            encoder.close()


async def _sse_body(
    first: np.ndarray | None,
    rest: AsyncIterator[np.ndarray],
    encoder: PcmEncoder | AvEncoder,
    characters: int,
) -> AsyncIterator[bytes]:
    seconds = 0.0
    try:
        if first is not None:
            seconds += first.size / OUTPUT_SAMPLE_RATE
            data = encoder.encode(first)
            if data:
                yield sse.audio_delta(data)
        async for samples in rest:
            seconds += samples.size / OUTPUT_SAMPLE_RATE
            data = encoder.encode(samples)
            if data:
                yield sse.audio_delta(data)
        tail = encoder.finish()
        if tail:
            yield sse.audio_delta(tail)
        yield sse.audio_done(characters, seconds)
    except Exception as error:
        yield sse.error_event(from_failure(error).envelope())
    finally:
        await rest.aclose()  # type: ignore[attr-defined]
        if isinstance(encoder, AvEncoder):
            encoder.close()


def metrics_text(balancer: Balancer) -> str:
    """The balancer's counts per endpoint, in Prometheus' text format."""
    counts = balancer.counts()
    lines = []
    for name, kind, value_of in (
        (names.GATEWAY_STREAMS_TOTAL, "counter", lambda c: c.streams),
        (names.GATEWAY_STREAMS_IN_FLIGHT, "gauge", lambda c: c.in_flight),
        (names.GATEWAY_REFUSALS_TOTAL, "counter", lambda c: c.refusals),
        (names.GATEWAY_FAILURES_TOTAL, "counter", lambda c: c.failures),
    ):
        lines.append(f"# TYPE {name} {kind}")
        for endpoint, count in sorted(counts.items()):
            lines.append(f'{name}{{endpoint="{endpoint}"}} {value_of(count)}')
    return "\n".join(lines) + "\n"


def warm_up_encoders() -> None:
    """Load the resampler and every encoder once, before the first request needs them."""
    resampler = StreamResampler(OUTPUT_SAMPLE_RATE)
    resampler.push(np.zeros(4096, dtype=np.int16), 22050)
    for response_format in RESPONSE_FORMATS:
        encoder = new_encoder(response_format, OUTPUT_SAMPLE_RATE)
        encoder.encode(np.zeros(2400, dtype=np.int16))
        encoder.finish()


def build_app(synthesizer: Synthesizer, keys: ApiKeys | None = None) -> Starlette:
    keys = keys or ApiKeys(environ={})

    async def speech(request: Request) -> Response:
        keys.check(request.headers.get("authorization"))
        try:
            body = await request.json()
        except ValueError as error:
            raise bad_request(f"the body must be JSON: {error}", code="invalid_json") from None
        asked = parse_speech_request(body)
        voice = await synthesizer.resolve(asked.voice)
        # The encoder is ready before the first audio is, not set up after it.
        encoder = new_encoder(asked.response_format, OUTPUT_SAMPLE_RATE)
        samples = synthesizer.stream(voice, asked.input, asked.speed, OUTPUT_SAMPLE_RATE)
        try:
            first: np.ndarray | None = await samples.__anext__()
        except StopAsyncIteration:
            first = None
        except Exception as error:
            await samples.aclose()  # type: ignore[attr-defined]
            if isinstance(encoder, AvEncoder):
                encoder.close()
            raise from_failure(error) from None
        headers = {"X-Voice": voice, "X-Sample-Rate": str(OUTPUT_SAMPLE_RATE)}
        if asked.stream_format == "sse":
            return StreamingResponse(
                _sse_body(first, samples, encoder, len(asked.input)),
                media_type=sse.CONTENT_TYPE,
                headers={**headers, "Cache-Control": "no-cache"},
            )
        return StreamingResponse(
            _audio_body(first, samples, encoder),
            media_type=content_type(asked.response_format),
            headers=headers,
        )

    async def models(request: Request) -> Response:
        keys.check(request.headers.get("authorization"))
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": model, "object": "model", "created": 0, "owned_by": "voxfleet"}
                    for model in MODELS
                ],
            }
        )

    async def voices(request: Request) -> Response:
        keys.check(request.headers.get("authorization"))
        known = await synthesizer.directory.voices()
        table = synthesizer.directory.table
        listed: list[dict[str, Any]] = []
        for name in known:
            endpoints = await synthesizer.directory.endpoints(name)
            listed.append(
                {
                    "id": name,
                    "name": name,
                    "aliases": table.aliases_of(name, known),
                    "ready_endpoints": len(endpoints),
                }
            )
        return JSONResponse({"object": "list", "voices": listed})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(
            metrics_text(synthesizer.balancer), media_type="text/plain; version=0.0.4"
        )

    async def stream_socket(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            keys.check(websocket.headers.get("authorization"))
        except ApiError as error:
            await websocket.send_json({"type": "error", **error.envelope()})
            await websocket.close(POLICY_VIOLATION)
            return
        session = SpeechSession(synthesizer, websocket.send_json)
        await session.start()
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if not await session.handle(message.get("text"), message.get("bytes")):
                    await websocket.close()
                    break
        except WebSocketDisconnect:
            pass
        finally:
            await session.close()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        warm_up_encoders()  # the first request of each format pays no import or setup
        try:
            yield
        finally:
            await synthesizer.directory.close()
            await synthesizer.upstreams.close()

    return Starlette(
        routes=[
            Route("/v1/audio/speech", speech, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/audio/voices", voices, methods=["GET"]),
            WebSocketRoute("/v1/audio/speech/stream", stream_socket),
            Route("/healthz", health, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ],
        exception_handlers={ApiError: _api_error, HTTPException: _http_error},
        lifespan=lifespan,
    )
