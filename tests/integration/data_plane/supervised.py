"""Start `voxfleet serve` / `voxfleet triton` as a user would, and always stop them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psutil

from engines.client.tts import StreamResult, synthesize
from engines.contract import names
from engines.pod.ports import free_port
from lab.faults import stop_process_tree


@dataclass
class Served:
    process: subprocess.Popen[str]
    grpc_port: int
    http_port: int
    metrics_port: int
    health_port: int
    output: list[str] = field(default_factory=list)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def get(self, port: int, path: str) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as reply:
                return int(reply.status)
        except urllib.error.HTTPError as error:
            return int(error.code)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return 0

    def ready(self) -> int:
        return self.get(self.health_port, names.READY_PATH)

    def live(self) -> int:
        return self.get(self.health_port, names.LIVE_PATH)

    def metric(self, family: str) -> float | None:
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=2) as reply:
                text = reply.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return None
        # Summed over the voice's instances where there are several (labelled model_instance).
        pattern = rf'^{family}\{{model="joe"(?:,model_instance="[^"]*")?\}} ([0-9.e+-]+)$'
        found = re.findall(pattern, text, re.M)
        return sum(float(value) for value in found) if found else None

    def stubs(self) -> list[psutil.Process]:
        """The backend stubs running now (one that ends while they are listed is not)."""
        found = []
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                if child.name() == "triton_python_backend_stub":
                    found.append(child)
            except psutil.NoSuchProcess:
                continue
        return found

    def wait_for(self, condition: Callable[[], bool], timeout_s: float) -> float | None:
        """Seconds until `condition` held, or None."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if condition():
                return time.monotonic() - started
            time.sleep(0.05)
        return None


def _stop(process: subprocess.Popen[str]) -> None:
    """Whatever happened, nothing of the server outlives the test."""
    stop_process_tree(process, grace_s=20)


@contextmanager
def running(
    command: list[str],
    ports: tuple[int, int, int, int],
    env: dict[str, str] | None = None,
    ignore_sigint: bool = False,
    ready_line: str | None = "voxfleet: ready",
    timeout_s: float = 180,
) -> Iterator[Served]:
    def preexec() -> None:
        if ignore_sigint:  # as a background job of a script
            signal.signal(signal.SIGINT, signal.SIG_IGN)

    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **(env or {})},
        preexec_fn=preexec,
    )
    served = Served(process, *ports)
    ready = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            served.output.append(line)
            if ready_line and ready_line in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        if ready_line:
            deadline = time.monotonic() + timeout_s
            while not ready.wait(0.2):
                assert process.poll() is None, "".join(served.output[-40:])
                assert time.monotonic() < deadline, "not ready:\n" + "".join(served.output[-40:])
        yield served
    finally:
        _stop(process)
        reader.join(timeout=5)


def serve_command(engine_cache: str) -> tuple[list[str], tuple[int, int, int, int]]:
    ports = (free_port(), free_port(), free_port(), free_port())
    command = [
        sys.executable,
        "-m",
        "engines.cli",
        "serve",
        "--cache",
        engine_cache,
        "--grpc-port",
        str(ports[0]),
        "--http-port",
        str(ports[1]),
        "--metrics-port",
        str(ports[2]),
        "--health-port",
        str(ports[3]),
    ]
    return command, ports


LONG = "This is a sentence that takes a few seconds to say out loud. " * 3


Results = dict[int, tuple[StreamResult | Exception, float]]


def talk_in_background(
    url: str, count: int, text: str = LONG
) -> tuple[list[threading.Thread], Results]:
    """`count` listeners; each result is (StreamResult or exception, monotonic end time)."""
    results: Results = {}

    def talk(n: int) -> None:
        try:
            outcome: StreamResult | Exception = synthesize(url, text, timeout_s=60)
        except Exception as error:  # the test looks at it
            outcome = error
        results[n] = (outcome, time.monotonic())

    threads = [threading.Thread(target=talk, args=(n,), daemon=True) for n in range(count)]
    for thread in threads:
        thread.start()
    return threads, results
