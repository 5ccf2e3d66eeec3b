"""The voice host on a Unix socket: `python -m engines.pod.voice_host --socket PATH`.

Each stream model (one Triton model instance of one voice) holds one connection. A
connection's reader thread takes its requests; what goes back (replies, audio, stream ends)
is queued and written by a thread of its own, so that the scheduler never waits on a socket.
A connection that closes (its stream model was unloaded, or died) takes its voices and
streams with it: the streams are cancelled and the voices unloaded once those have ended.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np

from engines.contract.plan import ServingPlan
from engines.pod.voice_host.host import (
    MIB,
    LoadRefused,
    StreamRefused,
    VoiceHost,
)
from engines.pod.voice_host.protocol import (
    ProtocolError,
    frame_parts,
    read_frame,
    send_buffers,
    stats_to_dict,
)
from engines.streaming import StreamCancelled, StreamSink, SynthesisParams
from engines.streaming.threads import NamedThread

LOGGER = logging.getLogger("voxfleet.host")
# Frames written in one go by a connection's writer, at most.
WRITE_BATCH = 64
# Seconds a stopped host (SIGTERM, SIGINT) gives its streams to end before it exits.
STOP_GRACE_S = 3.0


def error_code(error: BaseException) -> str:
    """The gRPC status name an error stands for (INTERNAL where it names none)."""
    code = getattr(error, "code", None) or getattr(error, "status", None)
    return code if isinstance(code, str) else "INTERNAL"


class _Connection:
    def __init__(self, host: VoiceHost, sock: socket.socket) -> None:
        self.host = host
        self.sock = sock
        self.handles: set[int] = set()
        self.streams: dict[int, _RemoteSink] = {}
        self.closed = False
        self._lock = threading.Lock()
        self._out: queue.SimpleQueue[list[memoryview] | None] = queue.SimpleQueue()
        self._writer = NamedThread(target=self._write, name="voxfleet-host-write", daemon=True)
        self._writer.start()

    # -- writing -------------------------------------------------------------------------------
    def send(self, header: dict[str, Any], pcm: np.ndarray | None = None) -> None:
        if not self.closed:
            self._out.put(frame_parts(header, [] if pcm is None else [_pcm_buffer(pcm)]))

    def send_chunks(self, chunks: list[tuple[Any, np.ndarray, bool]]) -> None:
        """Several streams' chunks in one frame (`chunks`): their ids, sample counts and last
        flags in the header, their PCM one after another in the payload. The PCM is not
        copied here: the writer hands the rows' own memory to the kernel."""
        if self.closed or not chunks:
            return
        header = {
            "op": "chunks",
            "ids": [key for key, _, _ in chunks],
            "samples": [len(pcm) for _, pcm, _ in chunks],
            "last": [key for key, _, last in chunks if last],
        }
        self._out.put(frame_parts(header, [_pcm_buffer(pcm) for _, pcm, _ in chunks]))

    def _write(self) -> None:
        while True:
            frame = self._out.get()
            if frame is None:
                return
            buffers = list(frame)
            for _ in range(WRITE_BATCH - 1):
                try:
                    more = self._out.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._out.put(None)
                    break
                buffers.extend(more)
            try:
                send_buffers(self.sock, buffers)
            except OSError:
                self.closed = True  # the reader sees the close and cleans up

    # -- reading -------------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            while True:
                frame = read_frame(self.sock)
                if frame is None:
                    break
                self._dispatch(*frame)
        except (OSError, ProtocolError) as error:
            LOGGER.debug("a stream model's connection ended: %s", error)
        finally:
            self._close()

    def _reply(self, request: dict[str, Any], **fields: Any) -> None:
        self.send({"op": "reply", "seq": request.get("seq"), "ok": True, **fields})

    def _refuse(self, request: dict[str, Any], error: BaseException) -> None:
        self.send(
            {
                "op": "reply",
                "seq": request.get("seq"),
                "ok": False,
                "error": str(error),
                "code": error_code(error),
            }
        )

    def _dispatch(self, request: dict[str, Any], payload: bytes) -> None:
        op = request["op"]
        if op == "stream":
            self._stream(request)
        elif op == "cancel":
            sink = self.streams.get(int(request.get("id", -1)))
            if sink is not None:
                sink.cancel()
        elif op == "load":
            # A first voice waits for its architecture's warmup (minutes on a GPU): the
            # connection keeps reading meanwhile.
            NamedThread(
                target=self._load, args=(request,), name="voxfleet-host-load", daemon=True
            ).start()
        elif op == "unload":
            handle = int(request.get("handle", -1))
            with self._lock:
                self.handles.discard(handle)
            self.host.unload(handle)
            self._reply(request)
        elif op == "stats":
            self._reply(request, stats=stats_to_dict(self.host.stats(int(request["handle"]))))
        elif op == "memory":
            self._reply(request, memory=self.host.memory().to_dict())
        else:
            self._refuse(request, ValueError(f"unknown op {op!r}"))

    def _load(self, request: dict[str, Any]) -> None:
        try:
            plan = ServingPlan.from_dict(request["plan"])
            handle = self.host.load(plan)
        except LoadRefused as error:
            self._refuse(request, error)
            return
        except (KeyError, ValueError) as error:
            self._refuse(request, LoadRefused(f"not a serving plan: {error}", "INVALID_ARGUMENT"))
            return
        except Exception as error:
            LOGGER.exception("loading a voice failed")
            self._refuse(request, error)
            return
        with self._lock:
            if self.closed:
                self.host.unload(handle)
                return
            self.handles.add(handle)
        self._reply(request, handle=handle)

    def _stream(self, request: dict[str, Any]) -> None:
        stream_id = int(request["id"])
        sink = _RemoteSink(self, stream_id)
        with self._lock:
            self.streams[stream_id] = sink
        try:
            params = SynthesisParams(**request.get("params", {}))
            self.host.start_stream(
                int(request["handle"]), str(request["text"]), params, sink, request.get("received")
            )
        except (StreamRefused, TypeError, ValueError, KeyError) as error:
            sink.finish(error if isinstance(error, StreamRefused) else StreamRefused(str(error)))

    def forget(self, stream_id: int) -> None:
        with self._lock:
            self.streams.pop(stream_id, None)

    def _close(self) -> None:
        with self._lock:
            self.closed = True
            streams, handles = list(self.streams.values()), list(self.handles)
            self.handles.clear()
        for sink in streams:
            sink.cancel()  # the scheduler drops them at its next look
        for handle in handles:
            self.host.unload(handle)
        self._out.put(None)
        try:
            self.sock.close()
        except OSError:
            pass


