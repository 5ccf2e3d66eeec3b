"""The stream model with its phonemiser in worker processes (the GPU runtimes' default), on a
real Triton server: the same audio and the same errors as phonemising in the model process."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from engines.client.tts import StreamResult, SynthesisError, synthesize
from engines.commands.local_serving import local_server, plan_local_voices
from engines.pod.triton_server import TritonServer
from engines.pod.voice_host.process import HostOptions

pytestmark = pytest.mark.triton


@pytest.fixture(scope="module")
def workers_server(
    engine_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    plan = plan_local_voices(["joe"], engine_cache)
    triton = local_server(plan, work_dir=tmp_path_factory.mktemp("triton-workers"))
    # On the CPU the voice host phonemises in its own threads; two worker processes here, as
    # a GPU pod's host runs them.
    triton.host.options = HostOptions(frontend_workers=2)
    with triton.start():
        yield triton
    assert "phonemiser workers: 2" in triton.log_path.read_text(errors="replace")


def test_streams_phonemised_by_workers_match_the_model_process(
    workers_server: TritonServer, server: TritonServer
) -> None:
    text = "The workers phonemise. The model process streams!"
    params = {"noise_scale": 0.0, "noise_w": 0.0}
    by_workers = synthesize(workers_server.grpc_url, text, **params)
    in_process = synthesize(server.grpc_url, text, **params)
    assert by_workers.audio.shape == in_process.audio.shape
    assert np.abs(by_workers.audio).max() > 1000


def test_concurrent_streams_and_errors_through_workers(workers_server: TritonServer) -> None:
    results: list[StreamResult | Exception] = []

    def speak(n: int) -> None:
        try:
            results.append(synthesize(workers_server.grpc_url, f"Listener number {n} is here."))
        except Exception as error:  # reported by the assertion below
            results.append(error)

    talkers = [threading.Thread(target=speak, args=(n,)) for n in range(6)]
    for talker in talkers:
        talker.start()
    with pytest.raises(SynthesisError) as caught:
        synthesize(workers_server.grpc_url, "\u200b\u200d\u2060")  # nothing speakable
    for talker in talkers:
        talker.join(timeout=120)
    assert caught.value.code == "INVALID_ARGUMENT"
    assert "nothing to speak" in str(caught.value)
    assert len(results) == 6
    assert all(isinstance(r, StreamResult) and r.audio_seconds > 1 for r in results), results
