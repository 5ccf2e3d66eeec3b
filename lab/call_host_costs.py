"""What one vocoder call costs the host, part by part: `python -m lab.call_host_costs` (a CUDA GPU).

    python -m lab.call_host_costs --engine-dir ENTRY [--rows 5] [--calls 400] --out costs.json

A packed pod's scheduler thread makes a vocoder call per voice and width each step, and at ten
voices those calls, not the device, set its pace (docs/gpu-runs.md). This warms a torch-cuda
architecture up as a pod does (`StreamScheduler.warmup`), loads a second voice, and then makes
`--calls` vocoder calls of `--rows` windows of the steady width through the stream model's
own path (`DeviceBackend.vocode_async`), the two voices in turn, as a scheduler at ten voices
does. It reports, in microseconds a call (median, and the mean), the host's wall and CPU time:

- `whole`: the call as the scheduler makes it;
- `parts`: the same call's steps one by one (the window index on the host, its upload, the
  gather, binding the voice's weights, the graph's replay with its input copy and output
  clone, the PCM conversion, the copy to pinned memory, the timing events);
- `with_busy_thread`: `whole` again while another Python thread of the process is busy a
  quarter of the time in bursts of a millisecond (as the delivery and connection threads
  are), at the interpreter's default switch interval and at 0.5 ms;
- `with_waiting_thread`: `whole` again while another thread waits for each call's audio, as
  the delivery thread does, the call's end event spinning (CUDA's default) or blocking
  (`DeviceBackend.blocking_waits`) while it waits.

The device is waited for every 8 calls, outside the timings, so that its queue stays short
as in a pod. Figures of one process on one GPU: compare them with each other.
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SYNC_EVERY = 8


def _stats(samples: list[float]) -> dict[str, float]:
    return {
        "median_us": round(statistics.median(samples) * 1e6, 1),
        "mean_us": round(statistics.fmean(samples) * 1e6, 1),
    }


def _timed(calls: int, one: Callable[[int], Any], sync: Callable[[], None]) -> dict[str, Any]:
    walls: list[float] = []
    cpus: list[float] = []
    for i in range(calls):
        if i % SYNC_EVERY == 0:
            sync()
        wall, cpu = time.perf_counter(), time.thread_time()
        one(i)
        cpus.append(time.thread_time() - cpu)
        walls.append(time.perf_counter() - wall)
    sync()
    return {"wall": _stats(walls), "cpu": _stats(cpus)}


class _BusyThread:
    """A Python thread busy `duty` of the time, in bursts of `burst_s`."""

    def __init__(self, duty: float = 0.25, burst_s: float = 0.001) -> None:
        self._stop = threading.Event()
        self._duty, self._burst = duty, burst_s
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        total = 0
        while not self._stop.is_set():
            started = time.perf_counter()
            while time.perf_counter() - started < self._burst:
                for i in range(64):
                    total += i
            self._stop.wait(self._burst * (1 - self._duty) / self._duty)

    def __enter__(self) -> _BusyThread:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


class _Waiter:
    """A thread that waits for each call's audio in turn (`PendingAudio.result`)."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def put(self, pending: Any) -> None:
        self._calls.put(pending)

    def _run(self) -> None:
        while (pending := self._calls.get()) is not None:
            pending.result()

    def __enter__(self) -> _Waiter:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._calls.put(None)
        self._thread.join()


