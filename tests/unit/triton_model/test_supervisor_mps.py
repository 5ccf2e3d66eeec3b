"""MPS asked for where it cannot run is refused with the reason, before any tritonserver starts.
The daemon's own start, its clients and its stop need a GPU: tests/gpu/test_mps_gpu.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from engines.pod.mps import MpsDaemon, MpsError, mps_from_env
from engines.pod.ports import free_port
from engines.pod.supervisor import Supervisor, TritonEndpoints

REPO = Path(__file__).resolve().parents[3]


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_mps_without_its_control_program_stops_the_start_before_triton(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-cuda-mps-control on it
    port = free_port()
    supervisor = Supervisor(
        ["sleep", "30"],  # never started: the refusal comes first
        {},
        TritonEndpoints(),
        tmp_path / "work",
        health_port=port,
        health_host="127.0.0.1",
        mps=MpsDaemon(tmp_path / "work"),
    )
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control is not on PATH"):
        supervisor.start()
    assert supervisor.process is None
    assert not _port_open(port)  # no health port answering "ready" for a server that is not


def test_a_control_program_that_exits_at_start_is_reported(tmp_path: Path) -> None:
    daemon = MpsDaemon(tmp_path, control="/bin/false")
    with pytest.raises(MpsError, match="nvidia-cuda-mps-control -f exited with 1 at start"):
        daemon.start()
    assert daemon.process is None
    daemon.stop()  # nothing to stop: no error


def test_a_client_of_another_daemon_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/run/node-mps")
    with pytest.raises(MpsError, match=r"CUDA_MPS_PIPE_DIRECTORY is already set \(/run/node-mps\)"):
        MpsDaemon(tmp_path, control="/bin/true").start()


def test_the_daemons_clients_get_its_private_directories(tmp_path: Path) -> None:
    env = MpsDaemon(tmp_path, control="/bin/true").env
    assert env == {
        "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "mps-pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(tmp_path / "mps-log"),
    }


def test_voxfleet_mps_is_one_or_zero() -> None:
    assert mps_from_env({}) is False
    assert mps_from_env({"VOXFLEET_MPS": "0"}) is False
    assert mps_from_env({"VOXFLEET_MPS": "1"}) is True
    with pytest.raises(MpsError, match="VOXFLEET_MPS is 1 or 0, not 'yes'"):
        mps_from_env({"VOXFLEET_MPS": "yes"})


def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engines.cli", *args],
        cwd=REPO,
        env={**os.environ, "PATH": str(tmp_path), "HOME": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_pool_pod_asking_for_mps_without_it_exits_with_the_reason(tmp_path: Path) -> None:
    health = free_port()
    result = _cli(
        tmp_path,
        "triton",
        f"--http-port={free_port()}",
        VOXFLEET_MPS="1",
        VOXFLEET_HEALTH_PORT=str(health),
    )
    assert result.returncode == 2, result.stderr
    assert "voxfleet triton: MPS was asked for, but nvidia-cuda-mps-control" in result.stderr
    bad = _cli(tmp_path, "triton", VOXFLEET_MPS="on")
    assert bad.returncode == 2
    assert "VOXFLEET_MPS is 1 or 0, not 'on'" in bad.stderr


def test_serve_refuses_mps_on_a_cpu_runtime(tmp_path: Path) -> None:
    result = _cli(tmp_path, "serve", "--voice", "joe", "--mps")
    assert result.returncode == 1
    assert "--mps shares a GPU between backend processes; the onnxruntime runtime" in (
        result.stderr
    )
