"""Child processes that end with the process that started them (tritonserver, the voice host,
the MPS daemon, the speech API): a server left behind keeps its ports and the GPU's memory."""

from __future__ import annotations

import os
import sys

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
