"""The supervisor's health endpoint answers from the process itself, not only its last poll."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

from engines import names
from engines.supervisor import Supervisor, TritonEndpoints


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_ready_fails_the_moment_tritonserver_has_exited(tmp_path: Path) -> None:
    port = _free_port()
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
