"""How `voxfleet say` and `engines.client` end a stream: a finished one is closed, not
cancelled (Triton 2.51 keeps a model referenced after some such cancellations), and a close
the server never answers is cancelled after all."""

from __future__ import annotations

import threading
import time

import pytest

from engines import client as client_module
from engines.client import _close_stream


class FakeClient:
    """`stop_stream` as tritonclient's: a close waits for the server to end the stream (here
    until `ends` is set); a cancel ends it at once."""

    def __init__(self, server_ends: bool) -> None:
        self.calls: list[bool] = []
        self.ends = threading.Event()
        if server_ends:
            self.ends.set()

    def stop_stream(self, cancel_requests: bool = False) -> None:
        self.calls.append(cancel_requests)
        if cancel_requests:
            self.ends.set()
        self.ends.wait()


def test_a_finished_stream_is_closed_not_cancelled() -> None:
    fake = FakeClient(server_ends=True)
    _close_stream(fake, complete=True)  # type: ignore[arg-type]
    time.sleep(0.05)
    assert fake.calls == [False]


def test_an_unfinished_stream_is_cancelled() -> None:
    fake = FakeClient(server_ends=False)
    _close_stream(fake, complete=False)  # type: ignore[arg-type]
    assert fake.calls == [True]


def test_a_close_the_server_never_ends_is_cancelled_after_the_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "STREAM_CLOSE_TIMEOUT_S", 0.2)
    fake = FakeClient(server_ends=False)
    started = time.monotonic()
    _close_stream(fake, complete=True)  # type: ignore[arg-type]
    waited = time.monotonic() - started
    assert fake.calls == [False, True]
    assert 0.15 < waited < 5
