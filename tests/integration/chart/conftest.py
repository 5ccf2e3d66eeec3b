"""Shared, expensive-once fixtures of tests/integration/chart."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import ROOT, chart_pools_file, load_yaml_documents, voxfleet_render

EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


@pytest.fixture(scope="session")
def example_voices() -> list[dict[str, Any]]:
    assert EXAMPLES, "manifests/examples/ is empty"
    return [d for path in EXAMPLES for d in load_yaml_documents(path)]


@pytest.fixture(scope="session")
def rendered_children(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every object `voxfleet render` makes for the examples with the chart's default pools,
    the repository-key Secret included."""
    directory = tmp_path_factory.mktemp("render")
    key = directory / "repository-key"
    key.write_text("0123456789abcdef0123456789abcdef")
    args = ["--pools", str(chart_pools_file(directory)), "--namespace", "speech"]
    args += ["--repository-key-file", str(key)]
    for example in EXAMPLES:
        args += ["-f", str(example)]
    return voxfleet_render(*args)