def measure(engine_dir: Path, rows: int, calls: int, device: str = "cuda") -> dict[str, Any]:
    import torch

    from engines.contract.plan import WindowConfig
    from engines.runtimes.device_frames import PendingAudio
    from engines.runtimes.torch_cuda import load
    from engines.runtimes.torch_cuda.stages import bucket_for
    from engines.streaming import StreamScheduler
    from engines.streaming.frames import PAGE_FRAMES, FramePool
    from engines.text.voice import read_voice_config

    cuda = device == "cuda"
    if cuda:
        windows = WindowConfig()
        runtime: Any = load(engine_dir, windows)
    else:  # a smoke run of this script only: no graphs, small calls
        from engines.runtimes.torch_cuda.stages import TorchCudaStages

        windows = WindowConfig(max_batch_windows=8, max_encoder_batch=2)
        runtime = TorchCudaStages(engine_dir, device=device, use_graphs=False, batch_buckets=(8,))
    config = read_voice_config(engine_dir / "voice.onnx.json")
    scheduler = StreamScheduler(
        runtime, sample_rate=config.sample_rate, hop_length=config.hop_length, windows=windows
    )
    sync: Callable[[], None] = torch.cuda.synchronize if cuda else lambda: None
    started = time.perf_counter()
    scheduler.warmup()
    sync()
    warmup_s = time.perf_counter() - started
    voices = [runtime.default_voice, runtime.load_voice(engine_dir, "second")]
    backend = runtime.stream_backend()
    backend._fit()
    width = max(windows.vocoder_call_frames())
    context = windows.vocoder_context_frames
    size = windows.window_frames
    pages = -(-(size + 2 * context) // PAGE_FRAMES) + 1
    tables = [np.arange(row * pages, (row + 1) * pages, dtype=np.int64) for row in range(rows)]
    starts = np.zeros(rows, dtype=np.int64)
    limits = np.full(rows, size + 2 * context, dtype=np.int64)
    cut = (context * config.hop_length, (context + size) * config.hop_length)
    speakers = np.zeros(rows, dtype=np.int64)

    def whole(i: int) -> PendingAudio:
        return backend.vocode_async(tables, starts, limits, width, speakers, cut, voices[i % 2])

    for i in range(32):  # warm the pinned and device caches for these shapes
        whole(i)
    sync()
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0) if cuda else device,
        "torch": torch.__version__,
        "rows": rows,
        "width": width,
        "calls": calls,
        "warmup_s": round(warmup_s, 1),
        "whole": _timed(calls, whole, sync),
    }

    # The same call's steps one by one, each timed alone (`DeviceBackend.vocode_async`).
    stage = runtime.vocoder_stage
    state: dict[str, Any] = {}

    def index(i: int) -> None:
        state["index"], _ = FramePool.window_index(tables, starts, limits, width)

    def upload(i: int) -> None:
        state["up"] = backend._upload(state["index"])

    def gather(i: int) -> None:
        state["latent"] = backend._latent[state["up"]].permute(0, 2, 1)

    def bind(i: int) -> None:
        runtime._bind("vocoder", voices[i % 2])

    def replay(i: int) -> None:
        state["audio"] = stage.run({"latent": state["latent"]})[0]

    def convert(i: int) -> None:
        audio = state["audio"].reshape(rows, -1)[:, cut[0] : cut[1]]
        state["pcm"] = (audio.float().clamp(-1.0, 1.0) * 32767.0).to(torch.int16)

    def pinned(i: int) -> None:
        host = torch.empty(state["pcm"].shape, dtype=torch.int16, pin_memory=cuda)
        host.copy_(state["pcm"], non_blocking=True)
        state["host"] = host

    def events(i: int) -> None:
        for _ in range(2 if cuda else 0):
            torch.cuda.Event(enable_timing=True).record()

    bucket = bucket_for(rows, stage.buckets)
    alone = [c for (b, shape), c in stage.graphs.items() if b == bucket and shape[0][-1] == width]

    def launch(i: int) -> None:
        if alone:
            alone[0].graph.replay()

    steps = [
        ("window_index", index),
        ("upload", upload),
        ("gather", gather),
        ("bind", bind),
        ("replay", replay),
        ("convert", convert),
        ("pinned_copy", pinned),
        ("events", events),
        ("graph_launch_alone", launch),
    ]
    timings: dict[str, Any] = {}
    for name, part in steps:
        walls: list[float] = []
        cpus: list[float] = []
        for i in range(calls):
            if i % SYNC_EVERY == 0:
                sync()
            for other, fn in steps:  # its inputs, untimed
                if other == name:
                    break
                fn(i)
            wall, cpu = time.perf_counter(), time.thread_time()
            part(i)
            cpus.append(time.thread_time() - cpu)
            walls.append(time.perf_counter() - wall)
        sync()
        timings[name] = {"wall": _stats(walls), "cpu": _stats(cpus)}
    result["parts"] = timings

    busy: dict[str, Any] = {}
    default_interval = sys.getswitchinterval()
    for label, interval in (("default_switch", default_interval), ("switch_0.5ms", 0.0005)):
        sys.setswitchinterval(interval)
        with _BusyThread():
            busy[label] = _timed(calls, whole, sync)
    sys.setswitchinterval(default_interval)
    result["with_busy_thread"] = busy

    # A thread waiting for each call's audio, as the scheduler's delivery thread does, with
    # the call's end event spinning or blocking while it waits (`DeviceBackend.blocking_waits`).
    waited: dict[str, Any] = {}
    setting = backend.blocking_waits
    for label, blocking in (("spinning", False), ("blocking", True)):
        backend.blocking_waits = blocking
        with _Waiter() as waiter:

            def delivered(i: int) -> None:
                waiter.put(whole(i))

            waited[label] = _timed(calls, delivered, sync)
    backend.blocking_waits = setting
    result["with_waiting_thread"] = waited
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.call_host_costs", description=__doc__)
    parser.add_argument("--engine-dir", type=Path, required=True, help="a torch-cuda entry")
    parser.add_argument("--rows", type=int, default=5, help="windows a call")
    parser.add_argument("--calls", type=int, default=400, help="calls timed per figure")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run (no graphs)")
    args = parser.parse_args(argv)
    result = measure(args.engine_dir, args.rows, args.calls, args.device)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
