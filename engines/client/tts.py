"""Streaming client: text in, PCM chunks out, over Triton's gRPC streaming API.

`TtsClient` is one client for many streams, as a voice-agent worker or a benchmark process
holds one: it keeps a gRPC channel per pod of a voice and picks a pod per stream
(`engines.client.balancing`: the fewest of its own streams in flight), so that streams spread over
every ready pod, and a pod added by a scale-out takes new streams as soon as the client's
next lookup lists it. Give it the voice's headless Service (`<voice>-tts-pods.<ns>.svc:8001`,
which resolves to each ready pod that serves the voice; the client looks it up again every
`resolve_ttl_s`) or any `host:port` (one server, or a ClusterIP Service whose proxy picks a
pod per connection). A stream that a pod refuses before its first audio (RESOURCE_EXHAUSTED:
the pod is full; UNAVAILABLE: it is stopping or unreachable; NOT_FOUND: it no longer has the
voice) is sent to another pod, each pod at most once, within `max_attempts`; the client
counts those refusals, and the streams no pod took, apart from failures
(`TtsClient.balancer`).

`stream_tts` and `synthesize` are the one-stream forms (`voxfleet say`): a client for the
call, closed after it.

A finished stream is closed, not cancelled: Triton 2.51's gRPC frontend, asked to cancel a
stream whose final response it has not yet seen written, waits for a callback that never
comes and keeps the model referenced, so that a reload's old model never unloads (its stub
processes stay) and a shutdown waits out its exit timeout. The client keeps its half of the
stream open until the final response, then closes it and lets the server end the call; a
close the server does not answer within STREAM_CLOSE_TIMEOUT_S is cancelled after all.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from engines.client.balancing import (
    Balancer,
    NoEndpoints,
    ResolvedEndpoints,
    StreamRefused,
    resolve_endpoints,
    status_of,
    stream_balanced_sync,
)
from engines.client.wire import decode_response, speech_request
from engines.contract import names


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
# How often a client looks its address up again: a pod added by a scale-out gets streams
# this soon after its Service lists it, well within an HPA sync period (15 s by default).
RESOLVE_TTL_S = 2.0
# How often the channels of pods that left the answer are closed (once idle).
PRUNE_INTERVAL_S = 10.0
GRPC_OPTIONS = [
    *names.GRPC_CHANNEL_OPTIONS,
    # Connections of this client alone: gRPC otherwise shares one connection per address
    # among every channel of the process, so that clients meant to be separate listeners
    # would all ride the connection the first one opened.
    ("grpc.use_local_subchannel_pool", 1),
]


def _message_error(message: str) -> SynthesisError:
    """A per-request error of the stream (`[STATUS] text`, or Triton's own words)."""
    code, text = status_of(message)
    return SynthesisError(text, code)


def _call_error(error: Any) -> SynthesisError:
    """A failed gRPC call (its status), as a SynthesisError."""
    code = error.code() if callable(getattr(error, "code", None)) else None
    details = (error.details() if callable(getattr(error, "details", None)) else None) or str(error)
    status, text = status_of(details, code.name if code is not None else None)
    return SynthesisError(text, status)


def _code_of(error: BaseException) -> str | None:
    return error.code if isinstance(error, SynthesisError) else None


def client_endpoints(address: str) -> list[str]:
    """The servers behind `address`: each address its name resolves to (a headless Service's
    pods), or `address` itself where the name is one machine's own (`localhost`, whose IPv4
    and IPv6 addresses are one server) or does not resolve here (gRPC then says why)."""
    found = resolve_endpoints(address)
    hosts = [e.rpartition(":")[0].strip("[]") for e in found]
    if not found or all(ipaddress.ip_address(h).is_loopback for h in hosts):
        return [address]
    return found


def _close_call(call: Any, complete: bool, finished: threading.Event) -> None:
    """End a stream's call: let the server end a finished one (cancelled after
    STREAM_CLOSE_TIMEOUT_S if it does not), cancel an unfinished one at once."""
    finished.set()  # our half of the stream closes
    if not complete:
        call.cancel()
        return
    fallback = threading.Timer(STREAM_CLOSE_TIMEOUT_S, call.cancel)
    fallback.daemon = True
    fallback.start()
    try:
        call.code()  # blocks until the call has ended
    finally:
        fallback.cancel()


class TtsClient:
    """Many streams to the pods behind one address, a pod chosen per stream (module doc).

    Thread-safe: any number of threads may stream at once. `pods` replaces the DNS lookup
    with a function of the current endpoints (`host:port` each). Close it when done."""

    def __init__(
        self,
        address: str,
        *,
        pods: Callable[[], Sequence[str]] | None = None,
        balancer: Balancer | None = None,
        max_attempts: int = 3,
        resolve_ttl_s: float = RESOLVE_TTL_S,
    ) -> None:
        self.address = address
        self._pods = pods or ResolvedEndpoints(address, resolve_ttl_s, client_endpoints)
        self.balancer = balancer or Balancer(max_attempts=max_attempts)
        self._channels: dict[str, tuple[Any, Any]] = {}
        self._lock = threading.Lock()
        self._pruned_at = time.monotonic()
        self._closed = False

    def endpoints(self) -> list[str]:
        """The pods streams may go to now."""
        found = list(self._pods())
        if time.monotonic() - self._pruned_at > PRUNE_INTERVAL_S:
            self._prune(found)
        return found

    def refresh(self) -> list[str]:
        """Look the address up now (for a caller that waits for pods to appear)."""
        refresh = getattr(self._pods, "refresh", None)
        return list(refresh() if refresh is not None else self._pods())

    def _prune(self, keep: Sequence[str]) -> None:
        """Close the channels of pods no longer listed that have no stream in flight."""
        self._pruned_at = time.monotonic()
        busy = {e for e, c in self.balancer.counts().items() if c.in_flight}
        with self._lock:
            gone = [e for e in self._channels if e not in keep and e not in busy]
            closing = [self._channels.pop(e)[0] for e in gone]
        self.balancer.forget([*keep, *busy])
        for channel in closing:
            channel.close()

    def _stub(self, endpoint: str) -> Any:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        with self._lock:
            if self._closed:
                raise SynthesisError("the client is closed", "CANCELLED")
            entry = self._channels.get(endpoint)
            if entry is None:
                channel = grpc.insecure_channel(endpoint, options=GRPC_OPTIONS)
                entry = (channel, service_pb2_grpc.GRPCInferenceServiceStub(channel))
                self._channels[endpoint] = entry
            return entry[1]

    def _stream_from(
        self,
        endpoint: str,
        request: Any,
        deadline: float,
        timeout_s: float,
        on_sent: Callable[[], None] | None,
    ) -> Iterator[tuple[int, np.ndarray]]:
        import grpc

        stub = self._stub(endpoint)
        finished = threading.Event()

        def requests() -> Iterator[Any]:
            yield request
            # Keep our half of the stream open until the last response (module doc).
            finished.wait()

        if on_sent is not None:
            on_sent()
        late = SynthesisError(f"no audio within {timeout_s:.0f} s", "DEADLINE_EXCEEDED")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise late
        call = stub.ModelStreamInfer(requests(), timeout=remaining)
        complete = False
        try:
            for response in call:
                if response.error_message:
                    raise _message_error(response.error_message)
                chunk = decode_response(response.infer_response)
                # Set before the last chunk is handed out: a caller may stop there.
                complete = chunk.final
                if chunk.samples.size:
                    yield chunk.sample_rate, chunk.samples
                if complete:
                    return
            raise SynthesisError("the stream closed without a final response", "INTERNAL")
        except grpc.RpcError as error:
            failure = _call_error(error)
            raise (late if failure.code == "DEADLINE_EXCEEDED" else failure) from None
        finally:
            _close_call(call, complete, finished)

    def stream(
        self,
        text: str | bytes,
        voice: str = "joe",
        speaker_id: int | None = None,
        length_scale: float | None = None,
        noise_scale: float | None = None,
        noise_w: float | None = None,
        timeout_s: float = 120.0,
        on_sent: Callable[[], None] | None = None,
    ) -> Iterator[tuple[int, np.ndarray]]:
        """Yield (sample_rate, int16 chunk) as a pod sends them; raise SynthesisError (code
        RESOURCE_EXHAUSTED when every pod tried was full, UNAVAILABLE when none serves).

        `on_sent` is called once, just before the first attempt's request goes out, so that
        timings include any refusal on the way. `timeout_s` bounds the whole stream."""
        request = speech_request(
            voice,
            text,
            speaker_id=speaker_id,
            length_scale=length_scale,
            noise_scale=noise_scale,
            noise_w=noise_w,
        )
        deadline = time.monotonic() + timeout_s
        sent = [on_sent]

        def first_send() -> None:
            callback, sent[0] = sent[0], None
            if callback is not None:
                callback()

        def open_stream(endpoint: str) -> Iterator[tuple[int, np.ndarray]]:
            return self._stream_from(endpoint, request, deadline, timeout_s, first_send)

        chunks = stream_balanced_sync(self.balancer, voice, self.endpoints, open_stream, _code_of)
        try:
            yield from chunks
        except StreamRefused as refused:
            raise SynthesisError(str(refused), refused.code) from None
        except NoEndpoints as error:
            raise SynthesisError(f"{error} (at {self.address})", "UNAVAILABLE") from None
        finally:
            chunks.close()

    def synthesize(self, text: str | bytes, voice: str = "joe", **kwargs: Any) -> StreamResult:
        """Stream a whole text, timing first audio (from the first request sent) and the
        real-time factor."""
        return _collect(lambda on_sent: self.stream(text, voice, on_sent=on_sent, **kwargs))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
        for channel, _ in channels:
            channel.close()

    def __enter__(self) -> TtsClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


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
    """One stream from the pods behind `url`, through a client of its own (see `TtsClient`).

    `connect_timeout_s` > 0: while no pod can be reached (UNAVAILABLE before any audio: a
    Service whose endpoints lag its pods' readiness, a server still starting), look `url` up
    again and retry for that long, 0.1 s apart and doubling to 1 s. Nothing was spoken by a
    stream that failed so, so a retry never repeats speech."""
    wait_until = time.monotonic() + connect_timeout_s
    delay = 0.1
    with TtsClient(url) as client:
        while True:
            started = False
            try:
                for chunk in client.stream(
                    text,
                    voice,
                    speaker_id,
                    length_scale,
                    noise_scale,
                    noise_w,
                    timeout_s,
                    on_sent,
                ):
                    started = True
                    yield chunk
                return
            except SynthesisError as error:
                retry = not started and error.code == "UNAVAILABLE"
                if not retry or time.monotonic() + delay > wait_until:
                    if retry and connect_timeout_s > 0:
                        raise SynthesisError(
                            f"cannot reach {url} within {connect_timeout_s:g} s: {error}",
                            error.code,
                        ) from None
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            client.refresh()


# A stream refused by every pod tried (RESOURCE_EXHAUSTED, before any audio: each is full) is
# asked for again, after a fresh lookup, this long at most, waiting 0.1 s, then twice as long
# each time up to 1 s.
REFUSED_RETRY_S = 10.0


def synthesize(
    url: str,
    text: str | bytes,
    voice: str = "joe",
    refused_retry_s: float = REFUSED_RETRY_S,
    **kwargs: Any,
) -> StreamResult:
    """Stream a whole text, timing first audio and the real-time factor. A stream that every
    pod refuses before its first audio is asked for again for up to `refused_retry_s`
    (0: never); `StreamResult.refusals` counts those rounds of refusals."""
    deadline = time.monotonic() + refused_retry_s
    delay = 0.1
    refusals = 0
    while True:
        try:
            result = _collect(
                lambda on_sent: stream_tts(url, text, voice, on_sent=on_sent, **kwargs)
            )
        except SynthesisError as error:
            if error.code != "RESOURCE_EXHAUSTED":
                raise
            refusals += 1
            if time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            continue
        result.refusals = refusals
        return result


def _collect(
    open_stream: Callable[[Callable[[], None]], Iterator[tuple[int, np.ndarray]]],
) -> StreamResult:
    result = StreamResult()
    started = [time.perf_counter()]

    def sent() -> None:
        started[0] = time.perf_counter()

    for rate, chunk in open_stream(sent):
        if result.first_audio_s is None:
            result.first_audio_s = time.perf_counter() - started[0]
        result.sample_rate = rate
        result.chunks.append(chunk)
    result.total_s = time.perf_counter() - started[0]
    return result


def write_wav(path: str, audio: np.ndarray, sample_rate: int) -> None:
    import wave

    with wave.open(path, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(sample_rate)
        handle.writeframes(audio.astype("<i2").tobytes())
