"""Functions a `ProcessReader` runs in its worker in tests/unit/engines/test_process_reader.py
(a worker imports them by module name)."""

from __future__ import annotations

import os


def pid_and_gpus() -> tuple[int, str | None]:
    return os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")


def refuse(name: str) -> str:
    raise ValueError(f"voice {name}: its graph differs from the architecture's")


def die_in_worker(parent: int) -> int:
    """Kills the worker it runs in; in `parent` (the serving process), returns its pid."""
    if os.getpid() != parent:
        os._exit(3)
    return os.getpid()
