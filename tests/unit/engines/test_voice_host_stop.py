"""A stopped voice host exits promptly: its server is gone (SIGTERM from the parent-death
signal) and every second it lives on it holds the device's memory and its socket."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from engines.pod.voice_host.server import STOP_GRACE_S

ROOT = Path(__file__).resolve().parents[3]

# The host's own main, with a close that never returns (a scheduler stuck in a call, a
# delivery thread blocked on a peer that reads nothing).
_HOST_WITH_A_STUCK_CLOSE = """
import sys, threading
from engines.pod.voice_host import server
server.VoiceHost.close = lambda self: threading.Event().wait()
sys.exit(server.main(sys.argv[1:]))
"""


def test_a_host_whose_close_hangs_still_exits_soon_after_sigterm(tmp_path: Path) -> None:
    socket_path = tmp_path / "host.sock"
    process = subprocess.Popen(
        [sys.executable, "-c", _HOST_WITH_A_STUCK_CLOSE, "--socket", str(socket_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while not socket_path.exists():
            assert process.poll() is None, "the host exited before it served"
            assert time.monotonic() < deadline, "the host never served its socket"
            time.sleep(0.05)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = process.wait(timeout=STOP_GRACE_S + 15)
        took = time.monotonic() - started
        assert code == 0
        assert took < STOP_GRACE_S + 5, f"exited {took:.1f} s after SIGTERM"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
