"""Shared fixtures of the GPU-engine tests: the joe voice split into stage graphs, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CORPUS_IDS = Path(__file__).parent / "data" / "corpus_ids.json"


@pytest.fixture(scope="session")
def stage_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engines.artifacts.split import split_voice
    from engines.text.voice import load_voice

    out = tmp_path_factory.mktemp("joe-stages")
    split_voice(load_voice("joe").model_path, out)
    return out


@pytest.fixture(scope="session")
def corpus_ids() -> list[list[int]]:
    return [entry["ids"] for entry in json.loads(CORPUS_IDS.read_text())["sentences"]]
