"""`voxfleet say --json` first audio against the same request timed in-process, 5 times each,
on one freshly started `voxfleet serve` (run from the repository root with the venv's Python:
.venv/bin/python scripts/say_first_audio.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from engines.bench.faults import start, stop
from engines.client import synthesize

TEXT = "Hello from voxfleet."


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="voxfleet-say-"))
    server = start(work)
    try:
        synthesize(server.grpc, "Warm up.")
        says, in_process = [], []
        for _ in range(5):
            command = [sys.executable, "-m", "engines.cli", "say", TEXT, "--json"]
            command += ["-o", str(work / "say.wav"), "--url", server.grpc]
            out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
            says.append(json.loads(out)["first_audio_ms"])
            first = synthesize(server.grpc, TEXT).first_audio_s or 0.0
            in_process.append(round(first * 1000, 1))
        print("voxfleet say --json first_audio_ms:", says)
        print("in-process synthesize first audio, ms:", in_process)
    finally:
        stop(server)


if __name__ == "__main__":
    main()
