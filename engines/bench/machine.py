"""What machine a benchmark ran on, and what that machine can do at most.

The machine's limit is measured, not assumed: one stream synthesised one-shot (the monolithic
voice, whole sentence, nothing else running from this process) has a real-time factor RTF;
a machine that did nothing but that could keep 1 / RTF streams playing in real time.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psutil


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _gpus() -> list[str]:
    """Each GPU as nvidia-smi names it, with its driver and memory; none without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    query = "--query-gpu=name,driver_version,memory.total"
    try:
        listing = subprocess.run(
            ["nvidia-smi", query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in listing.splitlines() if line.strip()]


def describe_machine() -> dict[str, Any]:
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count() or 0
    import onnxruntime

    return {
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": _cpu_model(),
        "cores": usable,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "onnxruntime": onnxruntime.__version__,
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "gpus": _gpus(),
    }


@dataclass(frozen=True)
class OneShotLimit:
    rtf: float
    sentences: int
    audio_seconds: float

    @property
    def streams(self) -> float:
        return 1.0 / self.rtf if self.rtf > 0 else 0.0


def measure_one_shot_limit(
    synthesize: Callable[[str], int],
    sample_rate: int,
    sentences: Sequence[str],
    clock: Callable[[], float] = time.perf_counter,
) -> OneShotLimit:
    """RTF of synthesising `sentences` one after another; `synthesize` returns samples."""
    if not sentences:
        raise ValueError("the one-shot limit needs at least one sentence")
    synthesize(sentences[0])  # the first call pays for allocations that no later one does
    busy_s = 0.0
    samples = 0
    for text in sentences:
        start = clock()
        samples += synthesize(text)
        busy_s += clock() - start
    audio_s = samples / sample_rate
    return OneShotLimit(rtf=busy_s / audio_s, sentences=len(sentences), audio_seconds=audio_s)
