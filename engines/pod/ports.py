"""Ports for servers started later (tritonserver's, a test's or the e2e suite's processes).

A port the kernel hands out (bind to port 0) lies in its ephemeral range, the range it takes
the local ends of outgoing connections from. Between choosing such a port and the server
listening on it, any connection the machine opens can take it as its local end, and the server
then fails to start ("address already in use"); the e2e suite's kube-scheduler once found its
port so taken. `free_port` chooses from below that range, where no connection takes a port,
skips ports in use and never gives a port twice within a process.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
PORT_FLOOR = 20000  # free ports are chosen from here up to the ephemeral range
MIN_PORT_CHOICES = 1000
PORT_TRIES = 100
_given: set[int] = set()


def port_in_use(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def ephemeral_ports() -> tuple[int, int]:
    """The kernel's range for the local ends of outgoing connections (32768 to 60999 unless
    set otherwise)."""
    try:
        low, high = Path(EPHEMERAL_RANGE).read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, from below the ephemeral range; where the range leaves no
    room below it (or every try was taken), one the kernel chooses."""
    low, _ = ephemeral_ports()
    if low - PORT_FLOOR >= MIN_PORT_CHOICES:
        for _ in range(PORT_TRIES):
            port = random.randrange(PORT_FLOOR, low)
            if port not in _given and not port_in_use(host, port):
                _given.add(port)
                return port
    with socket.socket() as sock:
        sock.bind((host, 0))
        port = int(sock.getsockname()[1])
    _given.add(port)
    return port
