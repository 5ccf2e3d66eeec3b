from __future__ import annotations

import os
import signal
import threading
import time

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
        # A request of a few seconds' phonemising, in flight when its worker is killed.
        lost = Result()
        pool.submit(config, TEXT * 2000, lost)
        time.sleep(0.5)
        (pid,) = pool.worker_pids()
        os.kill(pid, signal.SIGKILL)  # the worker, as an OOM killer would
        assert lost.done.wait(60), "a request to a dead worker must fail, not hang"
        recovered = phonemise(pool, TEXT, config)
        assert pool.worker_pids() != [pid]
    finally:
        pool.close()
    assert lost.error is not None and "died" in str(lost.error)
    assert recovered.error is None, recovered.error
    assert recovered.sentences == text_to_sentences(TEXT, joe.config)


def test_a_failing_callback_leaves_the_other_requests_answered(joe: Voice) -> None:
    """Callbacks run on the pool's reader thread: one that raises must not stop it."""
    pool = FrontendPool(workers=1)
    config = str(joe.config_path)

    def broken(sentences: list[Sentence] | None, error: Exception | None) -> None:
        raise RuntimeError("a listener's callback broke")

    try:
        pool.submit(config, TEXT, broken)
        after = phonemise(pool, TEXT, config)
    finally:
        pool.close()
    assert after.error is None and after.sentences == text_to_sentences(TEXT, joe.config)


def test_a_closed_pool_answers_every_request(joe: Voice) -> None:
    """Requests in flight when the pool closes, and any after, end with an error."""
    pool = FrontendPool(workers=1)
    config = str(joe.config_path)
    pending = Result()
    pool.submit(config, TEXT * 2000, pending)
    pool.close()
    after = phonemise(pool, TEXT, config)
    assert pending.done.wait(10) and pending.error is not None
    assert after.error is not None and "closed" in str(after.error)
    assert pool.worker_pids() == []


def test_a_pods_phonemisers_are_warm_before_its_first_listener(
    monkeypatch: pytest.MonkeyPatch, joe_plan
) -> None:
    """The workers start with the voice's architecture, beside its warmup, each having read
    espeak-ng's data and the voice's config: the first listeners do not pay for that."""
    from known_costs import TEXT as SPOKEN
    from known_costs import KnownCosts, Listener

    from engines.pod.voice_host import host as host_module
    from engines.streaming import SynthesisParams

    monkeypatch.setattr(host_module, "load_stages", lambda *args, **kwargs: KnownCosts())
    host = host_module.VoiceHost(frontend_workers=1)
    try:
        handle = host.load(joe_plan)
        for _ in range(600):  # no stream has asked for them
            if host._frontend is not None:
                break
            threading.Event().wait(0.1)
        frontend = host._frontend
        assert frontend is not None, "the phonemisers did not start with the voice"
        assert frontend.warm_config == joe_plan.voice_config_path
        assert len(frontend.worker_pids()) == 1
        listener = Listener()
        host.start_stream(handle, SPOKEN, SynthesisParams(), listener)
        assert listener.done.wait(60) and listener.error is None, listener.error
        assert listener.received_s > 0.5
    finally:
        host.close()
    assert host._frontend is None
