"""The delivery thread of a scheduler whose vocoder calls are asynchronous (a GPU backend).

The scheduler launches a step's vocoder calls and moves on; their audio reaches the host
later. This thread waits for each call's PCM in the order the calls were launched, sends every
window's chunk to its stream's sink, and sends the streams' ends after their audio, so that a
listener never sees its end before its last chunk. Each call's device time goes back to the
scheduler's cost model, and each stream's first audio to its stats, through the callbacks.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.streaming.threads import NamedThread
from engines.streaming.types import ChunkReceiver, Stream

LOGGER = logging.getLogger(__name__)


@dataclass
class LaunchedCall:
    """A launched vocoder call's audio: (stream, row, samples, first audio, last audio) per
    window, in the order the windows were planned."""

    pending: Any
    windows: list[tuple[Stream, int, int, bool, bool]]
    width: int


@dataclass
class _Finish:
    stream: Stream
    error: Exception | None


class AudioDelivery:
    """`audio(call)` and `finish(stream, error)` from the scheduler thread; the sends happen
    on a thread of its own, in that order."""

    def __init__(
        self,
        first_audio: Callable[[Stream, float], None],
        observed: Callable[[str, float, int, int], None],
    ) -> None:
        self._first_audio = first_audio
        self._observed = observed
        self._items: queue.SimpleQueue[LaunchedCall | _Finish | None] = queue.SimpleQueue()
        self._thread = NamedThread(target=self._run, name="voxfleet-delivery", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def audio(self, call: LaunchedCall) -> None:
        self._items.put(call)

    def finish(self, stream: Stream, error: Exception | None) -> None:
        self._items.put(_Finish(stream, error))  # after the stream's queued audio

    def stop(self) -> None:
        self._items.put(None)  # after everything queued
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            item = self._items.get()
            if item is None:
                return
            if isinstance(item, _Finish):
                try:
                    item.stream.sink.finish(item.error)
                except Exception:  # the client may be gone already
                    LOGGER.debug("finishing stream %s failed", item.stream.stream_id)
                continue
            self._deliver(item)
            item = None  # hold no pinned block while waiting for the next

    def _deliver(self, call: LaunchedCall) -> None:
        try:
            pcm, seconds = call.pending.result()
        except Exception as error:  # a failed call: its streams end with the error
            LOGGER.exception("a vocoder call failed")
            for stream, *_ in call.windows:
                stream.sink.finish(RuntimeError(f"synthesis failed: {error}"))
            return
        self._observed("vocoder", seconds, len(call.windows), call.width)
        now = time.monotonic()
        # Chunks whose sinks share a receiver (a stream model's connection to the voice host)
        # leave in one message per receiver: one encoding and one write for the call's chunks,
        # not one per stream.
        batches: dict[int, tuple[ChunkReceiver, list[tuple[Any, np.ndarray, bool]]]] = {}
        for stream, row, samples, first, last in call.windows:
            if first:
                self._first_audio(stream, now)
            route = stream.sink.chunk_route()
            if route is not None:
                receiver, key = route
                batches.setdefault(id(receiver), (receiver, []))[1].append(
                    (key, pcm[row, :samples], last)
                )
                continue
            try:
                if last:
                    stream.sink.last_audio(pcm[row, :samples])
                else:
                    stream.sink.audio(pcm[row, :samples])
            except Exception:  # the scheduler notices a cancelled stream on its own
                LOGGER.debug("sending to stream %s failed", stream.stream_id)
        for receiver, chunks in batches.values():
            try:
                receiver.send_chunks(chunks)
            except Exception:  # the scheduler notices the closed streams on its own
                LOGGER.debug("sending %d chunks failed", len(chunks))
