"""Shared, expensive-once fixtures of tests/chart."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import ROOT, by_kind, helm_template, load_yaml_documents, run

EXAMPLES = sorted((ROOT / "manifests" / "examples").glob("*.yaml"))


def chart_pools_file(directory: Path, *helm_args: str) -> Path:
    """The pools file exactly as the chart mounts it into the operator."""
    objects = helm_template("helm", *helm_args)
    configmap = next(c for c in by_kind(objects, "ConfigMap") if "pools.yaml" in c["data"])
    path = directory / "pools.yaml"
    path.write_text(configmap["data"]["pools.yaml"])
    return path


def voxfleet_render(*args: str) -> list[dict[str, Any]]:
    result = run([sys.executable, "-m", "engines.cli", "render", *args])
    assert result.returncode == 0, f"voxfleet render {' '.join(args)} failed:\n{result.stderr}"
    return [d for d in yaml.safe_load_all(result.stdout) if d]


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
