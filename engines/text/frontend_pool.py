"""Text → phoneme ids in worker processes, off the model process's GIL.

The phonemiser (espeak-ng through piper-tts) holds the GIL for about a millisecond per
request. In a model process that also runs a GPU scheduler thread and response senders, a
burst of requests phonemised on Triton's thread keeps the scheduler waiting for the GIL and
queues the burst behind itself; worker processes take both away. Workers are started with
``spawn`` (the model process may hold a CUDA context and several threads, which ``fork``
would copy half-way) with this interpreter or, inside the Triton stub (an embedded Python),
the ``python3`` first on PATH, which is the Python the stub runs (engines/pod/triton_server.py
puts it there).

Each worker has a pipe of its own: a request is pickled onto the least busy worker's pipe by
the thread that submits it, and one reader thread takes every worker's answers and calls each
request's callback. That is all the model process does per request: about 0.34 ms of its CPU
on the 2-core machine, half what a `ProcessPoolExecutor` took with its manager and
queue-feeder threads, which held 13 to 24 % of a packed GPU pod's interpreter lock beside its
scheduler thread (`python -m lab.frontend_costs`, docs/gpu-runs.md).

``FrontendPool(workers=0)`` phonemises in the calling thread instead, with the same
interface: the CPU data plane uses that, so its figures stay comparable.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import selectors
import shutil
import sys
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import VoiceConfig, read_voice_config

LOGGER = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0
# Seconds a closing pool gives each worker to exit before it is killed.
STOP_TIMEOUT_S = 5.0
# Seconds before a worker that died while starting is started again.
RESTART_PAUSE_S = 1.0
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


READY = "ready"
Done = Callable[[list[Sentence] | None, Exception | None], None]


def _serve(requests: Connection, warm_config: str | None) -> None:
    """A worker process: warm, say so, then answer (key, config, text) with (key, sentences,
    error) until its pipe closes or brings None."""
    _worker_start(warm_config)
    requests.send(READY)
    while True:
        try:
            request = requests.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        key, config_path, text = request
        try:
            answer: tuple[int, list[Sentence] | None, Exception | None] = (
                key,
                _worker_sentences(config_path, text),
                None,
            )
        except Exception as error:
            answer = (key, None, error)
        try:
            requests.send(answer)
        except Exception as error:  # an error that does not pickle goes back as its text
            requests.send((key, None, RuntimeError(f"{type(error).__name__}: {error}")))


def worker_python() -> str:
    """This interpreter, unless it is embedded (the Triton stub): then python3 on PATH."""
    if sys.executable and Path(sys.executable).name.startswith("python"):
        return sys.executable
    return shutil.which("python3") or sys.executable


def _call(done: Done, sentences: list[Sentence] | None, error: Exception | None) -> None:
    """A request's callback, on the reader thread: its failure must not end that thread."""
    try:
        done(sentences, error)
    except Exception:
        LOGGER.exception("a phonemised request's callback failed")


