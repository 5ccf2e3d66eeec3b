"""The bench counts a pod's every process, not only tritonserver's tree: the voice host runs
beside tritonserver under the same supervisor, and its busiest thread, by the name it gives
the kernel, is reported (`server.voice_host_threads`, `server.busiest_thread`)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from engines.bench.resources import ProcessTree, ResourceSampler, pod_of, thread_seconds

# A stand-in voice host: its command names the voice host's module; one named thread burns
# CPU, another sleeps.
VOICE_HOST = """
import time
from engines.streaming.threads import NamedThread
def burn():
    end = time.monotonic() + 30
    while time.monotonic() < end:
        sum(range(1000))
NamedThread(target=burn, name="voxfleet-scheduler", daemon=True).start()
NamedThread(target=time.sleep, args=(30,), name="voxfleet-delivery", daemon=True).start()
time.sleep(30)
"""
# A supervisor that starts a stand-in tritonserver (idle) and the stand-in voice host.
SUPERVISOR = f"""
import subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
host = subprocess.Popen([sys.executable, "-c", {VOICE_HOST!r}, "engines.pod.voice_host"])
print(server.pid, flush=True)
time.sleep(30)
"""


def test_the_server_is_the_whole_pod_and_its_busiest_thread_is_named() -> None:
    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True
    )
    try:
        assert supervisor.stdout is not None
        server_pid = int(supervisor.stdout.readline())
        deadline = time.monotonic() + 20
        while len(psutil.Process(supervisor.pid).children()) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        host = next(
            child
            for child in psutil.Process(supervisor.pid).children()
            if "engines.pod.voice_host" in child.cmdline()
        )
        while "vf-scheduler" not in {name for name, _ in thread_seconds(host).values()}:
            assert time.monotonic() < deadline, "the stand-in voice host never started"
            time.sleep(0.1)
        pod = pod_of(ProcessTree(server_pid, "tritonserver"))
        assert pod.pid == supervisor.pid
        assert {p.pid for p in pod.processes()} >= {supervisor.pid, server_pid}
        sampler = ResourceSampler(pod, interval_s=0.2)
        sampler.start()
        time.sleep(1.5)
        server = sampler.stop()
        threads = server["voice_host_threads"]
        assert threads["vf-scheduler"]["busy"] > 0.3
        assert threads["vf-delivery"]["busy"] < 0.1
        assert server["busiest_thread"]["name"] == "vf-scheduler"
        assert server["cpu_percent"] >= 100 * threads["vf-scheduler"]["busy"] * 0.8
        # A process with no voice host beside it is its own server.
        alone = ProcessTree(supervisor.pid, "supervisor")
        assert pod_of(alone) == alone
    finally:
        for child in psutil.Process(supervisor.pid).children(recursive=True):
            child.kill()
        supervisor.kill()
        supervisor.wait()


# A stand-in tritonserver with one backend stub under it, beside a stand-in voice host.
SERVER_WITH_STUB = """
import subprocess, sys, time
stub = [sys.executable, "-c", "import time; time.sleep(30)", "triton_python_" + "backend_stub"]
subprocess.Popen(stub)
time.sleep(30)
"""
SUPERVISOR_WITH_STUB = f"""
import subprocess, sys, time
server = subprocess.Popen([sys.executable, "-c", {SERVER_WITH_STUB!r}])
idle = "import time; time.sleep(30)"
host = subprocess.Popen([sys.executable, "-c", idle, "engines.pod.voice_host"])
print(server.pid, host.pid, flush=True)
time.sleep(30)
"""


def test_the_profile_samples_the_voice_host_beside_the_stubs() -> None:
    """The voice host runs every stage and scheduler of the pod: a profile of the stubs alone
    (the benchmark's before) showed only their response threads."""
    from engines.bench.profile import profiled_processes

    supervisor = subprocess.Popen(
        [sys.executable, "-c", SUPERVISOR_WITH_STUB], stdout=subprocess.PIPE, text=True
    )
    try:
        assert supervisor.stdout is not None
        server_pid, host_pid = (int(pid) for pid in supervisor.stdout.readline().split())
        deadline = time.monotonic() + 20
        while not psutil.Process(server_pid).children():
            assert time.monotonic() < deadline, "the stand-in stub never started"
            time.sleep(0.1)
        stub_pid = psutil.Process(server_pid).children()[0].pid
        sampled = profiled_processes(ProcessTree(server_pid, "tritonserver"))
        assert sampled == {host_pid: "voice host", stub_pid: "backend stub"}
    finally:
        for process in psutil.Process(supervisor.pid).children(recursive=True):
            process.kill()
        supervisor.kill()
        supervisor.wait()
