"""Run `voxfleet api` as a user would (a process of its own), and always stop it."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from engines.commands.api import stop_gateway_process
from engines.pod.ports import free_port
from engines.pod.processes import ended_with_this_process


@contextlib.contextmanager
def running_gateway(
    *args: str, log: Path, ready_voice: str | None = "joe", timeout_s: float = 60.0
) -> Iterator[str]:
    """`voxfleet api ARGS --port FREE`; yields its base URL (http://127.0.0.1:PORT) once it
    answers (and, with `ready_voice`, once that voice has a ready endpoint)."""
    port = free_port()
    command = [sys.executable, "-m", "engines.cli", "api", *args, "--host", "127.0.0.1"]
    command += ["--port", str(port)]
    with open(log, "ab") as output:
        process = subprocess.Popen(
            ended_with_this_process(command), stdout=output, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            assert process.poll() is None, log.read_text(errors="replace")[-3000:]
            assert time.monotonic() < deadline, "gateway not ready:\n" + log.read_text()[-3000:]
            try:
                if ready_voice is None:
                    with urllib.request.urlopen(f"{base}/healthz", timeout=2):
                        break
                with urllib.request.urlopen(f"{base}/v1/audio/voices", timeout=2) as answer:
                    voices = json.loads(answer.read())["voices"]
                if any(v["id"] == ready_voice and v["ready_endpoints"] for v in voices):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        yield base
    finally:
        stop_gateway_process(process, timeout_s=30)
