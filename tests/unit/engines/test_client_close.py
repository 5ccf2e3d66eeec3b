"""How `voxfleet say` and `engines.client.tts` end a stream: a finished one is closed, not
cancelled (Triton 2.51 keeps a model referenced after some such cancellations), and a close
the server never answers is cancelled after all."""

from __future__ import annotations

import threading
import time

import pytest

from engines.client import tts as client_module
from engines.client.tts import _close_call


class FakeCall:
    """A gRPC call as grpc's: `code()` waits for the call to end (here until the server
    `ends` it, or it is cancelled); `cancel()` ends it at once."""

    def __init__(self, server_ends: bool) -> None:
        self.cancelled = False
        self.ends = threading.Event()
        if server_ends:
            self.ends.set()

    def cancel(self) -> None:
        self.cancelled = True
        self.ends.set()

    def code(self) -> str:
        self.ends.wait()
        return "CANCELLED" if self.cancelled else "OK"


def test_a_finished_stream_is_closed_not_cancelled() -> None:
    call, our_half = FakeCall(server_ends=True), threading.Event()
    _close_call(call, complete=True, finished=our_half)
    time.sleep(0.05)
    assert our_half.is_set() and not call.cancelled


def test_an_unfinished_stream_is_cancelled() -> None:
    call, our_half = FakeCall(server_ends=False), threading.Event()
    _close_call(call, complete=False, finished=our_half)
    assert call.cancelled


def test_a_close_the_server_never_ends_is_cancelled_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "STREAM_CLOSE_TIMEOUT_S", 0.2)
    call, our_half = FakeCall(server_ends=False), threading.Event()
    started = time.monotonic()
    _close_call(call, complete=True, finished=our_half)
    waited = time.monotonic() - started
    assert call.cancelled
    assert 0.15 < waited < 5
