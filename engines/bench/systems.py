"""The systems under test, each behind the load generator's `StreamOpener` interface.

- `piper`: piper-tts in this process, one full sentence per request, one thread per stream;
  its single chunk arrives when the whole sentence is ready.
- `triton-naive`: a non-streaming model behind Triton (unary gRPC ModelInfer, one response).
- `voxfleet`, `voxfleet-nobatch`, `voxfleet-paced`: the decoupled stream model over gRPC
  ModelStreamInfer, one stream per request, every response a chunk, ended by the empty
  final-flagged response (`voxfleet-paced`: a server with a lead limit).
- `voxfleet-pods`: the same stream model on every pod of a voice (its headless Service, or a
  list of servers), a pod picked per stream by `engines.client.balancing` over a connection per pod,
  and a stream a full pod refuses sent to another (`BalancedTritonSystem`). With
  `--client-processes N` each client process balances on its own over its own connections,
  as separate listener processes with long-lived connections would; with one process, one
  client holds the connections of every listener.

The Triton clients speak gRPC through `grpc.aio` and Triton's generated stubs, so that dozens of
concurrent streams share one event loop and one connection.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engines.bench.resources import ProcessTree, find_listening_process, own_process, pod_of
from engines.client.balancing import (
    Balancer,
    NoEndpoints,
    ResolvedEndpoints,
    StreamRefused,
    status_of,
    stream_balanced,
)
from engines.client.tts import PRUNE_INTERVAL_S, STREAM_CLOSE_TIMEOUT_S, client_endpoints
from engines.client.wire import decode_response, speech_request
from engines.contract import names

# Audio responses of long sentences exceed gRPC's 4 MiB default only for unusually long text,
# but a benchmark should never fail on a limit the server does not have.
_GRPC_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


class BenchSystemError(RuntimeError):
    """A system that cannot be benchmarked as configured (server down, model missing), or a
    stream that failed; `code` is the gRPC status name where one is known."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


