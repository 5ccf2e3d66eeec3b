"""Server CPU and memory during a run: the server process and all its children.

Triton runs each Python-backend model instance in a stub process (a child of tritonserver),
so the whole tree counts; where tritonserver runs in a pod (`voxfleet serve`, `voxfleet
triton`), the pod's voice host and phonemiser workers run beside it, started by the same
supervisor, and the tree is the supervisor's (`pod_of`). CPU is process time used during the
run over the run's wall time (100 % = one core busy); memory is the largest resident set
seen, sampled twice a second. The voice host's threads are read one by one, by the names they
give the kernel (engines/streaming/threads.py).
"""

from __future__ import annotations

import asyncio
import gc
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from engines.bench.stats import percentile

# How often the load generator's event loop is asked to wake up (`LoopLag`).
LOOP_LAG_INTERVAL_S = 0.01


@dataclass(frozen=True)
class ProcessTree:
    pid: int
    name: str

    def processes(self) -> list[psutil.Process]:
        try:
            root = psutil.Process(self.pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


def own_process() -> ProcessTree:
    return ProcessTree(os.getpid(), "this process")


def find_listening_process(port: int) -> ProcessTree | None:
    """The local process listening on `port` (None if it is not ours to see)."""
    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    for connection in connections:
        if (
            connection.status == psutil.CONN_LISTEN
            and connection.laddr
            and connection.laddr.port == port
            and connection.pid
        ):
            try:
                return ProcessTree(connection.pid, psutil.Process(connection.pid).name())
            except psutil.NoSuchProcess:
                return None
    return None


VOICE_HOST_MODULE = "engines.pod.voice_host"


def runs_voice_host(process: psutil.Process) -> bool:
    try:
        return VOICE_HOST_MODULE in process.cmdline()  # `python -m engines.pod.voice_host`
    except psutil.Error:
        return False


def pod_of(tree: ProcessTree) -> ProcessTree:
    """The pod around a server process: its parent, where that parent also started the voice
    host (a supervisor); else the tree itself."""
    try:
        parent = psutil.Process(tree.pid).parent()
        if parent is not None and any(runs_voice_host(child) for child in parent.children()):
            return ProcessTree(parent.pid, f"{tree.name} and its pod")
    except psutil.Error:
        pass
    return tree


def thread_seconds(process: psutil.Process) -> dict[int, tuple[str, float]]:
    """Each thread of `process`: (its kernel name, CPU seconds so far)."""
    seconds: dict[int, tuple[str, float]] = {}
    try:
        threads = process.threads()
    except psutil.Error:
        return seconds
    for thread in threads:
        try:
            comm = Path(f"/proc/{process.pid}/task/{thread.id}/comm").read_text().strip()
        except OSError:
            comm = "?"
        seconds[thread.id] = (comm, thread.user_time + thread.system_time)
    return seconds


def busy_by_name(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float
) -> dict[str, dict[str, float]]:
    """Threads' share of a core over `wall_s`, by name: the busiest of each name, and how many
    threads have it."""
    named: dict[str, dict[str, float]] = {}
    for tid, (name, seconds) in after.items():
        share = (seconds - before.get(tid, (name, 0.0))[1]) / wall_s if wall_s > 0 else 0.0
        entry = named.setdefault(name, {"busy": 0.0, "threads": 0, "total": 0.0})
        entry["busy"] = round(max(entry["busy"], share), 3)
        entry["total"] = round(entry["total"] + share, 3)
        entry["threads"] += 1
    return named


def _cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    seconds: dict[int, float] = {}
    for process in processes:
        try:
            times = process.cpu_times()
            seconds[process.pid] = times.user + times.system
        except psutil.Error:
            continue
    return seconds


def _rss_bytes(processes: list[psutil.Process]) -> int:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.Error:
            continue
    return total


class ResourceSampler:
    """Samples one process tree in a background thread between `start()` and `stop()`."""

    def __init__(self, tree: ProcessTree, interval_s: float = 0.5) -> None:
        self._tree = tree
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._peak_rss = 0
        self._start_cpu: dict[int, float] = {}
        self._last_cpu: dict[int, float] = {}
        self._started = 0.0
        self._voice_host: psutil.Process | None = None
        self._start_threads: dict[int, tuple[str, float]] = {}

    def start(self) -> None:
        processes = self._tree.processes()
        self._start_cpu = _cpu_seconds(processes)
        self._last_cpu = dict(self._start_cpu)
        self._voice_host = next((p for p in processes if runs_voice_host(p)), None)
        if self._voice_host is not None:
            self._start_threads = thread_seconds(self._voice_host)
        self._peak_rss = _rss_bytes(processes)
        self._started = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="resources", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        processes = self._tree.processes()
        # A child that exits mid-run keeps the CPU it used up to its last sample.
        self._last_cpu.update(_cpu_seconds(processes))
        self._peak_rss = max(self._peak_rss, _rss_bytes(processes))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            self._sample()

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        wall = time.perf_counter() - self._started
        used = sum(
            seconds - self._start_cpu.get(pid, 0.0) for pid, seconds in self._last_cpu.items()
        )
        result: dict[str, Any] = {
            "process": self._tree.name,
            "cpu_percent": 100.0 * used / wall if wall > 0 else 0.0,
            "peak_rss_mib": self._peak_rss / 2**20,
        }
        if self._voice_host is not None:
            threads = busy_by_name(self._start_threads, thread_seconds(self._voice_host), wall)
            result["voice_host_threads"] = threads
            if threads:
                name, entry = max(threads.items(), key=lambda item: item[1]["busy"])
                result["busiest_thread"] = {"name": name, "busy": entry["busy"]}
        return result


class MachineCpuSampler:
    """CPU busy on the whole machine between `start()` and `stop()` (100 % = one core)."""

    def __init__(self) -> None:
        self._start: tuple[float, float] = (0.0, 0.0)

    @staticmethod
    def _busy_and_total() -> tuple[float, float]:
        times = psutil.cpu_times()
        idle = times.idle + getattr(times, "iowait", 0.0)
        total = sum(times)
        return total - idle, total

    def start(self) -> None:
        self._start = self._busy_and_total()

    def stop(self) -> float:
        busy, total = self._busy_and_total()
        elapsed = total - self._start[1]
        cores = psutil.cpu_count() or 1
        return 100.0 * cores * (busy - self._start[0]) / elapsed if elapsed > 0 else 0.0


class LoopLag:
    """How late the load generator's event loop ran between `start()` and `stop()`: a task
    sleeps `interval_s` again and again and records how much later than asked it woke up.

    Every chunk is timestamped by that loop, so a late loop adds its lateness to first audio
    and can turn a chunk that came in time into an underrun: the run's figures are the
    server's only while this stays small (at 2,000 streams one client process holds them
    all). `max_at_s` says when the latest wake-up was asked for, in seconds from `start()`
    (the level's start), so a stall can be placed: the ramp of new listeners, the load, or
    the drain.
    """

    def __init__(self, interval_s: float = LOOP_LAG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._lags: list[tuple[float, float]] = []  # (asked, seconds late)
        self._started = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._started = time.perf_counter()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            asked = time.perf_counter()
            await asyncio.sleep(self._interval_s)
            self._lags.append((asked, time.perf_counter() - asked - self._interval_s))

    async def stop(self) -> dict[str, float]:
        """p50, p95 and max of the lateness in ms and `max_at_s` (nothing where no wake-up
        was recorded)."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        if not self._lags:
            return {}
        lags = [1000 * lag for _, lag in self._lags]
        asked, latest = max(self._lags, key=lambda each: each[1])
        return {
            "p50": percentile(lags, 50),
            "p95": percentile(lags, 95),
            "max": 1000 * latest,
            "max_at_s": asked - self._started,
        }


class GcPauses:
    """Python's garbage collections in the load generator between `start()` and `stop()`:
    each stops the event loop (and so the timestamping of every chunk) for its duration."""

    def __init__(self) -> None:
        self._pauses: list[float] = []
        self._began: float | None = None

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        elif self._began is not None:
            self._pauses.append(time.perf_counter() - self._began)
            self._began = None

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> dict[str, float]:
        """How many collections ran, and their total and longest time in ms."""
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
        pauses = [1000 * pause for pause in self._pauses]
        return {"count": len(pauses), "total": sum(pauses), "max": max(pauses, default=0.0)}
