"""Ports chosen for servers started later (engines/pod/ports.py: tritonserver's, the tests'
and the e2e suite's processes): none can be taken meanwhile as the local end of a connection,
none is given twice, none is in use."""

from __future__ import annotations

import random
import socket

import pytest

from engines.pod import ports
from engines.pod.ports import ephemeral_ports, free_port, port_in_use


def test_chosen_ports_lie_below_the_range_connections_take_their_ports_from() -> None:
    low, high = ephemeral_ports()
    chosen = [free_port() for _ in range(50)]
    assert len(set(chosen)) == len(chosen)
    assert all(ports.PORT_FLOOR <= port < low for port in chosen), (chosen, low, high)
    assert not any(port_in_use("127.0.0.1", port) for port in chosen)
    # The local ends of connections opened meanwhile never meet them.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        clients = [socket.create_connection(server.getsockname()) for _ in range(50)]
        try:
            assert not {c.getsockname()[1] for c in clients} & set(chosen)
        finally:
            for client in clients:
                client.close()


def test_a_port_in_use_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", ports.PORT_FLOOR + 7))
        taken.listen(1)
        picks = iter([ports.PORT_FLOOR + 7, ports.PORT_FLOOR + 8])
        monkeypatch.setattr(random, "randrange", lambda low, high: next(picks))
        monkeypatch.setattr(ports, "_given", set())
        assert free_port() == ports.PORT_FLOOR + 8


def test_without_room_below_the_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_ports", lambda: (ports.PORT_FLOOR + 10, 60999))
    port = free_port()
    assert port >= ports.PORT_FLOOR + 10 and not port_in_use("127.0.0.1", port)
