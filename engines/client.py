"""Streaming client: text in, PCM chunks out, over Triton's gRPC streaming API."""

from __future__ import annotations

import contextlib
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from tritonclient.grpc import InferenceServerClient


class SynthesisError(RuntimeError):
    """The server refused or failed the stream; `code` is the gRPC status name when known."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class StreamResult:
    sample_rate: int = 0
    chunks: list[np.ndarray] = field(default_factory=list)
    first_audio_s: float | None = None
    total_s: float = 0.0
    # Times a full server refused the stream before it was taken (`synthesize` retries).
    refusals: int = 0

    @property
    def audio(self) -> np.ndarray:
        return np.concatenate(self.chunks) if self.chunks else np.zeros(0, dtype=np.int16)

    @property
    def audio_seconds(self) -> float:
        return len(self.audio) / self.sample_rate if self.sample_rate else 0.0

    @property
    def rtf(self) -> float:
        return self.total_s / self.audio_seconds if self.audio_seconds else float("inf")


# How long a finished stream's close may wait for the server to end it (then it is cancelled).
STREAM_CLOSE_TIMEOUT_S = 5.0

_STATUS_PREFIX = re.compile(r"^\[([A-Z_]+)\] ")


def _error(error: object) -> SynthesisError:
    """Recover the gRPC status: from the call, else from the stream message's prefix."""
    get_message = getattr(error, "message", None)
    message = (get_message() if callable(get_message) else None) or str(error)
    status = getattr(error, "status", None)
    code = status() if callable(status) else None
    if code:
        return SynthesisError(message, str(code).removeprefix("StatusCode."))
    prefixed = _STATUS_PREFIX.match(message)
    if prefixed:
        return SynthesisError(message[prefixed.end() :], prefixed.group(1))
    if "unknown model" in message:
        return SynthesisError(message, "NOT_FOUND")
    return SynthesisError(message)


