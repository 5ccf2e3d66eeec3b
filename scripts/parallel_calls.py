"""Do two single-threaded onnxruntime calls at once decode more than one call over two threads?

The joe voice's vocoder, 144-frame windows (a steady window with its context), 20 calls per
way, three rounds: one after another on a session with every CPU thread, then split over two
Python threads on a session with one intra-op thread each (onnxruntime releases the GIL while
it runs). docs/benchmarks.md quotes it: the answer decided against single-threaded "lanes".

    .venv/bin/python scripts/parallel_calls.py
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from engines.engine_build import build_engines
from engines.runtime import OnnxStages, cpu_threads
from engines.voice import load_voice

CALLS = 20
FRAMES = 144


def main() -> None:
    voice = load_voice("joe")
    entry = build_engines(voice.model_path, "onnxruntime", None, Path(tempfile.mkdtemp()))
    lanes = cpu_threads()
    wide, narrow = OnnxStages(entry.path, lanes), OnnxStages(entry.path, 1)
    latent = np.random.default_rng(0).standard_normal((1, 192, FRAMES)).astype(np.float32)
    wide.vocode(latent), narrow.vocode(latent)

    def narrow_share() -> None:
        for _ in range(CALLS // lanes):
            narrow.vocode(latent)

    for _ in range(3):
        started = time.perf_counter()
        for _ in range(CALLS):
            wide.vocode(latent)
        one_by_one = time.perf_counter() - started
        threads = [threading.Thread(target=narrow_share) for _ in range(lanes)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        side_by_side = time.perf_counter() - started
        print(
            f"{CALLS} vocoder calls of {FRAMES} frames: one after another over {lanes} threads "
            f"{one_by_one:.2f} s; {lanes} single-threaded at once {side_by_side:.2f} s "
            f"({one_by_one / side_by_side:.2f}x)"
        )


if __name__ == "__main__":
    main()
