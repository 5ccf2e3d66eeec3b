"""A stopped or dead tritonserver takes its Python-backend stubs with it.

A stub ignores SIGTERM and SIGINT, and ends by itself only when it notices its server gone,
which a stub that hangs on its way out never does: one was found alive an hour after
`make test` ended, reparented to init. Here a stub is frozen (SIGSTOP) to stand for one
that will not end by itself."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest
from supervised import running, serve_command

from engines.commands.local_serving import local_server, plan_local_voices
from engines.pod.supervisor import STUB_NAME

pytestmark = pytest.mark.triton


def _stubs(pid: int) -> list[psutil.Process]:
    children = psutil.Process(pid).children(recursive=True)
    return [child for child in children if child.name() == STUB_NAME]


def _left(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Those of `processes` still running after `timeout_s` (killed then, for the next tests).
    An exited one that no parent has reaped yet (a zombie) holds nothing: it is not left."""
    deadline = time.monotonic() + timeout_s
    while True:
        alive = [p for p in processes if _running(p)]
        if not alive or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for process in alive:
        process.kill()
    return alive


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_stopping_a_server_that_died_takes_its_stubs(engine_cache: Path, tmp_path: Path) -> None:
    """The tests' and the bench's server (`TritonServer`), its tritonserver dead (a crash)."""
    plan = plan_local_voices(["joe"], engine_cache)
    triton = local_server(plan, work_dir=tmp_path)
    with triton.start():
        assert triton.process is not None
        stubs = _stubs(triton.process.pid)
        assert stubs
        for stub in stubs:
            stub.suspend()
        os.kill(triton.process.pid, signal.SIGKILL)  # tritonserver alone
    assert _left(stubs, timeout_s=5) == []


def test_serve_takes_the_stubs_of_a_tritonserver_that_died(engine_cache: Path) -> None:
    command, ports = serve_command(str(engine_cache))
    with running(command, ports) as served:
        (triton,) = [
            child
            for child in psutil.Process(served.process.pid).children()
            if child.name() == "tritonserver"
        ]
        stubs = _stubs(triton.pid)
        assert stubs
        for stub in stubs:
            stub.suspend()
        triton.kill()  # tritonserver alone, as a crash would end it
        assert served.wait_for(lambda: served.ready() != 200, timeout_s=10) is not None
        assert served.wait_for(lambda: served.ready() == 200, timeout_s=120) is not None
        assert _left(stubs, timeout_s=5) == []