class PiperSystem:
    """piper-tts as people use it: `PiperVoice` in-process, threads for concurrency."""

    name = "piper"
    streaming = False

    def __init__(self, model_path: str) -> None:
        from piper import PiperVoice

        self._voice = PiperVoice.load(model_path)
        self._pool: ThreadPoolExecutor | None = None

    @property
    def sample_rate(self) -> int:
        return int(self._voice.config.sample_rate)

    def synthesize(self, text: str) -> int:
        """Samples of a whole synthesis (every sentence of `text`)."""
        return sum(len(chunk.audio_float_array) for chunk in self._voice.synthesize(text))

    async def prepare(self, concurrency: int) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="piper")

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        if self._pool is None:
            raise BenchSystemError("piper: prepare(concurrency) was not called")
        loop = asyncio.get_running_loop()
        samples = await loop.run_in_executor(self._pool, self.synthesize, text)
        yield samples, self.sample_rate

    def server(self) -> ProcessTree | None:
        return own_process()

    async def batch_counts(self) -> dict[str, dict[int, int]]:
        return {}

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class TritonSystem:
    """A model behind a running tritonserver, streamed (decoupled) or unary."""

    def __init__(
        self, name: str, url: str, model: str, streaming: bool, metrics_url: str | None = None
    ) -> None:
        self.name = name
        self.url = url
        self.model = model
        self.streaming = streaming
        self.metrics_url = metrics_url
        self._channel: Any = None
        self._stub: Any = None
        self._shape: list[int] = [1]

    def client_spec(self) -> tuple[type[TritonSystem], dict[str, Any]]:
        """How another client process makes this system (engines/bench/clients.py)."""
        return type(self), {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "streaming": self.streaming,
            "metrics_url": self.metrics_url,
        }

    async def connect(self, ready_timeout_s: float = 10.0) -> None:
        import grpc
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        self._channel = grpc.aio.insecure_channel(self.url, options=_GRPC_OPTIONS)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        try:
            ready = await self._stub.ModelReady(
                service_pb2.ModelReadyRequest(name=self.model), timeout=ready_timeout_s
            )
            metadata = await self._stub.ModelMetadata(
                service_pb2.ModelMetadataRequest(name=self.model), timeout=ready_timeout_s
            )
        except grpc.aio.AioRpcError as error:
            raise BenchSystemError(
                f"{self.name}: cannot reach model {self.model!r} at {self.url}: "
                f"{error.code().name} {error.details()}"
            ) from error
        if not ready.ready:
            raise BenchSystemError(f"{self.name}: model {self.model!r} at {self.url} is not ready")
        inputs = {tensor.name: list(tensor.shape) for tensor in metadata.inputs}
        if names.TEXT not in inputs:
            raise BenchSystemError(
                f"{self.name}: model {self.model!r} has no {names.TEXT} input "
                f"(inputs: {sorted(inputs)})"
            )
        # A model with a batch dimension reports TEXT as [-1, 1]; one request is then [1, 1].
        self._shape = [1, 1] if len(inputs[names.TEXT]) == 2 else [1]

    async def server_version(self) -> str:
        from tritonclient.grpc import service_pb2

        metadata = await self._stub.ServerMetadata(service_pb2.ServerMetadataRequest())
        return str(metadata.version)

    async def prepare(self, concurrency: int) -> None:
        if self._stub is None:
            await self.connect()

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        if self.streaming:
            async for chunk in self._stream(text):
                yield chunk
        else:
            request = speech_request(
                self.model, text, request_id="", text_shape=self._shape, final_response=False
            )
            answer = decode_response(await self._stub.ModelInfer(request))
            yield answer.samples.size, answer.sample_rate

    async def _stream(
        self, text: str, model: str | None = None, stub: Any = None
    ) -> AsyncIterator[tuple[int, int]]:
        import grpc

        request = speech_request(model or self.model, text, request_id="", text_shape=self._shape)
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield request
            # Keep our half of the stream open until the last response: closing it early is
            # legal gRPC, but would leave the stream's lifetime to the server's reading of it.
            await finished.wait()

        call = (stub or self._stub).ModelStreamInfer(requests())
        complete = False
        try:
            async for response in call:
                if response.error_message:
                    message = response.error_message
                    raise BenchSystemError(message, status_of(message)[0])
                chunk = decode_response(response.infer_response)
                if chunk.samples.size:
                    yield chunk.samples.size, chunk.sample_rate
                if chunk.final:
                    complete = True
                    return
            raise BenchSystemError("the stream closed without a final response")
        except grpc.aio.AioRpcError as error:
            code = error.code()
            name = code.name if code is not None else None
            raise BenchSystemError(f"[{name}] {error.details()}", name) from None
        finally:
            finished.set()
            if complete:
                # Close our half and let the server end the stream: cancelling a finished
                # stream left Triton (2.51) holding the model at shutdown for its 30 s timeout.
                try:
                    await asyncio.wait_for(call.code(), STREAM_CLOSE_TIMEOUT_S)
                except (asyncio.TimeoutError, asyncio.CancelledError):
                    call.cancel()
            else:
                call.cancel()

    def server(self) -> ProcessTree | None:
        host, _, port = self.url.rpartition(":")
        if host not in ("localhost", "127.0.0.1", "[::1]", "::1", "0.0.0.0", ""):
            return None
        tree = find_listening_process(int(port))
        return pod_of(tree) if tree is not None else None

    async def _model_stats(self) -> Any:
        """Triton's statistics of every model (its ModelStatistics call)."""
        from tritonclient.grpc import service_pb2

        statistics = await self._stub.ModelStatistics(service_pb2.ModelStatisticsRequest())
        return statistics.model_stats

    async def batch_counts(self) -> dict[str, dict[int, int]]:
        """Cumulative executions per batch size, per model: Triton's own statistics, plus the
        vocoder batches a stream model reports on the metrics port (see engines.bench.metrics)."""
        counts: dict[str, dict[int, int]] = {}
        for model in await self._model_stats():
            sizes = {int(b.batch_size): int(b.compute_infer.count) for b in model.batch_stats}
            if sizes:
                counts[model.name] = sizes
        if self.metrics_url:
            from engines.bench.metrics import fetch_batch_counts

            counts.update(await asyncio.to_thread(fetch_batch_counts, self.metrics_url))
        return counts

    async def queue_totals(self) -> dict[str, tuple[int, int]]:
        """(requests, nanoseconds) each model's requests have waited so far in Triton's queue,
        before a model instance took them (Triton's statistics)."""
        queues = {model.name: model.inference_stats.queue for model in await self._model_stats()}
        return {name: (int(queue.count), int(queue.ns)) for name, queue in queues.items()}

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._stub = None


def popularity_weights(count: int, popularity: str) -> list[float]:
    """Each of `count` voices' share of the streams: `even`, or `zipf:S` (the k-th voice
    weighted 1/k^S); ValueError for anything else."""
    if popularity == "even":
        return [1.0 / count] * count
    kind, _, exponent = popularity.partition(":")
    try:
        value = float(exponent)
    except ValueError:
        value = math.nan
    if kind != "zipf" or not value > 0:
        raise ValueError(f"popularity is even or zipf:S with S > 0, not {popularity!r}")
    raw = [1.0 / (k**value) for k in range(1, count + 1)]
    total = sum(raw)
    return [w / total for w in raw]


class SpreadTritonSystem(TritonSystem):
    """Streams spread over several voices (stream models) of one server, each stream's voice
    drawn by `popularity` (lab/packing.py): the load of a pod that serves many."""

    def __init__(
        self,
        name: str,
        url: str,
        models: Sequence[str],
        popularity: str = "even",
        seed: int = 0,
        metrics_url: str | None = None,
    ) -> None:
        super().__init__(name, url, models[0], True, metrics_url)
        self.models = list(models)
        self.popularity = popularity
        self.seed = seed
        self._weights = popularity_weights(len(self.models), popularity)
        # Each client process draws its own sequence (engines/bench/clients.py makes one
        # system per process from `client_spec`).
        self._random = random.Random(seed ^ os.getpid())
        self.picked: dict[str, int] = {}

    def client_spec(self) -> tuple[type[TritonSystem], dict[str, Any]]:
        return type(self), {
            "name": self.name,
            "url": self.url,
            "models": self.models,
            "popularity": self.popularity,
            "seed": self.seed,
            "metrics_url": self.metrics_url,
        }

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        model = self._random.choices(self.models, self._weights)[0]
        self.picked[model] = self.picked.get(model, 0) + 1
        async for chunk in self._stream(text, model):
            yield chunk


