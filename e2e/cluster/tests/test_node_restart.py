"""A node process that dies while it starts is started again, as systemd restarts a real
node's kubelet; one that keeps dying is reported with its log."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from cluster.node import Node, NodeError
from cluster.processes import Supervised

# Dies on its first start (as kubelet 1.35.4 now and then does), comes up on its second.
FLAKY = """
if [ -e "$1/started" ]; then touch "$1/ready"; exec sleep 60; fi
touch "$1/started"; echo "fatal error: concurrent map iteration and map write"; exit 2
"""


def wait_for(tmp_path: Path, retries: int) -> Supervised:
    process = Supervised("kubelet", ["sh", "-c", FLAKY, "sh", str(tmp_path)], tmp_path / "log", {})
    process.start()
    node = SimpleNamespace(processes={"kubelet": process})
    try:
        Node._wait(node, "kubelet", (tmp_path / "ready").exists, "ready", 10.0, retries)  # type: ignore[arg-type]
    finally:
        process.stop(grace_s=1.0)
    return process


def test_a_kubelet_that_dies_while_it_starts_is_started_again(tmp_path: Path) -> None:
    wait_for(tmp_path, retries=1)

    assert (tmp_path / "ready").exists()
    assert "fatal error" in (tmp_path / "log").read_text()  # the first start's log is kept


def test_without_retries_its_death_is_the_error(tmp_path: Path) -> None:
    died = r"(?s)kubelet exited with code 2.*concurrent map iteration"
    with pytest.raises(NodeError, match=died):
        wait_for(tmp_path, retries=0)
    assert not (tmp_path / "ready").exists()
