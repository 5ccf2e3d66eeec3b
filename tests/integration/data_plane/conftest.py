from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

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
