"""Text → phoneme ids in worker processes, off the model process's GIL.

The phonemiser (espeak-ng through piper-tts) holds the GIL for about a millisecond per
request. In a model process that also runs a GPU scheduler thread and response senders, a
burst of requests phonemised on Triton's thread keeps the scheduler waiting for the GIL and
queues the burst behind itself; worker processes take both away. Workers are started with
``spawn`` (the model process may hold a CUDA context and several threads, which ``fork``
would copy half-way) with this interpreter or, inside the Triton stub (an embedded Python),
the ``python3`` first on PATH, which is the Python the stub runs (engines/pod/triton_server.py
puts it there).

``FrontendPool(workers=0)`` phonemises in the calling thread instead, with the same
interface: the CPU data plane uses that, so its figures stay comparable.
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import VoiceConfig, read_voice_config

LOGGER = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0
# Voice configs a process has read, by path: a pod's voices are phonemised by one pool.
_CONFIGS: dict[str, VoiceConfig] = {}


def _config(config_path: str) -> VoiceConfig:
    config = _CONFIGS.get(config_path)
    if config is None:
        config = _CONFIGS[config_path] = read_voice_config(config_path)
    return config


def _worker_start(config_path: str | None) -> None:
    if config_path:  # loads espeak-ng's data before requests come
        text_to_sentences("Ready.", _config(config_path))


def _worker_sentences(config_path: str, text: str) -> list[Sentence]:
    return text_to_sentences(text, _config(config_path))


def worker_python() -> str:
    """This interpreter, unless it is embedded (the Triton stub): then python3 on PATH."""
    if sys.executable and Path(sys.executable).name.startswith("python"):
        return sys.executable
    return shutil.which("python3") or sys.executable


class FrontendPool:
    """`submit(config_path, text, done)` phonemises `text` for the voice whose Piper config is
    at `config_path` and calls ``done(sentences, error)`` once. One pool serves every voice of
    a pod: its workers read each voice's config the first time they meet it. `warm_config`:
    a config the workers read as they start."""

    def __init__(self, workers: int = 0, warm_config: str | None = None) -> None:
        self.workers = workers
        self.warm_config = warm_config
        self._lock = threading.Lock()
        self._pool: ProcessPoolExecutor | None = self._start() if workers > 0 else None

    def _start(self) -> ProcessPoolExecutor:
        context = multiprocessing.get_context("spawn")
        context.set_executable(worker_python())
        pool = ProcessPoolExecutor(
            self.workers,
            mp_context=context,
            initializer=_worker_start,
            initargs=(self.warm_config,),
        )
        # Workers start on demand, each taking about a second (a Python, espeak-ng's data):
        # start them all now, or the first burst of listeners waits for them.
        for started in [pool.submit(_worker_start, self.warm_config) for _ in range(self.workers)]:
            started.result(timeout=STARTUP_TIMEOUT_S)
        return pool

    def submit(
        self,
        config_path: str,
        text: str,
        done: Callable[[list[Sentence] | None, Exception | None], None],
    ) -> None:
        if self._pool is None:
            try:
                sentences = text_to_sentences(text, _config(config_path))
            except Exception as error:
                done(None, error)
                return
            done(sentences, None)
            return
        with self._lock:
            pool = self._pool
        try:
            future = pool.submit(_worker_sentences, config_path, text)
        except BrokenProcessPool as error:
            self._restart(pool)
            done(None, error)
            return

        def finished(result: Future[list[Sentence]]) -> None:
            error = result.exception()
            if isinstance(error, BrokenProcessPool):
                self._restart(pool)
            if error is None:
                done(result.result(), None)
            else:
                done(None, error if isinstance(error, Exception) else RuntimeError(str(error)))

        future.add_done_callback(finished)

    def _restart(self, broken: ProcessPoolExecutor) -> None:
        """A worker died (killed, out of memory): later requests get a fresh pool."""
        with self._lock:
            if self._pool is not broken:
                return
            LOGGER.error("a phonemiser worker died; starting new workers")
            self._pool = self._start()
        broken.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
