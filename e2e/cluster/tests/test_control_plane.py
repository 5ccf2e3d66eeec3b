"""The control plane fails loudly: a port in use is named with its process, and a process
that dies is reported with the last lines of its log."""

from __future__ import annotations

import signal
import socket
import time
from pathlib import Path

import pytest
from cluster import ControlPlane, ControlPlaneError
from e2e_support import HEALTH_CHECKS, eventually


def test_a_port_in_use_is_named(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        plane = ControlPlane(
            tmp_path, controllers=(), scheduler=False, ports={"kube-apiserver": port}
        )
        with pytest.raises(ControlPlaneError) as raised:
            plane.start()
    message = str(raised.value)
    assert f"kube-apiserver: port 127.0.0.1:{port} (--secure-port) is in use" in message
    assert all(p.process is None or p.process.poll() is not None for p in plane.processes)


def test_a_process_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    with ControlPlane(tmp_path, controllers=(), scheduler=False) as plane:
        plane.check()
        (etcd,) = [p for p in plane.processes if p.name == "etcd"]
        assert etcd.process is not None
        etcd.process.send_signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while etcd.process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        with pytest.raises(ControlPlaneError) as raised:
            plane.check()
        # A scenario waiting on the cluster fails at once, not at its timeout.
        HEALTH_CHECKS.append(plane.check)
        started = time.monotonic()
        try:
            with pytest.raises(ControlPlaneError, match="etcd was killed"):
                eventually(lambda: False, timeout=120, what="something that never happens")
        finally:
            HEALTH_CHECKS.remove(plane.check)
        assert time.monotonic() - started < 5
    message = str(raised.value)
    assert message.startswith("etcd was killed by signal 9; the last lines of its log")
    assert str(plane.log_path("etcd")) in message
