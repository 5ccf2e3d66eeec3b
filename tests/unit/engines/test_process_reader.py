"""A voice's files are read in a worker process of the voice host's own
(engines/runtimes/reader.py): parsing them holds that process's interpreter, not the one the
scheduler thread serves streams from. A refusal reaches the load as itself; a worker that dies
costs only that read its process (it runs in the serving process) and the next read gets a new
worker."""

from __future__ import annotations

import os

import pytest
from reading import die_in_worker, pid_and_gpus, refuse

from engines.runtimes.reader import ProcessReader


@pytest.fixture
def reader():
    reader = ProcessReader()
    yield reader
    reader.close()


def test_a_read_runs_in_a_worker_process_that_sees_no_gpu(reader) -> None:
    reader.start()
    pid, gpus = reader.run(pid_and_gpus)
    assert pid != os.getpid()
    assert gpus == ""
    assert reader.run(pid_and_gpus)[0] == pid  # one worker, kept


def test_a_refusal_in_the_worker_reaches_the_caller_as_itself(reader) -> None:
    with pytest.raises(ValueError, match="voice other: its graph differs"):
        reader.run(refuse, "other")
    assert reader.run(pid_and_gpus)[0] != os.getpid()  # and the worker still reads


def test_a_worker_that_dies_costs_no_read_and_is_replaced(reader) -> None:
    first = reader.run(pid_and_gpus)[0]
    assert reader.run(die_in_worker, os.getpid()) == os.getpid()  # read here instead
    second = reader.run(pid_and_gpus)[0]
    assert second not in (first, os.getpid())