class _Worker:
    """One phonemiser process, its pipe, and the requests sent to it and not yet answered."""

    def __init__(self, context: Any, warm_config: str | None) -> None:
        self.conn, theirs = context.Pipe()
        self.process = context.Process(
            target=_serve, args=(theirs, warm_config), name="voxfleet-phonemiser", daemon=True
        )
        self.process.start()
        theirs.close()
        self.pending: dict[int, Done] = {}
        self.ready = False
        self.send_lock = threading.Lock()

    def wait_ready(self, timeout_s: float) -> None:
        if not self.conn.poll(timeout_s) or self.conn.recv() != READY:
            raise RuntimeError(f"a phonemiser worker did not start in {timeout_s:.0f} s")
        self.ready = True

    def stop(self) -> None:
        try:
            with self.send_lock:
                self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class FrontendPool:
    """`submit(config_path, text, done)` phonemises `text` for the voice whose Piper config is
    at `config_path` and calls ``done(sentences, error)`` once (with workers, on the pool's
    reader thread). One pool serves every voice of a pod: its workers read each voice's config
    the first time they meet it. `warm_config`: a config the workers read as they start;
    `thread`: what makes the reader thread (a voice host's names itself to the kernel)."""

    def __init__(
        self,
        workers: int = 0,
        warm_config: str | None = None,
        thread: Callable[..., threading.Thread] = threading.Thread,
    ) -> None:
        self.workers = workers
        self.warm_config = warm_config
        self._lock = threading.Lock()
        self._keys = itertools.count()
        self._workers: list[_Worker] = []
        self._closed = False
        self._reader: threading.Thread | None = None
        if workers <= 0:
            return
        self._context = multiprocessing.get_context("spawn")
        self._context.set_executable(worker_python())
        # The reader's wait also wakes for this pipe: a worker replaced, or the pool closed.
        self._wake_r, self._wake_w = self._context.Pipe(duplex=False)
        # Workers take about a second each to start (a Python, espeak-ng's data): all of them
        # start now, side by side, or the first burst of listeners waits for them.
        self._workers = [_Worker(self._context, warm_config) for _ in range(workers)]
        try:
            for worker in self._workers:
                worker.wait_ready(STARTUP_TIMEOUT_S)
        except Exception:
            for worker in self._workers:
                worker.stop()
            raise
        self._reader = thread(target=self._read, name="voxfleet-frontend", daemon=True)
        self._reader.start()

    def worker_pids(self) -> list[int]:
        """The worker processes' ids (none where the pool phonemises in the calling thread)."""
        with self._lock:
            return [w.process.pid for w in self._workers if w.process.pid is not None]

    def submit(self, config_path: str, text: str, done: Done) -> None:
        if self.workers <= 0:
            try:
                sentences = text_to_sentences(text, _config(config_path))
            except Exception as error:
                done(None, error)
                return
            done(sentences, None)
            return
        key = next(self._keys)
        with self._lock:
            if self._closed:
                worker = None
            else:
                worker = min(self._workers, key=lambda w: len(w.pending))
                worker.pending[key] = done
        if worker is None:
            done(None, RuntimeError("the phonemisers are closed"))
            return
        try:
            with worker.send_lock:
                worker.conn.send((key, config_path, text))
        except (OSError, ValueError) as error:  # a dead worker: the reader replaces it
            with self._lock:
                lost = worker.pending.pop(key, None)
            if lost is not None:
                lost(None, RuntimeError(f"a phonemiser worker died: {error}"))

    def _read(self) -> None:
        """Every worker's answers to their callbacks; a worker that dies fails its requests and
        is replaced. One selector while the workers stay the same (a new one per wait cost
        more than the answers)."""
        selector: selectors.BaseSelector | None = None
        workers: list[_Worker] = []
        try:
            while True:
                with self._lock:
                    if self._closed:
                        return
                    if workers != self._workers:
                        workers = list(self._workers)
                        if selector is not None:
                            selector.close()
                        selector = self._selector(workers)
                assert selector is not None
                for key, _ in selector.select():
                    worker = key.data
                    if worker is None:
                        self._wake_r.recv()
                    elif worker.conn.closed:  # replaced a moment ago
                        continue
                    elif key.fileobj is worker.conn:
                        self._answer(worker)
                    elif not worker.conn.poll():  # its sentinel, its answers all read
                        self._replace(worker)
        finally:
            if selector is not None:
                selector.close()

    def _selector(self, workers: list[_Worker]) -> selectors.BaseSelector:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ, None)
        for worker in workers:
            selector.register(worker.conn, selectors.EVENT_READ, worker)
            selector.register(worker.process.sentinel, selectors.EVENT_READ, worker)
        return selector

    def _answer(self, worker: _Worker) -> None:
        """The answers waiting in a worker's pipe to their callbacks."""
        while True:
            try:
                message = worker.conn.recv()
            except (EOFError, OSError):
                self._replace(worker)
                return
            if message == READY:
                worker.ready = True
            else:
                key, sentences, error = message
                with self._lock:
                    done = worker.pending.pop(key, None)
                if done is not None:
                    _call(done, sentences, error)
            try:
                if not worker.conn.poll():
                    return
            except (EOFError, OSError):
                self._replace(worker)
                return

    def _replace(self, dead: _Worker) -> None:
        """A worker died (killed, out of memory): its requests fail, a new one takes its place
        (its requests wait in its pipe while it starts)."""
        if not dead.ready:  # it died starting: the next one waits, rather than loop at once
            LOGGER.error("a phonemiser worker died before it was ready")
            time.sleep(RESTART_PAUSE_S)
        with self._lock:
            if self._closed or dead not in self._workers:
                return
            LOGGER.error("a phonemiser worker died; starting a new one")
            self._workers[self._workers.index(dead)] = _Worker(self._context, self.warm_config)
            lost, dead.pending = dead.pending, {}
        dead.process.join(STOP_TIMEOUT_S)
        dead.conn.close()
        for done in lost.values():
            _call(done, None, RuntimeError("a phonemiser worker died while preparing the text"))

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            workers, self._workers = self._workers, []
        if self.workers <= 0:
            return
        self._wake_w.send(None)
        if self._reader is not None:
            self._reader.join(STOP_TIMEOUT_S)
        for worker in workers:
            worker.stop()
            for done in worker.pending.values():
                _call(done, None, RuntimeError("the phonemisers were closed"))
        self._wake_r.close()
        self._wake_w.close()
