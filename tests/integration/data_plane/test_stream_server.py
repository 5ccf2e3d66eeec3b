"""The stream model on a real Triton server: streaming, bad input, cancellation, shutdown."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
import wave
from pathlib import Path

import numpy as np
import pytest
from supervised import running, serve_command

from engines.bench.profile import call_log_models, call_log_records
from engines.client.tts import StreamResult, SynthesisError, stream_tts, synthesize
from engines.pod.triton_server import TritonServer

pytestmark = pytest.mark.triton

LONG_TEXT = " ".join(
    f"This is sentence number {n} of a long reading that keeps the server busy." for n in range(8)
)


def metric(server: TritonServer, name: str) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=5) as response:
        text = response.read().decode()
    match = re.search(rf'^{name}\{{model="joe"\}} ([0-9.e+-]+)$', text, re.M)
    assert match, f"{name} is missing from Triton's metrics"
    return float(match.group(1))


def live_streams(server: TritonServer) -> float:
    return metric(server, "voxfleet_live_streams")


def say(*args: str) -> subprocess.CompletedProcess[bytes]:
    """`voxfleet say ARGS` as a user runs it; its output as bytes (`-o -` writes audio)."""
    return subprocess.run(
        [sys.executable, "-m", "engines.cli", "say", *args], capture_output=True, timeout=120
    )


def test_say_writes_a_wav_and_reports_json(server: TritonServer, tmp_path: Path) -> None:
    out = tmp_path / "hello.wav"
    completed = say("Hello from voxfleet.", "-o", str(out), "--url", server.grpc_url, "--json")
    assert completed.returncode == 0, completed.stderr
    report = json.loads(completed.stdout)
    assert set(report) == {"first_audio_ms", "chunks", "audio_seconds", "rtf", "refusals"}
    assert report["refusals"] == 0
    assert report["chunks"] >= 1 and 0 < report["first_audio_ms"] < 10_000
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 22050 and wav.getsampwidth() == 2
        seconds = wav.getnframes() / wav.getframerate()
    assert seconds == pytest.approx(report["audio_seconds"], abs=0.01)
    assert 0.5 < seconds < 5


def test_say_prints_the_servers_error_and_fails(server: TritonServer) -> None:
    completed = say("hi", "--voice", "nobody", "--url", server.grpc_url)
    assert completed.returncode != 0
    stderr = completed.stderr.decode()
    assert "nobody" in stderr and "NOT_FOUND" in stderr


class LateService:
    """A TCP front for `upstream` that, like a Service whose endpoint has not reached the
    proxy yet, accepts and at once closes every connection for its first `closed_s`, then
    forwards them."""

    def __init__(self, upstream: str, closed_s: float) -> None:
        host, _, port = upstream.rpartition(":")
        self.upstream = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.opens_at = time.monotonic() + closed_s
        self.refused = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            if time.monotonic() < self.opens_at:
                self.refused += 1
                conn.close()
                continue
            up = socket.create_connection(self.upstream)
            for a, b in ((conn, up), (up, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def test_say_waits_for_a_service_that_closes_connections_for_a_moment(
    server: TritonServer,
) -> None:
    late = LateService(server.grpc_url, closed_s=1.5)
    try:
        completed = say("Hello.", "-o", "-", "--url", late.url)
        refused = late.refused
    finally:
        late.close()
    assert completed.returncode == 0, completed.stderr
    assert refused >= 1, "the first connection should have been closed"
    assert len(completed.stdout) > 11025, "a quarter of a second of 16-bit audio at least"

    late = LateService(server.grpc_url, closed_s=60)
    try:
        started = time.monotonic()
        gave_up = say("Hello.", "-o", "-", "--url", late.url, "--connect-timeout", "1")
        waited = time.monotonic() - started
    finally:
        late.close()
    assert gave_up.returncode == 1
    assert f"cannot reach {late.url} within 1 s" in gave_up.stderr.decode()
    assert "UNAVAILABLE" in gave_up.stderr.decode()
    assert waited < 30


def test_audio_streams_in_several_chunks(server: TritonServer) -> None:
    result = synthesize(server.grpc_url, LONG_TEXT)
    assert len(result.chunks) > 5
    assert result.sample_rate == 22050
    assert result.first_audio_s is not None and result.first_audio_s < result.total_s / 3
    assert np.abs(result.audio).max() > 1000, "the voice should be audible, not silence"
    # Operators see the chunks that came late (a counter, per voice, on Triton's port).
    assert metric(server, "voxfleet_late_chunks_total") >= 0


def test_the_last_audio_chunk_is_the_final_response(server: TritonServer) -> None:
    # The end of a stream travels with its last chunk, not in an empty response after it: a
    # client that hangs up as soon as the last audio arrives then hangs up on a finished
    # request (the gap between the two crashed tritonserver 2.51; docs/reliability.md).
    import queue

    import tritonclient.grpc as grpcclient

    events: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = grpcclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Good morning, and welcome aboard."], dtype=object))
    client.start_stream(callback=lambda result, error: events.put((result, error)))
    try:
        client.async_stream_infer("joe", [text], enable_empty_final_response=True)
        responses = []
        while True:
            result, error = events.get(timeout=60)
            assert error is None, error
            final = result.get_response().parameters.get("triton_final_response")
            audio = result.as_numpy("AUDIO")
            responses.append((audio.size if audio is not None else 0, bool(final.bool_param)))
            if final.bool_param:
                break
        with pytest.raises(queue.Empty):
            events.get(timeout=1.0)  # nothing after the final response
    finally:
        client.stop_stream()
        client.close()
    assert len(responses) > 1
    assert all(size > 0 for size, _ in responses), responses
    assert [final for _, final in responses] == [False] * (len(responses) - 1) + [True]


def test_bad_input_is_refused_while_other_streams_go_on(server: TritonServer) -> None:
    background: dict[str, StreamResult | Exception] = {}

    def speak_long() -> None:
        try:
            background["result"] = synthesize(server.grpc_url, LONG_TEXT)
        except Exception as error:  # reported by the assertion below
            background["result"] = error

    talker = threading.Thread(target=speak_long)
    talker.start()
    cases = [
        ("", "joe", "INVALID_ARGUMENT", "empty"),
        (" \t\n ", "joe", "INVALID_ARGUMENT", "empty"),
        (b"caf\xc3(", "joe", "INVALID_ARGUMENT", "UTF-8"),
        ("a" * 5001, "joe", "INVALID_ARGUMENT", "5000 bytes"),
        ("Hello.", "nobody", "NOT_FOUND", "nobody"),
    ]
    for text, voice, code, words in cases:
        with pytest.raises(SynthesisError) as caught:
            synthesize(server.grpc_url, text, voice=voice)
        assert caught.value.code == code, (text[:20], str(caught.value))
        assert words in str(caught.value)
    # One byte under the limit is accepted: its first audio arrives.
    at_limit = ("Speak this. " * 500)[:4999]
    first = next(stream_tts(server.grpc_url, at_limit))
    assert first[1].size > 0
    talker.join(timeout=120)
    result = background["result"]
    assert isinstance(result, StreamResult), result
    assert result.audio_seconds > 10


def wait_for_gauge(server: TritonServer, done, timeout_s: float = 20) -> float:
    """The gauge is published a step after the fact (at most 0.25 s late): poll it."""
    deadline = time.monotonic() + timeout_s
    value = live_streams(server)
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.1)
        value = live_streams(server)
    return value


def test_a_cancelled_stream_leaves_nothing_behind(server: TritonServer) -> None:
    chunks = stream_tts(server.grpc_url, LONG_TEXT * 3)
    next(chunks)  # the stream is live and talking
    assert wait_for_gauge(server, lambda v: v >= 1) >= 1
    chunks.close()  # the client hangs up mid-stream
    assert wait_for_gauge(server, lambda v: v == 0) == 0
    # and the model still serves
    assert synthesize(server.grpc_url, "Still here.").audio_seconds > 0.3


def test_serve_stops_cleanly_on_ctrl_c(engine_cache: Path) -> None:
    command, ports = serve_command(str(engine_cache))
    with running(command, ports) as served:  # stopped (and its tree killed) even on failure
        assert synthesize(served.grpc_url, "Goodbye.").audio_seconds > 0.3
        served.process.send_signal(signal.SIGINT)
        assert served.process.wait(timeout=60) == 0
    assert "Traceback" not in "".join(served.output)


def test_the_call_log_says_where_the_scheduler_threads_time_went(engine_cache: Path) -> None:
    """VOXFLEET_COSTS_LOG_S: the server log's call totals carry the scheduler thread's steps,
    its CPU time and its wall time by part of the step, and the new streams' first-audio path,
    for profiling runs. A voice served as two instances still writes one series, named after
    the voice: both instances' streams run on the voice host's one scheduler."""
    command, ports = serve_command(str(engine_cache))
    with running(
        [*command, "--instances", "2"], ports, env={"VOXFLEET_COSTS_LOG_S": "0.5"}
    ) as served:
        assert synthesize(served.grpc_url, "Hello from voxfleet. Twice.").audio_seconds > 0.5

        def scheduler() -> dict | None:
            """The last report of a scheduler that has run a step."""
            records = call_log_records("".join(served.output))
            stepped = [r["scheduler"] for _, r in records if r["scheduler"]["steps"] > 0]
            return stepped[-1] if stepped else None

        assert served.wait_for(lambda: scheduler() is not None, 30) is not None
        report = scheduler()
        assert report is not None
        models = call_log_models("".join(served.output))
        assert models == ["joe"], models
        parts = ("prepare", "plan", "windows", "encode", "publish", "wait", "idle")
        assert {f"{part}_s" for part in parts} <= set(report)
        assert report["cpu_s"] > 0 and report["windows_s"] > 0 and report["encode_s"] > 0

        # And where the stream's first audio went, from the request on (the phonemiser first).
        def paths() -> list[dict]:
            return [
                record["first_audio_ms"]
                for _, record in call_log_records("".join(served.output))
                if record.get("first_audio_ms", {}).get("n")
            ]

        assert served.wait_for(lambda: paths() or None, 30) is not None
        time.sleep(1.0)  # two more intervals: the stream's first audio is counted once
        found = paths()
        assert [path["n"] for path in found] == [1], found
        assert found[0]["frontend"][0] > 0 and found[0]["total"][0] >= found[0]["frontend"][0]


def test_say_asks_again_when_a_full_server_refuses_and_counts_it(server, monkeypatch) -> None:
    """A full server refuses a new stream at once (RESOURCE_EXHAUSTED): the client asks again
    over a new connection until it is taken, and says how many times it was refused."""
    from engines.client import tts as client

    calls = {"n": 0}
    real = client.stream_tts

    def refused_twice(url, text, voice, **kwargs):
        calls["n"] += 1
        if calls["n"] <= 2:
            raise client.SynthesisError("this server is full: ...", "RESOURCE_EXHAUSTED")
        yield from real(url, text, voice, **kwargs)

    monkeypatch.setattr(client, "stream_tts", refused_twice)
    result = client.synthesize(server.grpc_url, "Third time lucky.", refused_retry_s=5)
    assert result.refusals == 2 and result.audio_seconds > 0.3
    calls["n"] = 0
    with pytest.raises(client.SynthesisError) as refused:
        client.synthesize(server.grpc_url, "Never.", refused_retry_s=0)
    assert refused.value.code == "RESOURCE_EXHAUSTED" and calls["n"] == 1
