"""Responses of the stream model: a stream's sink and the threads that send for it."""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from engines.contract import names
from engines.pod.triton_model.requests import INTERNAL, RequestError
from engines.streaming import StreamCancelled, StreamSink

LOGGER = logging.getLogger("voxfleet.model")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
SENDER_THREADS = 2
# How often the cancel watcher asks about each live stream (engines.streaming.scheduler reads
# the answer at most every CANCEL_CHECK_S as well).
CANCEL_WATCH_S = 0.5


def triton_error_code(status: str) -> Any:
    """The Triton error code closest to a gRPC status name. (pb_utils has its TritonError
    only once the stub is up, not while it imports a model to auto-complete its config.)"""
    codes = pb_utils.TritonError
    return {
        "INVALID_ARGUMENT": codes.INVALID_ARG,
        "RESOURCE_EXHAUSTED": codes.UNAVAILABLE,
        "UNAVAILABLE": codes.UNAVAILABLE,
        "NOT_FOUND": codes.NOT_FOUND,
    }.get(status, codes.INTERNAL)


def error_response(message: str, status: str) -> Any:
    """An error response that engines.client.tts turns back into `status`: Triton's gRPC stream
    carries per-request errors as text only, so the status name leads the message."""
    error = pb_utils.TritonError(f"[{status}] {message}", triton_error_code(status))
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class Senders:
    """Threads that hand responses to the server, so that the scheduler never waits on a send
    (each is a round trip to the tritonserver process). All responses of one stream go
    through one thread, in order; streams are spread over the threads. With no threads, the
    caller sends itself (the CPU data plane: its two cores are the stages')."""

    def __init__(self, threads: int = SENDER_THREADS) -> None:
        self._queues: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(threads)
        ]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"voxfleet-send-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, key: int, call: Callable[[], None]) -> None:
        if not self._queues:
            call()  # the scheduler handles a failed send as the stream's failure
            return
        self._queues[key % len(self._queues)].put(call)

    @staticmethod
    def _run(calls: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while True:
            call = calls.get()
            if call is None:
                return
            try:
                call()
            except Exception:  # the client may be gone; the scheduler notices it cancelled
                LOGGER.debug("sending a response failed", exc_info=True)
            # A send holds its stream's response sender: kept while this thread waits, it
            # would hold the request, and the model with it, past Triton's shutdown.
            call = None

    def stop(self) -> None:
        for calls in self._queues:
            calls.put(None)  # after everything already queued
        for thread in self._threads:
            thread.join(timeout=10)


class CancelWatcher:
    """Asks Triton, from a thread of its own, whether each live stream's client went away.

    Each question is a round trip to the tritonserver process; asked from the scheduler thread
    (every live stream every 0.5 s: 2,000 a second at 1,000 streams), the GPU waited on them.
    The sinks it watches answer `cancelled()` from the last answer instead.
    """

    def __init__(self, interval_s: float = CANCEL_WATCH_S) -> None:
        self._interval_s = interval_s
        self._sinks: set[ResponseSink] = set()
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voxfleet-cancel", daemon=True)
        self._thread.start()

    def watch(self, sink: ResponseSink) -> None:
        with self._lock:
            self._sinks.add(sink)

    def forget(self, sink: ResponseSink) -> None:
        with self._lock:
            self._sinks.discard(sink)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            with self._lock:
                sinks = list(self._sinks)
            for sink in sinks:
                sink.ask_cancelled()
            sinks = []  # hold no response sender while waiting

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=10)
        with self._lock:
            self._sinks.clear()


class ResponseSink(StreamSink):
    """One stream's decoupled responses: audio chunks, then one final-flagged response.

    With a `CancelWatcher`, `cancelled()` reads the watcher's last answer; without one (the CPU
    data plane), it asks Triton itself.
    """

    _keys = itertools.count()

    def __init__(
        self,
        request: Any,
        sample_rate: int,
        senders: Senders,
        watcher: CancelWatcher | None = None,
    ) -> None:
        self._sender: Any = request.get_response_sender()
        self._rate = np.array([sample_rate], dtype=np.int32)
        self._senders = senders
        self._key = next(self._keys)
        self._watcher = watcher
        self._cancelled = False
        if watcher is not None:
            watcher.watch(self)

    def _send(self, response: Callable[[], Any] | None = None, flags: int = 0) -> None:
        """Send `response()` (built on the sending thread; None: no response) with `flags`."""
        sender = self._sender
        if sender is None:
            return  # finished already
        if flags & FINAL:
            # Triton releases a request (and lets its model unload) only once the Python
            # objects of its response sender are gone: drop ours with the final response,
            # whatever else still refers to this sink.
            self._sender = None
            if self._watcher is not None:
                self._watcher.forget(self)
        self._senders.submit(
            self._key, lambda: sender.send(None if response is None else response(), flags=flags)
        )

    def audio(self, pcm: np.ndarray) -> None:
        self._send_audio(pcm, 0)

    def last_audio(self, pcm: np.ndarray) -> None:
        """The last chunk carries the final flag: no empty final response follows it. A client
        that hangs up the moment the last audio arrives then hangs up on a finished request;
        between the last audio and a separate final response, such a hang-up crashed
        tritonserver 2.51 with SIGSEGV about once in 1,000 (docs/reliability.md)."""
        self._send_audio(pcm, FINAL)

    def _send_audio(self, pcm: np.ndarray, flags: int) -> None:
        rate = self._rate

        def response() -> Any:
            tensors = [pb_utils.Tensor(names.AUDIO, pcm), pb_utils.Tensor(names.SAMPLE_RATE, rate)]
            return pb_utils.InferenceResponse(output_tensors=tensors)

        self._send(response, flags)

    def finish(self, error: Exception | None = None) -> None:
        if error is None or isinstance(error, StreamCancelled):
            self._send(flags=FINAL)
        elif isinstance(error, RequestError):
            self._send(lambda: error_response(str(error), error.status), flags=FINAL)
        else:
            self._send(lambda: error_response(str(error), INTERNAL), flags=FINAL)

    def cancelled(self) -> bool:
        sender = self._sender
        if sender is None:
            return True
        if self._watcher is not None:
            return self._cancelled
        return bool(sender.is_cancelled())

    def ask_cancelled(self) -> None:
        """The watcher's question (a round trip to the server), answered for `cancelled()`."""
        sender = self._sender
        if sender is None:
            return
        try:
            self._cancelled = bool(sender.is_cancelled())
        except Exception:  # the request is gone: as good as cancelled
            LOGGER.debug("asking whether a stream was cancelled failed", exc_info=True)
            self._cancelled = True
