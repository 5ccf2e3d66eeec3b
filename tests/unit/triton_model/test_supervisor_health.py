"""The supervisor's health endpoint answers from the process itself, not only its last poll."""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from engines.contract import names
from engines.pod.ports import free_port
from engines.pod.supervisor import Supervisor, TritonEndpoints


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_ready_fails_the_moment_tritonserver_has_exited(tmp_path: Path) -> None:
    port = free_port()
    # A stand-in for tritonserver that runs until told to stop; the supervisor's watch loop is
    # not started, so its state stays what the last poll left: ready.
    supervisor = Supervisor(
        ["sleep", "30"], {}, TritonEndpoints(), tmp_path, health_port=port, health_host="127.0.0.1"
    )
    supervisor.start()
    try:
        supervisor.state.ready, supervisor.state.reason = True, "ready"
        assert _get(port, names.READY_PATH) == (200, "ready\n")
        assert supervisor.process is not None
        supervisor.process.kill()
        supervisor.process.wait()
        assert _get(port, names.READY_PATH) == (503, "tritonserver is not running\n")
    finally:
        if supervisor.process is not None and supervisor.process.poll() is None:
            supervisor.process.kill()
        if supervisor._health is not None:
            supervisor._health.shutdown()


@pytest.fixture
def watching(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A supervisor over a stand-in server whose voice `joe` is always ready, and a stand-in
    stub process for it (not the server's child: never listed unless a test lists it)."""
    supervisor = Supervisor(["sleep", "30"], {}, TritonEndpoints(), tmp_path, health_port=None)
    supervisor.process = subprocess.Popen(["sleep", "30"])
    stub = subprocess.Popen(["sleep", "30"])
    monkeypatch.setattr(supervisor, "_http", lambda method, path, *a, **k: 200)
    try:
        yield supervisor, stub
    finally:
        for process in (stub, supervisor.process):
            process.kill()
            process.wait()


def _joe(stub: subprocess.Popen) -> dict:
    from engines.pod import supervisor as module

    return {stub.pid: module._Stub(model="joe", shm_region="joe-shm")}


def test_a_stub_missed_by_one_listing_is_not_a_death(watching) -> None:
    """A stub still running but absent from one listing (its /proc entry unreadable for a
    moment, as under a burst of loads) must not restart tritonserver and every voice with
    it; the same stub gone for good, its voice still ready, is a death."""
    supervisor, stub = watching
    supervisor._stubs = _joe(stub)
    assert supervisor._dead_model() is None
    assert stub.pid in supervisor._stubs  # still watched
    stub.kill()
    stub.wait()
    assert supervisor._dead_model() == "joe"


def test_a_stub_that_dies_the_moment_the_server_is_ready_is_a_death(
    watching, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`voxfleet serve` says it is ready, then starts watching: a backend process killed in
    between was never seen by the watch, and its voice stayed dead. It is watched from the
    moment tritonserver is ready."""
    supervisor, stub = watching
    listed = _joe(stub)
    monkeypatch.setattr(supervisor, "_current_stubs", lambda: dict(listed))
    assert supervisor.wait_ready(5)
    stub.kill()  # before the watch loop's first look
    stub.wait()
    listed.clear()
    assert supervisor._dead_model() == "joe"
