"""Ports the suite chooses before it starts its processes (e2e/cluster/processes.py): none can
be taken meanwhile as the local end of a connection, none is given twice, none is in use."""

from __future__ import annotations

import random
import socket

import pytest
from cluster import processes
from cluster.processes import ephemeral_ports, free_port, port_in_use


def test_chosen_ports_lie_below_the_range_connections_take_their_ports_from() -> None:
    low, high = ephemeral_ports()
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(processes.PORT_FLOOR <= port < low for port in ports), (ports, low, high)
    assert not any(port_in_use("127.0.0.1", port) for port in ports)
    # The local ends of connections opened meanwhile never meet them.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            assert not {c.getsockname()[1] for c in clients} & set(ports)
        finally:
            for client in clients:
                client.close()


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", processes.PORT_FLOOR + 7))
        taken.listen(1)
        picks = iter([processes.PORT_FLOOR + 7, processes.PORT_FLOOR + 8])
        monkeypatch.setattr(random, "randrange", lambda low, high: next(picks))
        monkeypatch.setattr(processes, "_given", set())
        assert free_port() == processes.PORT_FLOOR + 8


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(processes, "ephemeral_ports", lambda: (processes.PORT_FLOOR + 10, 60999))
    port = free_port()
    assert port >= processes.PORT_FLOOR + 10 and not port_in_use("127.0.0.1", port)
