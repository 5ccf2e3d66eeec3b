"""onnxruntime's thread count: what a pod asks for, else the CPUs the process may use."""

from __future__ import annotations

import os

import pytest

from engines.runtime import cpu_threads


def test_threads_follow_the_pods_cpu_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXFLEET_THREADS", "3")
    assert cpu_threads() == 3


@pytest.mark.parametrize("value", ["", "0"])
def test_without_a_request_threads_are_the_cpus_this_process_may_use(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    # A pod without a CPU request gets 0 from the downward API; a CPU set (taskset, a cpuset
    # container) is then the bound, not the machine's cores.
    monkeypatch.setenv("VOXFLEET_THREADS", value)
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert cpu_threads() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert cpu_threads() == len(allowed)
