"""`HostClient`: a stream model's (or the supervisor's) connection to the pod's voice host.

Requests that are answered (load, unload, stats, memory) block the calling thread until their
reply; streams are started without waiting, and their audio and end come back to their sinks
from the client's reader thread. A thread of the client's own tells the host about streams
whose client went away (each sink's `cancelled()`), every `CANCEL_CHECK_S`. Where the host
goes away, every live stream ends with UNAVAILABLE and every request raises `HostError`.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from engines.contract.errors import RequestError
from engines.contract.plan import ServingPlan
from engines.pod.voice_host.protocol import ProtocolError, encode_frame, read_frame, stats_from_dict
from engines.streaming import SchedulerStats, StreamSink, SynthesisParams

CONNECT_TIMEOUT_S = 30.0
CANCEL_CHECK_S = 0.5
# A load may wait for its architecture's warmup: minutes on a GPU.
LOAD_TIMEOUT_S = 900.0
REQUEST_TIMEOUT_S = 30.0


class HostError(RequestError):
    """The voice host refused a request, or cannot be reached; `status` as RequestError's."""


class HostClient:
    def __init__(self, socket_path: str | Path, connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.socket_path = str(socket_path)
        self._sock = self._connect(connect_timeout_s)
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._seq = itertools.count(1)
        self._ids = itertools.count(1)
        self._replies: dict[int, Future[dict[str, Any]]] = {}
        self._streams: dict[int, StreamSink] = {}
        self._cancel_sent: set[int] = set()
        self._closed = threading.Event()
        self._error = ""
        threading.Thread(target=self._read, name="voxfleet-host-client", daemon=True).start()
        threading.Thread(target=self._watch, name="voxfleet-host-cancel", daemon=True).start()

    def _connect(self, timeout_s: float) -> socket.socket:
        deadline = time.monotonic() + timeout_s
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(self.socket_path)
                return sock
            except OSError as error:
                sock.close()
                if time.monotonic() >= deadline:
                    raise HostError(
                        f"the voice host at {self.socket_path} cannot be reached: {error}",
                        "UNAVAILABLE",
                    ) from None
                time.sleep(0.1)

    # -- sending ---------------------------------------------------------------------------
    def _send(self, header: dict[str, Any]) -> None:
        if self._closed.is_set():
            raise HostError(f"the voice host went away: {self._error}", "UNAVAILABLE")
        frame = encode_frame(header)
        try:
            with self._send_lock:
                self._sock.sendall(frame)
        except OSError as error:
            raise HostError(f"the voice host went away: {error}", "UNAVAILABLE") from None

    def call(self, op: str, timeout_s: float = REQUEST_TIMEOUT_S, **fields: Any) -> dict[str, Any]:
        seq = next(self._seq)
        future: Future[dict[str, Any]] = Future()
        with self._lock:
            self._replies[seq] = future
        try:
            self._send({"op": op, "seq": seq, **fields})
            reply = future.result(timeout=timeout_s)
        except TimeoutError:
            raise HostError(
                f"the voice host did not answer {op} in {timeout_s:.0f} s", "UNAVAILABLE"
            ) from None
        finally:
            with self._lock:
                self._replies.pop(seq, None)
        if not reply.get("ok"):
            raise HostError(str(reply.get("error")), str(reply.get("code") or "INTERNAL"))
        return reply

    def load(self, plan: ServingPlan) -> int:
        """Load `plan`'s voice; its handle. HostError (with the host's reason) otherwise."""
        return int(self.call("load", LOAD_TIMEOUT_S, plan=plan.to_dict())["handle"])

    def unload(self, handle: int) -> None:
        self.call("unload", handle=handle)

    def stats(self, handle: int) -> SchedulerStats:
        return stats_from_dict(self.call("stats", handle=handle)["stats"])

    def memory(self) -> dict[str, Any]:
        return dict(self.call("memory")["memory"])

    def stream(
        self,
        handle: int,
        text: str,
        params: SynthesisParams,
        sink: StreamSink,
        received: float | None = None,
    ) -> int:
        """Start a stream; its audio and end go to `sink`. Where the host cannot be reached the
        sink is finished with UNAVAILABLE at once."""
        stream_id = next(self._ids)
        with self._lock:
            self._streams[stream_id] = sink
        header = {
            "op": "stream",
            "id": stream_id,
            "handle": handle,
            "text": text,
            "params": asdict(params),
            "received": received,
        }
        try:
            self._send(header)
        except HostError as error:
            self._end(stream_id, error)
        return stream_id

    def live_streams(self) -> int:
        with self._lock:
            return len(self._streams)

    # -- receiving -------------------------------------------------------------------------
    def _read(self) -> None:
        try:
            while True:
                frame = read_frame(self._sock)
                if frame is None:
                    self._error = "it closed the connection"
                    break
                header, payload = frame
                op = header["op"]
                if op == "reply":
                    with self._lock:
                        future = self._replies.get(int(header.get("seq") or 0))
                    if future is not None:
                        future.set_result(header)
                    continue
                if op == "chunks":
                    self._chunks(header, payload)
                    continue
                stream_id = int(header.get("id", -1))
                if op == "end":
                    error = None
                    if header.get("error"):
                        error = RequestError(
                            str(header["error"]), str(header.get("code") or "INTERNAL")
                        )
                    self._end(stream_id, error)
                    continue
                with self._lock:
                    sink = self._streams.get(stream_id)
                if sink is None:
                    continue
                pcm = np.frombuffer(payload, dtype=np.int16)
                try:
                    if op == "last":
                        sink.last_audio(pcm)
                    else:
                        sink.audio(pcm)
                except Exception:  # the client went away: the watcher tells the host
                    continue
        except (OSError, ProtocolError) as error:
            self._error = str(error)
        self._lost()

    def _chunks(self, header: dict[str, Any], payload: bytes) -> None:
        """A frame of several streams' chunks (the voice host's `send_chunks`)."""
        pcm = np.frombuffer(payload, dtype=np.int16)
        ids = header["ids"]
        last = set(header.get("last") or ())
        # A stream's last chunk is its final one in the frame: a call may carry two or more
        # consecutive windows of one stream (planner.fill_with_next_windows). (Looked up only
        # in frames that end a stream.)
        final = {stream_id: row for row, stream_id in enumerate(ids)} if last else {}
        offset = 0
        for row, (stream_id, samples) in enumerate(zip(ids, header["samples"], strict=True)):
            chunk = pcm[offset : offset + samples]
            offset += samples
            with self._lock:
                sink = self._streams.get(stream_id)
            if sink is None:
                continue
            try:
                if stream_id in last and final[stream_id] == row:
                    sink.last_audio(chunk)
                else:
                    sink.audio(chunk)
            except Exception:  # the client went away: the watcher tells the host
                continue

    def _end(self, stream_id: int, error: Exception | None) -> None:
        with self._lock:
            sink = self._streams.pop(stream_id, None)
            self._cancel_sent.discard(stream_id)
        if sink is not None:
            try:
                sink.finish(error)
            except Exception:  # the client may be gone already
                pass

    def _lost(self) -> None:
        """The host is gone: every request and stream ends with UNAVAILABLE."""
        self._closed.set()
        with self._lock:
            replies, self._replies = dict(self._replies), {}
            streams = list(self._streams)
        gone = {
            "ok": False,
            "error": f"the voice host went away: {self._error}",
            "code": "UNAVAILABLE",
        }
        for future in replies.values():
            if not future.done():
                future.set_result(gone)
        for stream_id in streams:
            self._end(stream_id, RequestError(str(gone["error"]), "UNAVAILABLE"))

    def _watch(self) -> None:
        while not self._closed.wait(CANCEL_CHECK_S):
            with self._lock:
                streams = [(i, s) for i, s in self._streams.items() if i not in self._cancel_sent]
            for stream_id, sink in streams:
                try:
                    cancelled = sink.cancelled()
                except Exception:
                    cancelled = True
                if cancelled:
                    with self._lock:
                        self._cancel_sent.add(stream_id)
                    try:
                        self._send({"op": "cancel", "id": stream_id})
                    except HostError:
                        return
            streams = []

    @property
    def connected(self) -> bool:
        return not self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
