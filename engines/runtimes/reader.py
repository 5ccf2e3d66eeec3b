"""A worker process that reads a voice's files for a runtime, so that parsing them does not
hold the serving process's interpreter.

A voice host loads voices while its scheduler thread serves other voices' streams. Reading a
voice's engine entry (three ONNX graphs of 6 to 28 MB parsed by protobuf, their weights laid
out as the architecture's buffers) is Python and C++ work that holds the interpreter for up to
tens of milliseconds at a time; the scheduler thread then waits for it, a step at a time.
`ProcessReader` runs such a function in a process of its own and hands back its result: the
serving process only receives the bytes and copies them to the device.

The worker is started with `spawn` (a process that has initialised CUDA must not fork), sees
no GPU (`CUDA_VISIBLE_DEVICES` empty) and computes with one thread. Where it dies (killed, out
of memory), the read that lost it runs in the serving process instead, as every read did
before, and the next read starts a new worker. An exception the function raises reaches the
caller as itself.

This module imports no runtime library: a runtime's reading function brings its own.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

LOGGER = logging.getLogger("voxfleet.reader")

T = TypeVar("T")


def _worker_started() -> None:
    """In the worker, before anything it runs imports a runtime: no GPU, one thread."""
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"


def _ready() -> int:
    return os.getpid()


class ProcessReader:
    """Runs picklable functions in one worker process, one at a time (`run`)."""

    def __init__(self, warm: Callable[[], Any] | None = None) -> None:
        # `warm`: run in the worker as soon as it starts (the runtime's imports), so that the
        # first read does not pay them.
        self._warm = warm or _ready
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def start(self) -> None:
        """Start the worker now, in the background (`run` starts it where it is not)."""
        with self._lock:
            self._started()

    def _started(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_worker_started,
            )
            self._pool.submit(self._warm)
        return self._pool

    def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` in the worker: its result, or the exception it raised. Where the
        worker dies meanwhile, in this process instead (and a new worker for the next)."""
        with self._lock:
            pool = self._started()
        try:
            return pool.submit(function, *args).result()
        except BrokenProcessPool:
            LOGGER.warning(
                "the voice reader process died; reading %s in the serving process", args[:1]
            )
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.shutdown(wait=False, cancel_futures=True)
            return function(*args)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