class _RemoteSink(StreamSink):
    """A stream whose audio goes back over its stream model's connection."""

    def __init__(self, connection: _Connection, stream_id: int) -> None:
        self._connection = connection
        self._id = stream_id
        self._cancelled = False

    def audio(self, pcm: np.ndarray) -> None:
        self._connection.send({"op": "audio", "id": self._id}, pcm)

    def last_audio(self, pcm: np.ndarray) -> None:
        self._connection.send({"op": "last", "id": self._id}, pcm)

    def finish(self, error: Exception | None = None) -> None:
        header: dict[str, Any] = {"op": "end", "id": self._id}
        if error is not None and not isinstance(error, StreamCancelled):
            header["error"] = str(error)
            header["code"] = error_code(error)
        self._connection.forget(self._id)
        self._connection.send(header)

    def cancel(self) -> None:
        self._cancelled = True

    def cancelled(self) -> bool:
        return self._cancelled or self._connection.closed

    def chunk_route(self) -> tuple[Any, Any] | None:
        return self._connection, self._id


def _pcm_buffer(pcm: np.ndarray) -> memoryview:
    """`pcm` as int16 bytes, its own memory where it is contiguous int16 already (a vocoder
    call's row), which the frame then holds until it is written."""
    return np.ascontiguousarray(pcm, dtype=np.int16).data.cast("B")


def serve(socket_path: Path, host: VoiceHost, ready: threading.Event | None = None) -> None:
    """Accept stream models on `socket_path` until the process ends."""
    socket_path.unlink(missing_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(socket_path))
    server.listen(256)
    if ready is not None:
        ready.set()
    while True:
        client, _ = server.accept()
        connection = _Connection(host, client)
        NamedThread(target=connection.serve, name="voxfleet-host-read", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engines.pod.voice_host", description=__doc__)
    parser.add_argument("--socket", type=Path, required=True, help="the Unix socket to serve on")
    parser.add_argument(
        "--memory-mib",
        type=int,
        default=0,
        help="the pod's GPU (or CPU) memory to place voices in (0: the device's own)",
    )
    parser.add_argument(
        "--margin-mib", type=int, default=512, help="memory kept free on top of the voices"
    )
    parser.add_argument(
        "--cpu-threads", type=int, default=0, help="threads per onnxruntime call (0: the CPUs)"
    )
    parser.add_argument(
        "--frontend-workers",
        type=int,
        default=None,
        help="phonemiser processes (default: 4 where a GPU runs the voices, else none)",
    )
    parser.add_argument(
        "--prepare",
        type=Path,
        action="append",
        default=[],
        help="a serving plan (JSON) whose architecture to start at once, before its voice is "
        "loaded (repeatable)",
    )
    args = parser.parse_args(argv)
    prepare: list[ServingPlan] = []
    for path in args.prepare:
        try:
            prepare.append(ServingPlan.from_dict(json.loads(path.read_text())))
        except (OSError, ValueError, KeyError, TypeError) as error:
            print(f"voxfleet host: --prepare {path}: not a serving plan: {error}", file=sys.stderr)
            return 2
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="voxfleet host: %(message)s")
    host = VoiceHost(
        budget_bytes=args.memory_mib * MIB,
        margin_bytes=args.margin_mib * MIB,
        frontend_workers=args.frontend_workers,
        cpu_threads=args.cpu_threads or None,
    )

    def stop(signum: int, _frame: object) -> None:
        # End the streams in flight with an error their clients can read, but exit within
        # STOP_GRACE_S whatever the close waits on (a scheduler mid-call, a peer that reads
        # nothing): the host is stopped when its server is gone, and until it exits it holds
        # the device's memory.
        closing = NamedThread(target=host.close, name="voxfleet-host-close", daemon=True)
        closing.start()
        closing.join(timeout=STOP_GRACE_S)
        os._exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for plan in prepare:
        NamedThread(
            target=host.prepare, args=(plan,), name="voxfleet-host-prepare", daemon=True
        ).start()
    try:
        serve(args.socket, host)
    except OSError as error:
        print(f"voxfleet host: cannot serve on {args.socket}: {error}", file=sys.stderr)
        return 2
    return 0
