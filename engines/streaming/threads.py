"""Threads that carry their name down to the operating system.

Python names its threads for itself only; the kernel keeps the process's name for every one of
them. A `NamedThread` sets its kernel name (Linux: `prctl(PR_SET_NAME)`, at most 15 bytes)
when it starts, so that per-thread CPU time can be read by name from
`/proc/<pid>/task/<tid>/comm` (the benchmark's `server.voice_host_threads`, `top -H`,
`py-spy`): one thread of one process is a ceiling no core count lifts, and it must be seen.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
import threading
from typing import Any

PR_SET_NAME = 15
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


class NamedThread(threading.Thread):
    """A `threading.Thread` whose name the kernel knows as well (`kernel_name`)."""

    def run(self) -> None:
        name_current_thread(self.name)
        super().run()
