"""Child processes that end with the process that started them (tritonserver, the voice host,
the MPS daemon, the speech API): a server left behind keeps its ports and the GPU's memory.
And tritonserver's own children, its Python-backend stubs, end with it (`end_process_group`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

# Run as `python -c LAUNCHER PARENT_PID COMMAND...`: ask Linux to send SIGTERM to this
# process when the thread that started it ends (PR_SET_PDEATHSIG, which execv keeps), give up
# if that parent is already gone, then become COMMAND. SIGTERM is Triton's graceful stop: it
# ends its backend processes and their shared memory before it exits. Where the request
# fails, the server still starts (a warning says so).
_LAUNCHER = """
import os, sys
try:
    import ctypes, signal
    if ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM) != 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
except Exception as error:
    print(f"voxfleet: tritonserver will not stop with its parent: {error}", file=sys.stderr)
if os.getppid() != int(sys.argv[1]):
    sys.exit("voxfleet: the process that started tritonserver is gone")
os.execv(sys.argv[2], sys.argv[2:])
"""


def ended_with_this_process(command: list[str]) -> list[str]:
    """`command`, run so that it is stopped (SIGTERM) when the thread starting it ends, even
    killed with SIGKILL: a tritonserver left behind keeps its ports and the GPU's memory.
    Linux only (elsewhere `command` as it is); start it from a thread that lives as long as
    the server should (the main thread)."""
    if not sys.platform.startswith("linux"):
        return list(command)
    return [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *command]


def exit_status(process: subprocess.Popen[Any]) -> int | None:
    """`process`'s exit status once it has exited (negative: the signal that ended it), None
    while it runs. Unlike `Popen.poll`, it leaves an exited process unreaped, so that its pid,
    and the id of the process group it leads, stay its own until `end_process_group`."""
    if process.returncode is not None:
        return process.returncode
    if not hasattr(os, "waitid"):
        return process.poll()
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped already
        return process.poll()
    if info is None:
        return None
    if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return -info.si_status
    return info.si_status


def end_process_group(
    process: subprocess.Popen[Any], signum: int | None = None, timeout_s: float = 0.0
) -> int:
    """End `process`, which leads a process group of its own (started with
    `start_new_session=True`), and whatever else is left in its group; returns its status.

    `signum` first (None: none), up to `timeout_s` for it to exit, then SIGKILL to the whole
    group, and the process reaped. tritonserver's Python-backend stubs are in its group: they
    ignore SIGTERM and SIGINT and end by themselves only when they notice their server gone,
    which a stub that hangs on its way out never does. A server that exits without unloading
    its models (its exit timeout ran out, or it crashed) would leave them running, reparented
    to init, holding their memory: one was found alive an hour after the tests had ended."""
    if signum is not None and exit_status(process) is None:
        try:
            os.kill(process.pid, signum)  # unreaped: still this process, at worst a zombie
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + timeout_s
        while exit_status(process) is None and time.monotonic() < deadline:
            time.sleep(0.05)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing is left in the group (and its id was no longer ours)
    return process.wait(timeout=30)