def _reachable_client(url: str, connect_timeout_s: float) -> InferenceServerClient:
    """A client of `url`; with `connect_timeout_s` > 0, one that has reached the server.

    A Kubernetes Service can refuse connections for a moment after the pods behind it are
    Ready (its endpoints reach the proxies asynchronously), and a server may still be
    starting. Each try is a fresh channel (gRPC would otherwise wait out its own reconnect
    backoff), 0.1 s apart and doubling to 1 s. Nothing is sent before the server answers,
    so a retry never repeats speech. Other errors are raised at once."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    if connect_timeout_s <= 0:
        return grpcclient.InferenceServerClient(url=url)
    deadline = time.monotonic() + connect_timeout_s
    delay = 0.1
    while True:
        client = grpcclient.InferenceServerClient(url=url)
        try:
            client.is_server_live()
            return client
        except InferenceServerException as error:
            client.close()
            failure = _error(error)
            if failure.code != "UNAVAILABLE":
                raise failure from None
            if time.monotonic() + delay > deadline:
                raise SynthesisError(
                    f"cannot reach {url} within {connect_timeout_s:g} s: {failure}", failure.code
                ) from None
        time.sleep(delay)
        delay = min(delay * 2, 1.0)


def _close_stream(client: InferenceServerClient, complete: bool) -> None:
    """End the client's stream: cancel it if it is not finished; close a finished one.

    A finished stream is closed, not cancelled: Triton 2.51's gRPC frontend, asked to cancel a
    stream whose final response it has not yet seen written, waits for a callback that never
    comes and keeps the model referenced, so that a reload's old model never unloads (its
    stub processes stay) and a shutdown waits out its exit timeout. A close waits for the
    server to end the stream; after STREAM_CLOSE_TIMEOUT_S it is cancelled after all."""
    if not complete:
        client.stop_stream(cancel_requests=True)
        return

    def cancel() -> None:
        with contextlib.suppress(Exception):  # the close may end while this runs
            client.stop_stream(cancel_requests=True)

    fallback = threading.Timer(STREAM_CLOSE_TIMEOUT_S, cancel)
    fallback.daemon = True
    fallback.start()
    try:
        client.stop_stream(cancel_requests=False)
    finally:
        fallback.cancel()


def stream_tts(
    url: str,
    text: str | bytes,
    voice: str = "joe",
    speaker_id: int | None = None,
    length_scale: float | None = None,
    noise_scale: float | None = None,
    noise_w: float | None = None,
    timeout_s: float = 120.0,
    on_sent: Callable[[], None] | None = None,
    connect_timeout_s: float = 0.0,
) -> Iterator[tuple[int, np.ndarray]]:
    """Yield (sample_rate, int16 chunk) as the server sends them; raise SynthesisError.

    `on_sent` is called just before the request goes out (after the client is set up), so
    that timings start where the benchmark's do. `connect_timeout_s` > 0: while the server
    cannot be reached (UNAVAILABLE), try again for that long before the request is sent."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    client = _reachable_client(url, connect_timeout_s)
    complete = False
    events: queue.Queue[tuple[object, object]] = queue.Queue()
    try:
        raw = text if isinstance(text, bytes) else text.encode("utf-8")
        text_input = grpcclient.InferInput("TEXT", [1], "BYTES")
        text_input.set_data_from_numpy(np.array([raw], dtype=np.object_))
        inputs = [text_input]
        for name, value, dtype, np_type in (
            ("SPEAKER_ID", speaker_id, "INT32", np.int32),
            ("LENGTH_SCALE", length_scale, "FP32", np.float32),
            ("NOISE_SCALE", noise_scale, "FP32", np.float32),
            ("NOISE_W", noise_w, "FP32", np.float32),
        ):
            if value is not None:
                tensor = grpcclient.InferInput(name, [1], dtype)
                tensor.set_data_from_numpy(np.array([value], dtype=np_type))
                inputs.append(tensor)
        client.start_stream(callback=lambda result, error: events.put((result, error)))
        if on_sent is not None:
            on_sent()
        try:
            client.async_stream_infer(
                voice, inputs, request_id=uuid.uuid4().hex, enable_empty_final_response=True
            )
        except InferenceServerException as error:
            raise _error(error) from None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SynthesisError(f"no audio within {timeout_s:.0f} s", "DEADLINE_EXCEEDED")
            try:
                result, failure = events.get(timeout=remaining)
            except queue.Empty:
                continue
            if failure is not None:
                raise _error(failure)
            response = result.get_response()  # type: ignore[attr-defined]
            final = response.parameters.get("triton_final_response")
            # Set before the last chunk is handed out: a caller may stop there.
            complete = final is not None and final.bool_param
            audio = result.as_numpy("AUDIO")  # type: ignore[attr-defined]
            if audio is not None and audio.size:
                rate = int(result.as_numpy("SAMPLE_RATE")[0])  # type: ignore[attr-defined]
                yield rate, audio.astype(np.int16, copy=False)
            if complete:
                return
    finally:
        try:
            _close_stream(client, complete)
        finally:
            client.close()


# A stream refused by a full server (RESOURCE_EXHAUSTED, before any audio) is asked for again,
# over a new connection (a Service may send it to another pod), this long at most, waiting
# 0.1 s, then twice as long each time up to 1 s.
REFUSED_RETRY_S = 10.0


def synthesize(
    url: str,
    text: str | bytes,
    voice: str = "joe",
    refused_retry_s: float = REFUSED_RETRY_S,
    **kwargs: object,
) -> StreamResult:
    """Stream a whole text, timing first audio and the real-time factor. A stream that a full
    server refuses before its first audio is asked for again for up to `refused_retry_s`
    (0: never); `StreamResult.refusals` counts the refusals."""
    deadline = time.monotonic() + refused_retry_s
    delay = 0.1
    refusals = 0
    while True:
        result = StreamResult()
        try:
            _stream_into(result, url, text, voice, **kwargs)
        except SynthesisError as error:
            if error.code != "RESOURCE_EXHAUSTED" or result.chunks:
                raise
            refusals += 1
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            continue
        result.refusals = refusals
        return result


def _stream_into(
    result: StreamResult, url: str, text: str | bytes, voice: str, **kwargs: object
) -> None:
    started = [time.perf_counter()]

    def sent() -> None:
        started[0] = time.perf_counter()

    chunks = stream_tts(url, text, voice, on_sent=sent, **kwargs)  # type: ignore[arg-type]
    for rate, chunk in chunks:
        if result.first_audio_s is None:
            result.first_audio_s = time.perf_counter() - started[0]
        result.sample_rate = rate
        result.chunks.append(chunk)
    result.total_s = time.perf_counter() - started[0]


def write_wav(path: str, audio: np.ndarray, sample_rate: int) -> None:
    import wave

    with wave.open(path, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(audio.astype("<i2").tobytes())
