"""`engines.client.tts.TtsClient` over real gRPC: one client spreads its streams over the pods it
is given, picks up a pod added later, and sends a stream a full pod refused to another one.

The pods are in-process gRPC servers that answer ModelStreamInfer as the stream model does
(audio responses, then an empty final-flagged one; or one `[RESOURCE_EXHAUSTED] ...` error
response), so that the client's own behaviour is tested without Triton (the e2e suite runs it
against real pods: e2e/test_scale_out.py)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from engines.client.tts import SynthesisError, TtsClient, stream_tts

FULL = "[RESOURCE_EXHAUSTED] this server is full: 8 live streams"
# What Triton itself answers for a model it is unloading (a pod on its way out).
GONE = "Request for unknown model: 'joe' has no available versions"


class FakePod(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, refuse: bool = False, error: str = FULL) -> None:
        self.refuse = refuse
        self.error = error
        self.streams = 0
        self.lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ModelStreamInfer(self, requests: Iterator[Any], context: Any) -> Iterator[Any]:
        request = next(requests)
        with self.lock:
            self.streams += 1
        if self.refuse:
            yield service_pb2.ModelStreamInferResponse(error_message=self.error)
            return
        for index in range(3):
            response = service_pb2.ModelInferResponse(model_name=request.model_name)
            audio = response.outputs.add()
            audio.name, audio.datatype = "AUDIO", "INT16"
            audio.shape.append(4)
            rate = response.outputs.add()
            rate.name, rate.datatype = "SAMPLE_RATE", "INT32"
            rate.shape.append(1)
            response.raw_output_contents.extend(
                [np.full(4, index, dtype="<i2").tobytes(), np.array([22050], "<i4").tobytes()]
            )
            yield service_pb2.ModelStreamInferResponse(infer_response=response)
        final = service_pb2.ModelInferResponse(model_name=request.model_name)
        final.parameters["triton_final_response"].bool_param = True
        yield service_pb2.ModelStreamInferResponse(infer_response=final)

    def ModelReady(self, request: Any, context: Any) -> Any:
        return service_pb2.ModelReadyResponse(ready=True)

    def stop(self) -> None:
        self.server.stop(grace=None)


@pytest.fixture
def pods() -> Iterator[list[FakePod]]:
    made = [FakePod(), FakePod(), FakePod(refuse=True)]
    yield made
    for pod in made:
        pod.stop()


def test_one_client_spreads_its_streams_over_the_pods_and_a_new_pod_takes_some(
    pods: list[FakePod],
) -> None:
    listed = [pods[0].endpoint]
    with TtsClient("joe-tts-pods.tts.svc:8001", pods=lambda: list(listed)) as client:
        for _ in range(4):
            assert client.synthesize("Hello.").audio.size == 12
        assert (pods[0].streams, pods[1].streams) == (4, 0)
        listed.append(pods[1].endpoint)  # a scale-out: the Service lists a second pod
        for _ in range(6):
            client.synthesize("Hello.")
    assert (pods[0].streams, pods[1].streams) == (7, 3)


def test_concurrent_streams_of_one_client_go_to_the_pod_with_fewer_in_flight(
    pods: list[FakePod],
) -> None:
    with TtsClient("x:1", pods=lambda: [pods[0].endpoint, pods[1].endpoint]) as client:
        held = [client.stream("Hello.") for _ in range(4)]
        for stream in held:
            next(stream)  # each stream is open, with its first chunk
        assert sorted(c.in_flight for c in client.balancer.counts().values()) == [2, 2]
        for stream in held:
            assert len(list(stream)) == 2
    assert (pods[0].streams, pods[1].streams) == (2, 2)


def test_a_full_pod_refuses_and_the_stream_is_spoken_by_another(pods: list[FakePod]) -> None:
    full, free = pods[2], pods[0]
    with TtsClient("x:1", pods=lambda: [full.endpoint, free.endpoint]) as client:
        results = [client.synthesize("Hello.") for _ in range(4)]
        counts = client.balancer.counts()
    assert all(r.audio.size == 12 for r in results)
    assert free.streams == 4 and full.streams >= 1
    assert counts[full.endpoint].refusals == full.streams
    assert client.balancer.refused_streams == 0


def test_when_every_pod_refuses_the_stream_is_refused_and_counted(pods: list[FakePod]) -> None:
    with TtsClient("x:1", pods=lambda: [pods[2].endpoint]) as client:
        with pytest.raises(SynthesisError) as refused:
            client.synthesize("Hello.")
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert client.balancer.refused_streams == 1


def test_a_pod_that_no_longer_has_the_voice_is_passed_over_by_client_and_bench(
    pods: list[FakePod],
) -> None:
    """A client's list of pods is seconds old: a pod that is stopping (its Triton unloading
    every model) is still in it, and its answer before any audio is Triton's own "unknown
    model". The stream goes to another pod rather than failing."""
    from engines.bench.systems import BalancedTritonSystem

    gone, free = FakePod(refuse=True, error=GONE), pods[0]
    try:
        listed = [gone.endpoint, free.endpoint]
        with TtsClient("x:1", pods=lambda: listed) as client:
            results = [client.synthesize("Hello.") for _ in range(4)]
        assert all(r.audio.size == 12 for r in results)

        async def bench() -> int:
            system = BalancedTritonSystem("voxfleet-pods", ",".join(listed), "joe")
            await system.connect()
            try:
                for _ in range(4):
                    assert [chunk async for chunk in system.open_stream("Hello.")]
                return system.balancer.counts()[gone.endpoint].refusals
            finally:
                await system.close()

        assert asyncio.run(bench()) >= 1
        assert gone.streams >= 2 and free.streams == 8
        # A voice no pod has is still an error that names it, with NOT_FOUND.
        with TtsClient("x:1", pods=lambda: [gone.endpoint]) as client:
            with pytest.raises(SynthesisError) as missing:
                client.synthesize("Hello.")
        assert missing.value.code == "NOT_FOUND"
        assert "unknown model: 'joe'" in str(missing.value)
    finally:
        gone.stop()


def test_stream_tts_names_a_server_that_cannot_be_reached() -> None:
    with pytest.raises(SynthesisError) as failed:
        list(stream_tts("127.0.0.1:9", "Hello.", connect_timeout_s=0.3))
    assert failed.value.code == "UNAVAILABLE"
    assert "cannot reach 127.0.0.1:9 within 0.3 s" in str(failed.value)


def test_the_bench_system_spreads_streams_and_counts_refusals_apart(
    pods: list[FakePod],
) -> None:
    from engines.bench.loadgen import run_closed_loop
    from engines.bench.stats import summarise_run
    from engines.bench.systems import BalancedTritonSystem

    async def run(endpoints: list[str], listeners: int) -> tuple[Any, Any]:
        system = BalancedTritonSystem("voxfleet-pods", ",".join(endpoints), "joe")
        try:
            await system.connect()
            sentences = iter(["Hello."] * 1000)
            load = await run_closed_loop(system.open_stream, sentences, listeners, 0.5)
            return summarise_run(system.name, listeners, load.records, load.wall_s), system
        finally:
            await system.close()

    spread, _ = asyncio.run(run([pods[0].endpoint, pods[1].endpoint], 4))
    assert spread.streams > 8 and spread.errors == 0 and spread.refused == 0
    total = pods[0].streams + pods[1].streams
    assert min(pods[0].streams, pods[1].streams) >= 0.4 * total
    refused, system = asyncio.run(run([pods[2].endpoint], 1))
    assert refused.streams == 0 and refused.errors == 0 and refused.refused > 0
    assert system.balancer.refused_streams == refused.refused
