from __future__ import annotations

from pathlib import Path

import pytest

from engines.build.engine_build import build_engines
from engines.runtimes.onnx import OnnxStages
from engines.text.voice import Voice, load_voice


@pytest.fixture(scope="session")
def joe() -> Voice:
    return load_voice("joe")


@pytest.fixture(scope="session")
def engine_dir(joe: Voice, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The joe voice split into stages once per test session."""
    cache = tmp_path_factory.mktemp("engines")
    return build_engines(joe.model_path, "onnxruntime", None, cache).path


@pytest.fixture(scope="session")
def stages(engine_dir: Path) -> OnnxStages:
    """The split joe voice on onnxruntime, loaded once per test session."""
    return OnnxStages(engine_dir)


@pytest.fixture(scope="session")
def joe_plan(joe: Voice, engine_dir: Path):
    """A serving plan of the joe voice on onnxruntime (its engines built above)."""
    from engines.contract.plan import ServingPlan

    return ServingPlan("joe", str(engine_dir), voice_config_path=str(joe.config_path))
