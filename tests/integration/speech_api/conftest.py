from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from gateway import running_gateway

from engines.commands.local_serving import local_server, plan_local_voices
from engines.pod.triton_server import TritonServer


@pytest.fixture(scope="session")
def engine_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-cache")


@pytest.fixture(scope="module")
def server(engine_cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver with the joe voice on the CPU."""
    plan = plan_local_voices(["joe"], engine_cache)
    triton = local_server(plan, work_dir=tmp_path_factory.mktemp("triton"))
    with triton.start():
        yield triton


@pytest.fixture(scope="module")
def busy_server(
    engine_cache: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonServer]:
    """A second joe server that holds one stream at a time (max_streams_per_pod 1), and paces
    each stream at about real time (max_lead_ms), so that a long text holds it for seconds."""
    plans = [
        replace(p, max_streams_per_pod=1, windows=replace(p.windows, max_lead_ms=500))
        for p in plan_local_voices(["joe"], engine_cache)
    ]
    triton = local_server(plans, work_dir=tmp_path_factory.mktemp("triton-busy"))
    with triton.start():
        yield triton


@pytest.fixture(scope="module")
def gateway(server: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`voxfleet api` in front of `server`; its base URL."""
    log = tmp_path_factory.mktemp("gateway") / "gateway.log"
    with running_gateway("--upstream", server.grpc_url, log=log) as base:
        yield base