def _code_of(error: BaseException) -> str | None:
    return error.code if isinstance(error, BenchSystemError) else None


class BalancedTritonSystem(TritonSystem):
    """The stream model on every pod behind `url` (see the module docstring): a channel per
    pod, a pod chosen per stream, refusals retried on another pod within `max_attempts`.

    `url` is a name resolved again every `resolve_ttl_s` (a voice's headless Service,
    `joe-tts-pods.<ns>.svc:8001`) or a comma-separated list of `host:port`; `pods` replaces
    either with a function of the current endpoints (one process only)."""

    def __init__(
        self,
        name: str,
        url: str,
        model: str,
        pods: Callable[[], Sequence[str]] | None = None,
        max_attempts: int = 3,
        resolve_ttl_s: float = 2.0,
    ) -> None:
        super().__init__(name, url, model, streaming=True)
        self.max_attempts = max_attempts
        self.resolve_ttl_s = resolve_ttl_s
        if pods is not None:
            self._pods: Callable[[], Sequence[str]] = pods
        elif "," in url:
            fixed = [part.strip() for part in url.split(",") if part.strip()]
            self._pods = lambda: fixed
        else:
            self._pods = ResolvedEndpoints(url, resolve_ttl_s, client_endpoints)
        self.balancer = Balancer(max_attempts=max_attempts)
        self._channels: dict[str, tuple[Any, Any]] = {}
        self._pruned_at = time.monotonic()
        self._closing: set[asyncio.Future[Any]] = set()

    def client_spec(self) -> tuple[type[TritonSystem], dict[str, Any]]:
        return type(self), {
            "name": self.name,
            "url": self.url,
            "model": self.model,
            "max_attempts": self.max_attempts,
            "resolve_ttl_s": self.resolve_ttl_s,
        }

    def _stub_of(self, endpoint: str) -> Any:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        entry = self._channels.get(endpoint)
        if entry is None:
            channel = grpc.aio.insecure_channel(
                endpoint, options=[*_GRPC_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
            )
            entry = self._channels[endpoint] = (
                channel,
                service_pb2_grpc.GRPCInferenceServiceStub(channel),
            )
        return entry[1]

    async def connect(self, ready_timeout_s: float = 10.0) -> None:
        """Check that some pod serves the model (every listed pod is tried)."""
        from tritonclient.grpc import service_pb2

        endpoints = list(await asyncio.to_thread(self._pods))
        if not endpoints:
            raise BenchSystemError(f"{self.name}: no pod behind {self.url} serves now")
        failures = []
        for endpoint in endpoints:
            try:
                ready = await self._stub_of(endpoint).ModelReady(
                    service_pb2.ModelReadyRequest(name=self.model), timeout=ready_timeout_s
                )
            except Exception as error:
                failures.append(f"{endpoint}: {error}")
                continue
            if ready.ready:
                self._stub = self._stub_of(endpoint)
                return
            failures.append(f"{endpoint}: model {self.model!r} not ready")
        raise BenchSystemError(f"{self.name}: no pod serves {self.model!r}: {'; '.join(failures)}")

    async def prepare(self, concurrency: int) -> None:
        if self._stub is None:
            await self.connect()

    def endpoints(self) -> list[str]:
        """The pods a stream may go to now; the channels of pods that left (and have nothing
        in flight) are closed now and then."""
        found = list(self._pods())
        if time.monotonic() - self._pruned_at > PRUNE_INTERVAL_S:
            self._pruned_at = time.monotonic()
            busy = {e for e, c in self.balancer.counts().items() if c.in_flight}
            for endpoint in [e for e in self._channels if e not in found and e not in busy]:
                channel, _ = self._channels.pop(endpoint)
                closing = asyncio.ensure_future(channel.close())
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
            self.balancer.forget([*found, *busy])
        return found

    async def open_stream(self, text: str) -> AsyncIterator[tuple[int, int]]:
        def open_one(endpoint: str) -> AsyncIterator[tuple[int, int]]:
            return self._stream(text, stub=self._stub_of(endpoint))

        chunks = stream_balanced(self.balancer, self.model, self.endpoints, open_one, _code_of)
        try:
            async for chunk in chunks:
                yield chunk
        except StreamRefused as refused:
            raise BenchSystemError(f"[{refused.code}] {refused}", refused.code) from None
        except NoEndpoints as error:
            raise BenchSystemError(f"[UNAVAILABLE] {error}", "UNAVAILABLE") from None
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    def server(self) -> ProcessTree | None:
        return None  # several servers: their resources are not this client's to read

    async def batch_counts(self) -> dict[str, dict[int, int]]:
        return {}

    async def queue_totals(self) -> dict[str, tuple[int, int]]:
        return {}

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel, _ in channels:
            await channel.close()
        self._stub = None
