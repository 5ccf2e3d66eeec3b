from __future__ import annotations

import os
import signal
import threading

import pytest

from engines.text.frontend import Sentence, text_to_sentences
from engines.text.frontend_pool import FrontendPool
from engines.text.voice import Voice

TEXT = "Four score and seven years ago. Our fathers brought forth a new nation!"


class Result:
    def __init__(self) -> None:
        self.sentences: list[Sentence] | None = None
        self.error: Exception | None = None
        self.done = threading.Event()

    def __call__(self, sentences: list[Sentence] | None, error: Exception | None) -> None:
        self.sentences, self.error = sentences, error
        self.done.set()


def phonemise(pool: FrontendPool, text: str, config_path: str) -> Result:
    result = Result()
    pool.submit(config_path, text, result)
    assert result.done.wait(60), "the frontend never answered"
    return result


@pytest.mark.parametrize("workers", [0, 1])
def test_workers_give_the_same_ids_as_the_model_process(joe: Voice, workers: int) -> None:
    pool = FrontendPool(workers)
    try:
        result = phonemise(pool, TEXT, str(joe.config_path))
    finally:
        pool.close()
    assert result.error is None
    assert result.sentences == text_to_sentences(TEXT, joe.config)
    assert len(result.sentences) == 2


def test_a_killed_worker_fails_its_requests_and_is_replaced(joe: Voice) -> None:
    pool = FrontendPool(workers=1, warm_config=str(joe.config_path))
    config = str(joe.config_path)
    try:
        assert phonemise(pool, "Warm up.", config).error is None
        assert pool._pool is not None
        for pid in list(pool._pool._processes):  # the worker, as an OOM killer would
            os.kill(pid, signal.SIGKILL)
        lost = phonemise(pool, TEXT, config)
        recovered = phonemise(pool, TEXT, config)
    finally:
        pool.close()
    assert lost.error is not None, "a request to a dead worker must fail, not hang"
    assert recovered.error is None, recovered.error
    assert recovered.sentences == text_to_sentences(TEXT, joe.config)
