"""A CUDA MPS control daemon of the server's own: `voxfleet serve --mps`, and VOXFLEET_MPS=1
for `voxfleet triton` (a pool with `mps: true`).

Every Triton backend process (one per stream-model instance and voice) has a CUDA context of
its own. Without MPS the GPU takes those contexts in turns, so one process's encoder, a long
chain of small kernels, leaves most of the GPU idle while another process's vocoder call
waits. Under an MPS server the processes share one context and their kernels run side by
side. On the H100 through Triton, two instances under MPS served 1.13 to 1.16 times the audio
of two without at 500 and 1,000 streams, and the same at 2,000 (docs/history.md; the runs
and their spread are in git at 1ad14ac).

The daemon (`nvidia-cuda-mps-control -f`, in the foreground) is started before tritonserver
with its pipe and log directories in the supervisor's work directory; tritonserver, and so
every backend process it starts, gets CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY. It
ends with the process that started it, even one killed with SIGKILL, and is told to quit
once tritonserver has stopped. Triton restarts (healing a voice) keep it.

What MPS brings with it (NVIDIA's MPS documentation): one MPS server per GPU and user; a
fatal GPU fault in one client ends every client of that server, so every voice on the GPU is
restarted, not only the one at fault (the supervisor heals it as any dead backend); and the
GPU must be the pod's alone, not shared through the device plugin's own MPS or time-slicing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from engines.contract.names import MPS_ENV
from engines.pod.processes import ended_with_this_process
from engines.pod.triton_server import TritonError

CONTROL = "nvidia-cuda-mps-control"
PIPE_ENV, LOG_ENV = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


class MpsError(TritonError):
    """MPS was asked for and cannot run; the message says why and what to do."""


def mps_from_env(environ: dict[str, str] | None = None) -> bool:
    """Whether VOXFLEET_MPS asks for MPS: 1 or 0 (unset: 0); anything else is refused."""
    value = (os.environ if environ is None else environ).get(MPS_ENV, "0").strip()
    if value not in ("0", "1"):
        raise MpsError(f"{MPS_ENV} is 1 or 0, not {value!r}")
    return value == "1"


class MpsDaemon:
    """One `nvidia-cuda-mps-control -f` with its pipe and log directories under `directory`."""

    def __init__(self, directory: Path, control: str | None = None) -> None:
        self.pipe_dir = directory / "mps-pipe"
        self.log_dir = directory / "mps-log"
        self.control = control or shutil.which(CONTROL)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        """What a CUDA process needs in its environment to be a client of this daemon."""
        return {PIPE_ENV: str(self.pipe_dir), LOG_ENV: str(self.log_dir)}

    def ask(self, command: str) -> subprocess.CompletedProcess[bytes]:
        """One command to the daemon (`get_server_list`, `get_client_list PID`, `quit`)."""
        assert self.control is not None
        return subprocess.run(
            [self.control],
            input=command.encode() + b"\n",
            env={**os.environ, **self.env},
            capture_output=True,
            timeout=5,
            check=False,
        )

    def start(self) -> None:
        """Start the daemon and wait until it answers; MpsError where it cannot run. Call it
        from the thread that lives as long as the server (the main thread)."""
        if self.control is None:
            raise MpsError(
                f"MPS was asked for, but {CONTROL} is not on PATH: it ships with the NVIDIA "
                "driver's utilities (in a GPU container, with the driver the NVIDIA container "
                "toolkit mounts); install them or turn MPS off"
            )
        if os.environ.get(PIPE_ENV):
            raise MpsError(
                f"MPS was asked for, but {PIPE_ENV} is already set ({os.environ[PIPE_ENV]}): "
                "this process is already a client of another MPS daemon (the node's, say); "
                "turn voxfleet's MPS off to use that one"
            )
        self.pipe_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        output = self.log_dir / "voxfleet-control.out"
        with output.open("wb") as sink:
            self.process = subprocess.Popen(
                ended_with_this_process([self.control, "-f"]),
                env={**os.environ, **self.env},
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            code = self.process.poll()
            if code is not None:
                said = output.read_text(errors="replace").strip()[-400:]
                self.process = None
                raise MpsError(f"{CONTROL} -f exited with {code} at start: {said or 'no output'}")
            try:
                if self.ask("get_server_list").returncode == 0:
                    return
            except subprocess.TimeoutExpired:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise MpsError(f"{CONTROL} did not answer within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        """Tell the daemon to quit (its server with it) and wait; terminate it if it will not."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        try:
            self.ask("quit")
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
