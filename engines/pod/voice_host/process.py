"""`VoiceHostProcess`: the pod's voice host as a child process, started before tritonserver.

`voxfleet serve`, `voxfleet triton` (a pool pod) and `TritonServer` (the tests) start one and
give tritonserver its socket (`VOXFLEET_VOICE_HOST`), so that every stream model reaches the
same host. It ends with the process that started it, even killed with SIGKILL.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engines.contract import names

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class VoiceHostError(RuntimeError):
    """The voice host could not start."""


@dataclass(frozen=True)
class HostOptions:
    """How a pod's voice host places and runs voices (`python -m engines.pod.voice_host`
    options)."""

    memory_mib: int = 0  # the pool's declared memory (0: the device's own)
    margin_mib: int = names.MEMORY_MARGIN_MIB
    cpu_threads: int = 0  # threads per onnxruntime call (0: the CPUs the process may use)
    frontend_workers: int | None = None  # phonemiser processes (None: 4 on a GPU, else none)
    # Serving plans (JSON files) whose architectures the host starts at once, before their
    # voices are loaded (`voxfleet serve` knows its voices before tritonserver starts).
    prepare: tuple[str, ...] = ()

    def arguments(self) -> list[str]:
        workers = (
            [] if self.frontend_workers is None else [f"--frontend-workers={self.frontend_workers}"]
        )
        return [
            f"--memory-mib={self.memory_mib}",
            f"--margin-mib={self.margin_mib}",
            f"--cpu-threads={self.cpu_threads}",
            *workers,
            *(f"--prepare={path}" for path in self.prepare),
        ]


class VoiceHostProcess:
    def __init__(
        self,
        work_dir: Path,
        env: Mapping[str, str] | None = None,
        options: HostOptions | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.socket_path = work_dir / "voice-host.sock"
        self.env = dict(env if env is not None else os.environ)
        self.options = options or HostOptions()
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        from engines.pod.processes import ended_with_this_process

        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.socket_path.unlink(missing_ok=True)
        command = [
            sys.executable,
            "-m",
            "engines.pod.voice_host",
            f"--socket={self.socket_path}",
            *self.options.arguments(),
        ]
        log = open(self.log_path, "ab") if self.log_path else None
        try:
            self.process = subprocess.Popen(
                ended_with_this_process(command),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
                start_new_session=True,
            )
        finally:
            if log is not None:
                log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise VoiceHostError(f"the voice host exited with {self.process.returncode}")
            if self._answers():
                return
            time.sleep(0.05)
        self.stop()
        raise VoiceHostError(f"the voice host did not start in {timeout_s:.0f} s")

    def _answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.socket_path))
            except OSError:
                return False
        return True

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def stop(self) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=STOP_TIMEOUT_S)
        self.socket_path.unlink(missing_ok=True)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=STOP_TIMEOUT_S)
        self.socket_path.unlink(missing_ok=True)

    def tritonserver_env(self, env: Mapping[str, str]) -> dict[str, str]:
        """tritonserver's environment: the host's socket for its stream models, and no GPU
        (the stream models hold no CUDA context: the host runs the voices)."""
        return {**env, names.VOICE_HOST_ENV: str(self.socket_path), "CUDA_VISIBLE_DEVICES": ""}
