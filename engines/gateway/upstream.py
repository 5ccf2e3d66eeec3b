"""One stream from one Triton endpoint over gRPC (ModelStreamInfer), and what an endpoint
serves (RepositoryIndex, ModelConfig): the gateway's only I/O towards the voices.

Channels are kept per endpoint, so that streams to a pod share one HTTP/2 connection. Errors
come out as `UpstreamError` with the gRPC status name: the call's own status where the call
failed, else the `[STATUS]` that leads the stream model's per-request error messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.client.balancing import status_of
from engines.client.wire import decode_response, speech_request
from engines.contract import names
from engines.gateway.errors import UpstreamError

# How long a finished stream's close may wait for the server to end it (then it is
# cancelled): cancelling a stream Triton (2.51) has not finished writing keeps its model
# referenced (engines.client.tts explains).
STREAM_CLOSE_TIMEOUT_S = 5.0
# How long a metadata call (index, config) may take.
METADATA_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Audio:
    """One chunk as a pod sent it: mono int16 samples at `sample_rate`."""

    samples: np.ndarray
    sample_rate: int


def error_of(message: str) -> UpstreamError:
    """An error message of the stream model (`[STATUS] text`), or Triton's own."""
    status, text = status_of(message, "INTERNAL")
    return UpstreamError(text, status)


def _call_error(error: Any) -> UpstreamError:
    code = error.code()
    status, text = status_of(error.details() or str(code), code.name if code is not None else None)
    return UpstreamError(text, status)


class Upstreams:
    """gRPC channels to the voices' endpoints, one per endpoint, made on first use."""

    def __init__(self) -> None:
        self._channels: dict[str, tuple[Any, Any]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def _stub(self, endpoint: str) -> Any:
        found = self._channels.get(endpoint)
        if found is None:
            import grpc
            from tritonclient.grpc import service_pb2_grpc

            channel = grpc.aio.insecure_channel(endpoint, options=names.GRPC_CHANNEL_OPTIONS)
            found = (channel, service_pb2_grpc.GRPCInferenceServiceStub(channel))
            self._channels[endpoint] = found
        return found[1]

    async def stream(
        self, endpoint: str, voice: str, text: str, length_scale: float | None = None
    ) -> AsyncIterator[Audio]:
        """The audio of `text` in `voice` from `endpoint`, chunk by chunk as it comes."""
        import grpc

        request = speech_request(voice, text, length_scale=length_scale)
        finished = asyncio.Event()

        async def requests() -> AsyncIterator[Any]:
            yield request
            # Our half stays open until the last response (see engines.bench.systems).
            await finished.wait()

        call = self._stub(endpoint).ModelStreamInfer(requests())
        complete = False
        try:
            async for response in call:
                if response.error_message:
                    raise error_of(response.error_message)
                chunk = decode_response(response.infer_response)
                complete = chunk.final
                if chunk.samples.size and chunk.sample_rate:
                    yield Audio(chunk.samples, chunk.sample_rate)
                if complete:
                    return
            raise UpstreamError("the stream closed without a final response", "UNAVAILABLE")
        except grpc.aio.AioRpcError as error:
            raise _call_error(error) from None
        finally:
            finished.set()
            if complete:
                # Let the server end the stream in the background: the listener's response
                # is not held for it.
                task = asyncio.ensure_future(self._close_finished(call))
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)
            else:
                call.cancel()

    @staticmethod
    async def _close_finished(call: Any) -> None:
        try:
            await asyncio.wait_for(call.code(), STREAM_CLOSE_TIMEOUT_S)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            call.cancel()
        except Exception:  # the stream ended anyway; nothing to tell anyone
            call.cancel()

    async def model_states(self, endpoint: str) -> dict[str, bool]:
        """The models in `endpoint`'s repository, each with whether it is READY now."""
        import grpc
        from tritonclient.grpc import service_pb2

        try:
            index = await self._stub(endpoint).RepositoryIndex(
                service_pb2.RepositoryIndexRequest(ready=False), timeout=METADATA_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise _call_error(error) from None
        states: dict[str, bool] = {}
        for model in index.models:
            states[model.name] = states.get(model.name, False) or model.state == "READY"
        return states

    async def speaking_rate(self, endpoint: str, voice: str) -> float:
        """The voice's speaking rate on `endpoint`: its serving plan's, in its model config."""
        import grpc
        from tritonclient.grpc import service_pb2

        try:
            answer = await self._stub(endpoint).ModelConfig(
                service_pb2.ModelConfigRequest(name=voice), timeout=METADATA_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as error:
            raise _call_error(error) from None
        parameter = answer.config.parameters.get(names.PLAN_PARAMETER)
        if parameter is None:
            return 1.0
        try:
            return float(json.loads(parameter.string_value).get("speaking_rate", 1.0))
        except (ValueError, TypeError, AttributeError):
            return 1.0

    def forget(self, keep: set[str]) -> None:
        """Close the channels of endpoints no longer in `keep` (pods gone)."""
        for endpoint in [e for e in self._channels if e not in keep]:
            channel, _ = self._channels.pop(endpoint)
            task = asyncio.ensure_future(channel.close(grace=STREAM_CLOSE_TIMEOUT_S))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels = [channel for channel, _ in self._channels.values()]
        self._channels.clear()
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(grace=1.0)
        for task in list(self._closing):
            task.cancel()
