"""The threads a runtime starts in the voice host (onnxruntime's pool on the CPU) carry the
name `vf-stages`: Linux gives a new thread its creator's name, and the bench's per-thread
figures (`server.voice_host_threads`) showed the stages' compute under the name of whichever
thread of ours had loaded them (`vf-host-prepare`)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from engines.contract.plan import ServingPlan
from engines.pod.voice_host.host import VoiceHost
from engines.streaming.threads import NamedThread, kernel_name, threads_named


def thread_name(tid: int | str) -> str:
    """A thread of this process by its kernel name."""
    return Path(f"/proc/{os.getpid()}/task/{tid}/comm").read_text().strip()


def thread_names(leaving: int | None = None) -> list[str]:
    """This process's threads' names, but `leaving`'s: a thread that was joined may still be
    on its way out of the kernel's list for a moment."""
    tasks = Path(f"/proc/{os.getpid()}/task").iterdir()
    return [thread_name(task.name) for task in tasks if task.name != str(leaving)]


def test_threads_started_meanwhile_take_the_name_and_the_caller_gets_its_own_back() -> None:
    seen: list[str] = []

    def run() -> None:
        with threads_named("voxfleet-lib"):
            started = threading.Thread(target=lambda: seen.append(own_name()))
            started.start()
            started.join()
        seen.append(own_name())

    loader = NamedThread(target=run, name="voxfleet-loader")
    loader.start()
    loader.join()
    assert seen == ["vf-lib", "vf-loader"]


def own_name() -> str:
    return thread_name(threading.get_native_id())


def test_a_cpu_voice_hosts_stage_threads_are_named_for_the_stages(joe_plan: ServingPlan) -> None:
    host = VoiceHost(frontend_workers=0, cpu_threads=2)
    loader = NamedThread(target=host.load, args=(joe_plan,), name="voxfleet-loader")
    try:
        loader.start()
        loader.join()
        names = thread_names(leaving=loader.native_id)
        assert kernel_name("voxfleet-stages").decode() in names, names
        assert "vf-loader" not in names  # none of the runtime's threads took the loader's name
    finally:
        host.close()
