"""voxfleet's own CUDA MPS daemon on a real GPU (marked `gpu`; skipped where CUDA or
nvidia-cuda-mps-control is absent): its clients share one MPS server, `stop` ends both, and
a killed owner leaves no daemon behind. The whole server under MPS: `MPS=1 bash
tests/gpu/triton_session.sh` (`voxfleet serve --mps`)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from engines.pod.mps import CONTROL, MpsDaemon

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(shutil.which(CONTROL) is None, reason=f"needs {CONTROL}"),
]
REPO = Path(__file__).resolve().parents[2]
CLIENT = (
    "import time, torch; x = torch.ones(1 << 20, device='cuda'); y = (x * 2).sum().item(); "
    "print('up', flush=True); time.sleep(60)"
)
OWNER = (
    "import sys, time; from pathlib import Path; from engines.pod.mps import MpsDaemon; "
    "d = MpsDaemon(Path(sys.argv[1])); d.start(); print(d.process.pid, flush=True); time.sleep(60)"
)


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.1)
    return False


def test_clients_share_the_daemons_server_and_stop_ends_both(tmp_path: Path) -> None:
    daemon = MpsDaemon(tmp_path)
    daemon.start()
    assert daemon.process is not None
    control = daemon.process.pid
    clients: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(2):
            clients.append(
                subprocess.Popen(
                    [sys.executable, "-c", CLIENT],
                    env={**os.environ, **daemon.env},
                    stdout=subprocess.PIPE,
                )
            )
        for client in clients:
            assert client.stdout is not None and client.stdout.readline().strip() == b"up"
        servers = daemon.ask("get_server_list").stdout.split()
        assert len(servers) == 1, servers  # one shared server, not a context per process
        server = int(servers[0])
        listed = {int(pid) for pid in daemon.ask(f"get_client_list {server}").stdout.split()}
        assert {client.pid for client in clients} <= listed, listed
    finally:
        for client in clients:
            client.kill()
            client.wait()
        daemon.stop()
    assert daemon.process is None
    assert _gone(control, 10) and _gone(server, 10)


def test_a_killed_owner_takes_its_daemon_with_it(tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
    )
    try:
        assert owner.stdout is not None
        control = int(owner.stdout.readline())
        assert psutil.pid_exists(control)
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        assert _gone(control, 10)
    finally:
        owner.kill()
        owner.wait()
