"""onnxruntime's thread count: what the voice host is given (a pod's CPU request), else the
CPUs the process may use."""

from __future__ import annotations

import os

from engines.pod.voice_host.host import VoiceHost
from engines.runtimes.onnx import cpu_threads


def test_without_a_request_threads_are_the_cpus_this_process_may_use() -> None:
    # A CPU set (taskset, a cpuset container) is the bound, not the machine's cores.
    allowed = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {min(allowed)})
        assert cpu_threads() == 1
    finally:
        os.sched_setaffinity(0, allowed)
    assert cpu_threads() == len(allowed)


def test_the_voice_host_runs_onnxruntime_with_the_threads_it_is_given(joe_plan) -> None:
    host = VoiceHost(cpu_threads=3)
    try:
        host.load(joe_plan)
        (architecture,) = host._architectures.values()
        assert architecture.runtime.threads == 3
    finally:
        host.close()
