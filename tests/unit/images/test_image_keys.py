"""`make images` rebuilds an image when what goes into it changes, and only then: its key
covers the Dockerfile, its ignore file and the build context the ignore file lets through."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[3]


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_images", ROOT / "scripts/build-images.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def script(tmp_path: Path) -> ModuleType:
    """The script over a copy of the repository's image inputs in `tmp_path`."""
    module = load_script()
    for name in ("pyproject.toml", "README.md", "docker"):
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tmp_path / name)
        else:
            shutil.copy(source, tmp_path / name)
    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "cli.py").write_text("print('voxfleet')\n")
    (tmp_path / "operator").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("a page\n")
    module.ROOT = tmp_path
    return module


def key(script: ModuleType, name: str = "operator") -> str:
    return str(script.image_key(script.IMAGES[name], "base-recipe"))


def test_the_context_is_what_the_ignore_file_lets_through(script: ModuleType) -> None:
    (script.ROOT / "engines" / "__pycache__").mkdir()
    (script.ROOT / "engines" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\0")
    rules = script.ignore_rules(script.ROOT / "docker/operator.Dockerfile.dockerignore")
    files = script.context_files(rules)
    assert "engines/cli.py" in files and "pyproject.toml" in files and "README.md" in files
    assert not [f for f in files if f.startswith(("docs/", "docker/")) or f.endswith(".pyc")]


def test_a_change_to_the_context_or_the_dockerfile_changes_the_key(script: ModuleType) -> None:
    before = key(script)
    assert key(script) == before  # the same inputs, the same key: nothing to build
    (script.ROOT / "engines" / "cli.py").write_text("print('changed')\n")
    after_source = key(script)
    assert after_source != before
    dockerfile = script.ROOT / "docker/operator.Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "\n# a comment\n")
    assert key(script) != after_source
    assert str(script.image_key(script.IMAGES["operator"], "another base")) != key(script)


def test_files_outside_the_context_do_not_change_the_key(script: ModuleType) -> None:
    before = key(script)
    (script.ROOT / "docs" / "page.md").write_text("another page\n")
    (script.ROOT / "engines" / "__pycache__").mkdir()
    (script.ROOT / "engines" / "__pycache__" / "cli.cpython-311.pyc").write_bytes(b"\1")
    assert key(script) == before
    # Another image's Dockerfile is no input of this one.
    speech = script.ROOT / "docker/speech-api.Dockerfile"
    speech.write_text(speech.read_text() + "\n# a comment\n")
    assert key(script) == before
