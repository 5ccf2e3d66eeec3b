"""Long-running processes the suite starts and must see die: the control plane's.

`Supervised` starts a binary with its output in a log file, checks first that every port it
will listen on is free (a port in use is reported with the process's name and the flag that
set it), and, once started, answers `failure()` with the process's exit code and the last
lines of its log if it has exited without being asked to. `stop()` sends SIGTERM, then
SIGKILL after a grace period. A supervised process dies with the Python process that
started it (PR_SET_PDEATHSIG), so a test run killed without its cleanup leaves none behind.
`stop_on_sigterm` makes a SIGTERM (a CI's timeout, `kill`) unwind the suite as Ctrl-C does, so
that its cleanup runs: a terminated Python process otherwise runs no `finally`, and the
node's containers, which are not its children, went on serving.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# Every port the suite chooses comes from the product's picker (below the ephemeral range).
from engines.pod.ports import free_port as free_port  # the suite's modules import it from here
from engines.pod.ports import port_in_use

LOG_TAIL_LINES = 30


class ControlPlaneError(RuntimeError):
    """A control-plane process could not start, or died."""


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def die_with_parent() -> None:
    """In a child before it runs its program (`preexec_fn`): SIGKILL when its parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def stop_on_sigterm() -> None:
    """From now on a SIGTERM to this process raises KeyboardInterrupt in its main thread, so
    that the `finally` blocks and fixtures' teardowns that stop what it started run (pytest
    ends the session and tears its fixtures down on KeyboardInterrupt)."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"terminated by signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)


class Supervised:
    """One process: `name` (as users know it), its argv, its ports by flag."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        ports: Mapping[str, int],
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.ports = dict(ports)
        self.host = host
        self.env = dict(env) if env is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        self.stopping = False

    def start(self) -> None:
        for flag, port in self.ports.items():
            if port_in_use(self.host, port):
                raise ControlPlaneError(
                    f"{self.name}: port {self.host}:{port} ({flag}) is in use by another "
                    "process; stop it or let the suite choose free ports"
                )
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=die_with_parent,
                env=self.env,
            )

    def failure(self) -> str | None:
        """Why the process is no longer running, if it exited unasked; else None."""
        if self.process is None or self.stopping:
            return None
        code = self.process.poll()
        if code is None:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"{self.name} {how}; the last lines of its log ({self.log_path}):\n" + log_tail(
            self.log_path
        )

    def check(self) -> None:
        reason = self.failure()
        if reason:
            raise ControlPlaneError(reason)

    def stop(self, grace_s: float = 10.0) -> None:
        self.stopping = True
        process = self.process
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
