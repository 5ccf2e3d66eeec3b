"""What sending a vocoder call's audio to a stream model costs the voice host's process:
`python -m lab.chunk_costs`.

    python -m lab.chunk_costs [--rows 5 30] [--calls 2000] [--runs 3]

The delivery thread sends each vocoder call's chunks to a stream model's connection as one
frame (`_Connection.send_chunks`, engines/pod/voice_host/server.py), and the connection's
writer thread writes it to the socket; both run Python under the interpreter's lock beside
the scheduler thread. This sends `--calls` calls of each of `--rows` windows of 128 frames
(32,768 int16 samples each) through a real connection over a Unix socket pair, a process of
its own draining the other end, and reports this process's CPU per call (the sending loop
and the connection's writer thread), each of `--runs` and their median.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
from typing import Any

import numpy as np

from engines.pod.voice_host.server import _Connection

SAMPLES = 128 * 256


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


def _drain(sock: socket.socket, other: socket.socket) -> int:
    """The stream model's end `sock`, in a process of its own (its reading is not this
    process's cost): reads everything until the socket closes; its pid."""
    pid = os.fork()
    if pid == 0:
        other.close()  # or the socket never closes: this process would hold it open
        received = 0
        while chunk := sock.recv(1 << 20):
            received += len(chunk)
        os._exit(0)
    return pid


def run_once(rows: int, calls: int) -> float:
    """This process's CPU per call, in microseconds: the sending loop and the writer."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    reader = _drain(theirs, ours)
    theirs.close()
    connection = _Connection(host=None, sock=ours)  # type: ignore[arg-type]
    pcm = (np.arange(rows * SAMPLES, dtype=np.int64) % 2000).astype(np.int16).reshape(rows, -1)
    started = _cpu()
    for call in range(calls):
        connection.send_chunks([(call * rows + row, pcm[row], False) for row in range(rows)])
    connection._out.put(None)
    connection._writer.join()
    used = _cpu() - started
    ours.close()
    os.waitpid(reader, 0)
    return used / calls * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.chunk_costs", description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[5, 30])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"calls": args.calls, "samples_a_row": SAMPLES, "rows": {}}
    for rows in args.rows:
        sent = [run_once(rows, args.calls) for _ in range(args.runs)]
        result["rows"][str(rows)] = {
            "us_a_call": [round(us, 1) for us in sent],
            "median_us": round(statistics.median(sent), 1),
        }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
