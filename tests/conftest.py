"""What every test tier shares: no Triton backend process outlives the tests."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psutil
import pytest

from engines.pod.supervisor import STUB_NAME

# Set for the whole run; every server the tests start inherits it, and so do its backend
# stubs, which tells them apart from the stubs of any other run on the machine.
RUN_ENV = "VOXFLEET_TEST_RUN"


@pytest.fixture(scope="session", autouse=True)
def no_backend_stub_outlives_the_tests() -> Iterator[None]:
    """Fails the run where a Python-backend stub of one of its servers is still running once
    every server is stopped (and kills it): a stopped server must take its stubs with it."""
    run = uuid.uuid4().hex
    os.environ[RUN_ENV] = run
    yield
    left = [process for process in _stubs() if _of_run(process, run)]
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    assert not left, f"Triton backend stubs outlived their servers: {left}"


def _stubs() -> Iterator[psutil.Process]:
    for process in psutil.process_iter(["name"]):
        if process.info["name"] == STUB_NAME:
            yield process


def _of_run(process: psutil.Process, run: str) -> bool:
    try:
        if process.status() == psutil.STATUS_ZOMBIE:
            return False  # exited; it holds nothing
        return bool(process.environ().get(RUN_ENV) == run)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
