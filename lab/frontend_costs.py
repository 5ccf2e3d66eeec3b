"""What phonemising in worker processes costs the process that asks: `python -m lab.frontend_costs`.

    python -m lab.frontend_costs [--workers 4] [--rate 300] [--requests 1500] [--runs 3]

A GPU voice host phonemises every request in a pool of worker processes
(engines/text/frontend_pool.py), and whatever the pool does in the voice host's own process
takes the interpreter's lock from the scheduler thread. This submits `--requests` short
sentences (the corpus's first three in turn) at `--rate` a second to a fresh pool of the joe
voice and reports, per run, the asking process's CPU time per request (every thread of it:
the submitting loop, the pool's threads, its pipes' system calls), and the same loop's cost
with a pool that answers at once in the caller (`loop_us`), which is the script's own share.
A pool's own cost is the difference.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Any

from engines.text.frontend_pool import FrontendPool
from engines.text.voice import load_voice

TEXTS = (
    "Four score and seven years ago.",
    "Our fathers brought forth a new nation!",
    "Good morning, how can I help you today?",
)


class _AtOnce:
    """A pool that answers in the caller: the measuring loop's own cost."""

    def submit(self, config_path: str, text: str, done: Any) -> None:
        done([], None)

    def close(self) -> None:
        pass


def _cpu() -> float:
    times = os.times()
    return times.user + times.system  # this process's own threads, not its children


def run_once(pool: Any, config: str, requests: int, rate: float) -> float:
    """Microseconds of this process's CPU per request while `pool` phonemises them."""
    answered = threading.Semaphore(0)
    errors: list[Exception] = []

    def done(sentences: Any, error: Exception | None) -> None:
        if error is not None:
            errors.append(error)
        answered.release()

    started_cpu, started = _cpu(), time.perf_counter()
    for index in range(requests):
        pool.submit(config, TEXTS[index % len(TEXTS)], done)
        delay = started + (index + 1) / rate - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
    for _ in range(requests):
        answered.acquire()
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, the first: {errors[0]}")
    return (_cpu() - started_cpu) / requests * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.frontend_costs", description=__doc__)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=300.0, help="requests a second")
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--runs", type=int, default=3, help="fresh pools, one after another")
    args = parser.parse_args(argv)
    config = str(load_voice("joe").config_path)
    pool_us, loop_us = [], []
    for _ in range(args.runs):
        pool = FrontendPool(args.workers, config)
        try:
            run_once(pool, config, 30, args.rate)  # each worker's first sentences
            pool_us.append(run_once(pool, config, args.requests, args.rate))
        finally:
            pool.close()
        loop_us.append(run_once(_AtOnce(), config, args.requests, args.rate))
    result = {
        "workers": args.workers,
        "rate": args.rate,
        "requests": args.requests,
        "pool_us": [round(us, 1) for us in pool_us],
        "loop_us": [round(us, 1) for us in loop_us],
        "pool_own_us_median": round(statistics.median(pool_us) - statistics.median(loop_us), 1),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
