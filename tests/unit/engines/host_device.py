"""Test doubles for the scheduler's GPU path on the CPU: the joe voice's onnxruntime stages
with host frame stores standing in for a GPU backend (cut in the fixed window sizes of a GPU
runtime, so the chunks are the same whatever the timing), a GPU backend's asynchronous calls
over them (`SlowDevice`), and a sink that records a stream."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np

from engines.runtimes.onnx import OnnxStages
from engines.streaming import StreamSink, SynthesisParams
from engines.streaming.frames import HostBackend

TEXT = "Streaming speech arrives chunk by chunk. A second sentence follows the first."
QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)  # repeatable audio


class Sink(StreamSink):
    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []
        self.error: Exception | None = None
        self.cancel = False
        self.done = threading.Event()

    def audio(self, pcm: np.ndarray) -> None:
        assert not self.done.is_set(), "audio after the final response"
        self.chunks.append(np.array(pcm))

    def finish(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()

    def cancelled(self) -> bool:
        return self.cancel


def play_queued(scheduler: Any, sinks: list[Any]) -> None:
    """Start `scheduler` (a StreamScheduler) on the streams submitted to it already, so that
    its first step sees every one however busy the machine is, wait for each of `sinks` to
    end, and stop it."""
    scheduler.start()
    try:
        for sink in sinks:
            assert sink.done.wait(120), "a stream never finished"
    finally:
        scheduler.stop()


class Timing:
    """A device timing that is over at once (`DeviceBackend.timer`)."""

    def stop(self) -> Timing:
        return self

    def done(self) -> bool:
        return True

    def seconds(self) -> float:
        return 0.001


class HostStages:
    """The onnxruntime stages with the test's backend."""

    name = "host-stores"

    def __init__(self, stages: OnnxStages, backend: HostBackend) -> None:
        self.stages = stages
        self.backend: Any = backend  # the test's subclass, with its own attributes

    def stream_backend(self) -> Any:
        return self.backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stages, name)


class Pending:
    """A launched step whose device work ends `seconds` after the scheduler asks for it."""

    def __init__(self, pcm: np.ndarray, seconds: float) -> None:
        self.pcm, self.seconds = pcm, seconds

    def wait(self) -> None:
        time.sleep(self.seconds)

    def result(self) -> tuple[np.ndarray, float]:
        return self.pcm, 0.001


class SlowDevice(HostBackend):
    """Host frame stores with a GPU backend's asynchronous calls, each step's device work
    taking `seconds` to finish."""

    def __init__(self, runtime: Any, seconds: float = 0.0) -> None:
        super().__init__(runtime, initial_pages=512)
        self.features = replace(self.features, async_calls=True)
        self.seconds = seconds

    def vocode_async(self, *args: Any) -> Pending:
        return Pending(self.vocode(*args), self.seconds)

    def timer(self) -> Timing:
        return Timing()
