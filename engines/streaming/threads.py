"""Threads that carry their name down to the operating system.

Python names its threads for itself only; the kernel keeps the process's name for every one of
them. A `NamedThread` sets its kernel name (Linux: `prctl(PR_SET_NAME)`, at most 15 bytes)
when it starts, so that per-thread CPU time can be read by name from
`/proc/<pid>/task/<tid>/comm` (the benchmark's `server.voice_host_threads`, `top -H`,
`py-spy`): one thread of one process is a ceiling no core count lifts, and it must be seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

PR_SET_NAME = 15
PR_GET_NAME = 16
KERNEL_NAME_BYTES = 15


@functools.cache
def _prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def kernel_name(name: str) -> bytes:
    """`name` as the kernel keeps it: at most 15 bytes, the `voxfleet-` prefix shortened."""
    if name.startswith("voxfleet-"):
        name = "vf-" + name[len("voxfleet-") :]
    return name.encode()[:KERNEL_NAME_BYTES]


def name_current_thread(name: str) -> None:
    """Give the calling thread `name` in the kernel too (nothing where that cannot be done)."""
    prctl = _prctl()
    if prctl is not None:
        prctl(PR_SET_NAME, ctypes.c_char_p(kernel_name(name)), 0, 0, 0)


@contextlib.contextmanager
def threads_named(name: str) -> Iterator[None]:
    """Meanwhile the calling thread's kernel name is `name`, and so is that of every thread a
    library starts from it (Linux gives a new thread its creator's name): onnxruntime's pool and
    CUDA's threads then say what they work for, not which of ours happened to start them."""
    prctl = _prctl()
    before = ctypes.create_string_buffer(KERNEL_NAME_BYTES + 1)
    if prctl is None or prctl(PR_GET_NAME, before, 0, 0, 0) != 0:
        yield
        return
    name_current_thread(name)
    try:
        yield
    finally:
        prctl(PR_SET_NAME, ctypes.c_char_p(before.value), 0, 0, 0)


class NamedThread(threading.Thread):
    """A `threading.Thread` whose name the kernel knows as well (`kernel_name`)."""

    def run(self) -> None:
        name_current_thread(self.name)
        super().run()


class StackSampler:
    """Where the threads named `thread_name` spend their wall time: their Python stacks,
    sampled every `interval_s`, for profiling runs where no outside profiler can attach to
    the process (py-spy needs ptrace, which a container may not grant). `collapsed()` gives
    them in py-spy's raw format: a line per distinct stack, ``frame;frame;... weight``,
    outermost first, each frame ``function (file:line)``
    (engines.bench.profile.summarise_raw reads it).

    A sample can only be taken when this thread holds the interpreter lock: a thread that
    keeps the lock is sampled once per switch interval (5 ms), one that waits every
    `interval_s`. So each sample weighs the wall time since the one before (microseconds),
    not one; time inside a C call that keeps the lock counts to the Python line that made
    it."""

    def __init__(self, thread_name: str, interval_s: float = 0.002) -> None:
        self.thread_name = thread_name
        self.interval_s = interval_s
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: NamedThread | None = None

    def start(self) -> StackSampler:
        self._thread = NamedThread(target=self._run, name="voxfleet-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        last = time.perf_counter()
        while not self._stop.wait(self.interval_s):
            now = time.perf_counter()
            weight, last = max(1, round((now - last) * 1e6)), now
            idents = {t.ident for t in threading.enumerate() if t.name == self.thread_name}
            frames = sys._current_frames()
            for ident in idents:
                frame = frames.get(ident) if ident is not None else None
                stack: list[str] = []
                while frame is not None:
                    code = frame.f_code
                    stack.append(f"{code.co_name} ({code.co_filename}:{frame.f_lineno})")
                    frame = frame.f_back
                if stack:
                    key = ";".join(reversed(stack))
                    with self._lock:
                        self._counts[key] = self._counts.get(key, 0) + weight

    def sampled_s(self) -> float:
        """The wall time the samples weigh together (seconds)."""
        with self._lock:
            return sum(self._counts.values()) / 1e6

    def collapsed(self) -> str:
        with self._lock:
            counts = sorted(self._counts.items(), key=lambda item: -item[1])
        return "".join(f"{stack} {count}\n" for stack, count in counts)
