"""Frames between the stream models and the voice host, over a Unix stream socket.

A frame is two big-endian 32-bit lengths, a JSON header of the first length and a binary
payload of the second (a chunk's int16 PCM; empty otherwise). A header's `op` says what it
is. Requests that are answered carry a `seq`, echoed by their `reply`; a stream's events
carry its `id`.

stream model -> host: load (plan), unload (handle), stream (id, handle, text, params,
received), cancel (id), stats (handle), memory.
host -> stream model: reply (seq, ok, ...), audio and last (id, PCM payload), chunks (ids,
samples, last: several streams' chunks of one vocoder call, their PCM one after another in
the payload), end (id, error, code).
"""

from __future__ import annotations

import json
import socket
import struct
from dataclasses import asdict
from typing import Any

from engines.streaming.types import SchedulerStats

_LENGTHS = struct.Struct("!II")
# A header is small; a payload is one chunk of audio (seconds of int16 PCM at most).
MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 1 << 26


class ProtocolError(ConnectionError):
    """The other side sent something that is not a frame, or hung up mid-frame."""


# Buffers one `sendmsg` takes at most (Linux's IOV_MAX).
MAX_BUFFERS = 1024


def _head(header: dict[str, Any], payload_bytes: int) -> bytes:
    """A frame's lengths and JSON header, the part before its payload."""
    raw = json.dumps(header, separators=(",", ":")).encode()
    return _LENGTHS.pack(len(raw), payload_bytes) + raw


def encode_frame(header: dict[str, Any], payload: bytes = b"") -> bytes:
    return _head(header, len(payload)) + payload


def frame_parts(header: dict[str, Any], payload: list[memoryview]) -> list[memoryview]:
    """A frame as buffers to write one after another (`send_buffers`): its lengths and header,
    then the payload's buffers as they are (bytes, `memoryview(...).cast("B")`), not copied."""
    return [memoryview(_head(header, sum(part.nbytes for part in payload))), *payload]


def send_buffers(sock: socket.socket, buffers: list[memoryview]) -> None:
    """Every byte of `buffers`, in order, with as few system calls as the socket takes
    (`sendmsg`, at most MAX_BUFFERS buffers a call): the kernel copies them, Python does not."""
    first = 0
    while first < len(buffers):
        sent = sock.sendmsg(buffers[first : first + MAX_BUFFERS])
        while sent:
            head = buffers[first]
            if sent >= head.nbytes:
                sent -= head.nbytes
                first += 1
            else:
                buffers[first] = head[sent:]
                sent = 0
        while first < len(buffers) and not buffers[first].nbytes:
            first += 1


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ProtocolError("the connection closed mid-frame" if chunks else "closed")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> tuple[dict[str, Any], bytes] | None:
    """The next frame, or None where the other side closed the connection between frames."""
    first = sock.recv(_LENGTHS.size)
    if not first:
        return None
    if len(first) < _LENGTHS.size:
        first += _read_exactly(sock, _LENGTHS.size - len(first))
    header_bytes, payload_bytes = _LENGTHS.unpack(first)
    if header_bytes > MAX_HEADER_BYTES or payload_bytes > MAX_PAYLOAD_BYTES:
        raise ProtocolError(f"a frame of {header_bytes} + {payload_bytes} bytes is not ours")
    try:
        header = json.loads(_read_exactly(sock, header_bytes))
    except ValueError as error:
        raise ProtocolError(f"a frame's header is not JSON: {error}") from None
    if not isinstance(header, dict) or "op" not in header:
        raise ProtocolError("a frame's header has no op")
    payload = _read_exactly(sock, payload_bytes) if payload_bytes else b""
    return header, payload


def stats_to_dict(stats: SchedulerStats) -> dict[str, Any]:
    """`stats` for the wire, taking its first-audio samples (each is sent once)."""
    samples = stats.first_audio_samples[:]
    del stats.first_audio_samples[: len(samples)]
    data = asdict(stats)
    data["first_audio_samples"] = samples
    data["vocoder_batches"] = {str(k): v for k, v in stats.vocoder_batches.items()}
    return data


def stats_from_dict(data: dict[str, Any]) -> SchedulerStats:
    values = dict(data)
    values["vocoder_batches"] = {
        int(k): int(v) for k, v in values.get("vocoder_batches", {}).items()
    }
    return SchedulerStats(**values)
