from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from engines.repository import (
    ServingPlan,
    build_model_repository,
    stream_model_config,
    write_model_repository,
)
from engines.streaming import WindowConfig
from engines.voice_plan import VoicePlan


def plan(name: str = "joe", **kwargs) -> VoicePlan:
    return VoicePlan(
        name=name, engine_dir=f"/engines/{name}", voice_config_path="/v.json", **kwargs
    )


def test_one_decoupled_python_model_per_voice(tmp_path: Path) -> None:
    files = build_model_repository(ServingPlan((plan("joe"), plan("amy", instance_count=2))))
    assert sorted(files) == [
        "amy/1/model.py",
        "amy/config.pbtxt",
        "joe/1/model.py",
        "joe/config.pbtxt",
    ]
    config = files["amy/config.pbtxt"].decode()
    assert 'name: "amy"' in config and 'backend: "python"' in config
    assert "decoupled: true" in config and "count: 2 kind: KIND_CPU" in config
    assert b"class TritonPythonModel" in files["joe/1/model.py"]
    root = write_model_repository(files, tmp_path / "models")
    assert (root / "joe" / "1" / "model.py").read_bytes() == files["joe/1/model.py"]


def test_the_plan_round_trips_through_the_config() -> None:
    original = plan(
        windows=WindowConfig(first_window_frames=8, window_frames=32),
        cross_stream_batching=False,
        max_text_bytes=300,
    )
    config = stream_model_config(original)
    raw = re.search(r'string_value: "(.*)" }', config)
    assert raw is not None
    decoded = json.loads(raw.group(1).encode().decode("unicode_escape"))
    assert VoicePlan.from_json(json.dumps(decoded)) == original


def test_inputs_and_outputs_are_the_public_contract() -> None:
    config = stream_model_config(plan())
    for name, dtype in [
        ("TEXT", "TYPE_STRING"),
        ("SPEAKER_ID", "TYPE_INT32"),
        ("AUDIO", "TYPE_INT16"),
        ("SAMPLE_RATE", "TYPE_INT32"),
    ]:
        assert f'name: "{name}" data_type: {dtype}' in config
    assert 'name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }' in config  # TEXT is required


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="used twice: joe"):
        ServingPlan((plan("joe"), plan("joe")))
    with pytest.raises(ValueError, match="max_text_bytes"):
        plan(max_text_bytes=0)
    with pytest.raises(ValueError, match="unknown voice plan field"):
        VoicePlan.from_json('{"name": "joe", "engine_dir": "", "voice_config_path": "", "x": 1}')
