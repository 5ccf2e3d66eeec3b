"""A vocoder call's chunks leave the voice host in one message per stream model: the delivery
thread groups them by the connection their streams came in on, and the stream model's client
hands each stream its own chunk, in order, the last one as the last."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

import numpy as np

from engines.pod.voice_host.client import HostClient
from engines.pod.voice_host.server import _Connection
from engines.streaming.delivery import AudioDelivery, LaunchedCall
from engines.streaming.types import Stream, StreamSink, SynthesisParams


class Recorded(StreamSink):
    def __init__(self) -> None:
        self.chunks: list[tuple[str, np.ndarray]] = []
        self.got = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        self.chunks.append(("audio", np.array(pcm)))
        self.got.set()

    def last_audio(self, pcm: np.ndarray) -> None:
        self.chunks.append(("last", np.array(pcm)))
        self.got.set()

    def finish(self, error: Exception | None = None) -> None:
        return None


class Receiver:
    def __init__(self) -> None:
        self.messages: list[list[tuple[Any, np.ndarray, bool]]] = []

    def send_chunks(self, chunks: list[tuple[Any, np.ndarray, bool]]) -> None:
        self.messages.append(chunks)


class Routed(Recorded):
    def __init__(self, receiver: Receiver, key: int) -> None:
        super().__init__()
        self.route = (receiver, key)

    def chunk_route(self):
        return self.route


class Done:
    def __init__(self, pcm: np.ndarray) -> None:
        self.pcm = pcm

    def result(self) -> tuple[np.ndarray, float]:
        return self.pcm, 0.001


def test_a_calls_chunks_go_out_as_one_message_per_connection() -> None:
    first, second = Receiver(), Receiver()
    sinks = [Routed(first, 1), Routed(second, 7), Routed(first, 2), Recorded()]
    streams = [Stream(i, [], SynthesisParams(), sink, 0.0) for i, sink in enumerate(sinks)]
    pcm = np.arange(4 * 10, dtype=np.int16).reshape(4, 10)
    delivered = threading.Event()
    delivery = AudioDelivery(lambda *_: None, lambda *_: delivered.set())
    delivery.start()
    try:
        windows = [(s, row, 10 - row, row == 0, row == 2) for row, s in enumerate(streams)]
        delivery.audio(LaunchedCall(Done(pcm), windows, 10))
        assert delivered.wait(5)
        assert sinks[3].got.wait(5)
    finally:
        delivery.stop()
    (message,) = first.messages
    assert [(key, last) for key, _, last in message] == [(1, False), (2, True)]
    assert np.array_equal(message[1][1], pcm[2, :8])
    (other,) = second.messages
    assert other[0][0] == 7 and np.array_equal(other[0][1], pcm[1, :9])
    assert sinks[3].chunks[0][0] == "audio"  # a sink with no route gets its chunk itself


def test_the_stream_models_client_splits_a_message_of_chunks_back_into_streams(
    tmp_path: Path,
) -> None:
    path = tmp_path / "host.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(server.accept()[0]), daemon=True).start()
    client = HostClient(path)
    try:
        for _ in range(100):
            if accepted:
                break
            threading.Event().wait(0.05)
        connection = _Connection(None, accepted[0])  # type: ignore[arg-type]
        sinks = {3: Recorded(), 4: Recorded()}
        client._streams.update(sinks)
        one, two = np.arange(5, dtype=np.int16), np.arange(100, 103, dtype=np.int16)
        # Stream 4 has two consecutive windows in the call (planner.fill_with_next_windows),
        # the second its last: only that one ends it.
        connection.send_chunks([(3, one, False), (4, one, False), (4, two, True), (3, two, False)])
        assert sinks[4].got.wait(5)
        for _ in range(100):
            if len(sinks[3].chunks) == 2:
                break
            threading.Event().wait(0.05)
        assert [kind for kind, _ in sinks[3].chunks] == ["audio", "audio"]
        assert np.array_equal(sinks[3].chunks[0][1], one)
        assert np.array_equal(sinks[3].chunks[1][1], two)
        assert [kind for kind, _ in sinks[4].chunks] == ["audio", "last"]
        assert np.array_equal(sinks[4].chunks[0][1], one)
        assert np.array_equal(sinks[4].chunks[1][1], two)
    finally:
        client.close()
        server.close()


class Trickle:
    """A socket whose kernel takes at most `most` bytes a call, as one does when the other
    end reads slowly and its buffer is full."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.received = bytearray()
        self.calls = 0

    def sendmsg(self, buffers: list[memoryview]) -> int:
        assert len(buffers) <= 1024, "more buffers than one sendmsg takes"
        self.calls += 1
        taken = 0
        for buffer in buffers:
            part = bytes(buffer[: self.most - taken])
            self.received += part
            taken += len(part)
            if taken == self.most:
                break
        return taken


def test_every_byte_of_a_frame_arrives_in_order_when_the_socket_takes_a_little_at_a_time() -> None:
    """The writer hands the rows' own memory to the kernel: a partial write goes on from
    where it stopped, and a frame of more chunks than one call takes is sent in several."""
    from engines.pod.voice_host.protocol import frame_parts, send_buffers

    rows = np.arange(3000 * 40, dtype=np.int16).reshape(3000, 40)
    chunks = [memoryview(row.tobytes()) for row in rows] + [memoryview(b"")]
    frame = frame_parts({"op": "chunks", "ids": list(range(3000))}, chunks)
    expected = b"".join(bytes(part) for part in frame)
    for most in (7, 4096, len(expected)):
        sock = Trickle(most)
        send_buffers(sock, list(frame))  # type: ignore[arg-type]
        assert bytes(sock.received) == expected
        assert sock.calls >= len(expected) // most


def test_a_sinks_pcm_goes_out_as_int16_whatever_it_was_given(tmp_path: Path) -> None:
    """A chunk that is not contiguous int16 (a column cut, a wider integer type) is sent as
    the same samples in int16, as before."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    received = bytearray()

    def drain() -> None:
        while chunk := theirs.recv(1 << 16):
            received.extend(chunk)

    reader = threading.Thread(target=drain)
    reader.start()
    connection = _Connection(host=None, sock=ours)  # type: ignore[arg-type]
    wide = np.arange(200, dtype=np.int32).reshape(10, 20)
    connection.send_chunks([(1, wide[:, 3], False), (2, wide[4], True)])
    connection._out.put(None)
    connection._writer.join()
    ours.shutdown(socket.SHUT_WR)
    reader.join(10)
    ours.close()
    theirs.close()
    payload = bytes(received[-60:])
    assert np.frombuffer(payload[:20], dtype=np.int16).tolist() == wide[:, 3].tolist()
    assert np.frombuffer(payload[20:], dtype=np.int16).tolist() == wide[4].tolist()
