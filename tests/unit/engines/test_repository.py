from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2

from engines.contract import names
from engines.contract.plan import ServingPlan, WindowConfig
from engines.contract.repository import (
    build_model_repository,
    config_pbtxt,
    load_request,
    stream_model_config,
    write_model_repository,
)


def plan(name: str = "joe", **kwargs) -> ServingPlan:
    return ServingPlan(name=name, engine_dir=f"/engines/{name}", **kwargs)


def parsed(text: str) -> model_config_pb2.ModelConfig:
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def plan_in(config: model_config_pb2.ModelConfig) -> ServingPlan:
    return ServingPlan.from_json(config.parameters[names.PLAN_PARAMETER].string_value)


def test_one_decoupled_python_model_per_voice(tmp_path: Path) -> None:
    files = build_model_repository([plan("joe"), plan("amy")])
    assert sorted(files) == [
        "amy/1/model.py",
        "amy/config.pbtxt",
        "joe/1/model.py",
        "joe/config.pbtxt",
    ]
    config = parsed(files["amy/config.pbtxt"].decode())  # Triton's own message parses it
    assert config.name == "amy" and config.backend == "python"
    assert config.model_transaction_policy.decoupled
    kind = model_config_pb2.ModelInstanceGroup.Kind.Name
    assert [(g.count, kind(g.kind)) for g in config.instance_group] == [(1, "KIND_CPU")]
    assert b"class TritonPythonModel" in files["joe/1/model.py"]
    root = write_model_repository(files, tmp_path / "models")
    assert (root / "joe" / "1" / "model.py").read_bytes() == files["joe/1/model.py"]


def test_a_voice_may_run_as_several_instances_and_never_none() -> None:
    files = build_model_repository([plan("joe")], instances=2)
    config = parsed(files["joe/config.pbtxt"].decode())
    assert [g.count for g in config.instance_group] == [2]
    with pytest.raises(ValueError, match="at least 1 model instance, got 0"):
        stream_model_config(plan("joe"), instances=0)


def test_the_plan_says_how_many_instances_the_operator_loads() -> None:
    """A TTSVoice's batching.instances reaches the plan; the load API's config runs that
    many stream models, and the plan refuses counts it does not serve."""
    body = load_request(plan("joe", instances=2))
    config = json.loads(body["parameters"]["config"])
    assert config["instance_group"] == [{"count": 2, "kind": "KIND_CPU"}]
    files = build_model_repository([plan("joe", instances=3), plan("amy")])
    counts = {
        name: [g.count for g in parsed(files[f"{name}/config.pbtxt"].decode()).instance_group]
        for name in ("joe", "amy")
    }
    assert counts == {"joe": [3], "amy": [1]}
    for bad in (0, 5):
        with pytest.raises(ValueError, match=f"instances must be within 1..4, got {bad}"):
            plan("joe", instances=bad)


def test_the_plan_round_trips_through_the_config_unchanged() -> None:
    original = plan(
        windows=WindowConfig(first_window_frames=8, window_frames=32, max_encoder_wait_ms=3),
        cross_stream_batching=False,
        max_text_bytes=300,
        max_streams_per_pod=7,
        speaking_rate=1.25,
        instances=2,
    )
    assert plan_in(parsed(config_pbtxt(stream_model_config(original)))) == original


def test_the_load_api_body_carries_the_same_config_as_the_repository() -> None:
    voice = plan(max_text_bytes=123, speaking_rate=0.8)
    body = load_request(voice)["parameters"]
    from_load_api = json_format.Parse(body["config"], model_config_pb2.ModelConfig())
    from_disk = parsed(config_pbtxt(stream_model_config(voice)))
    assert from_load_api == from_disk
    assert plan_in(from_load_api) == voice
    source = base64.b64decode(body["file:1/model.py"])
    assert source == build_model_repository([voice])["joe/1/model.py"]


def test_inputs_and_outputs_are_the_public_contract() -> None:
    config = parsed(config_pbtxt(stream_model_config(plan())))
    dtype = model_config_pb2.DataType.Name
    inputs = {i.name: (dtype(i.data_type), i.optional) for i in config.input}
    assert inputs == {
        "TEXT": ("TYPE_STRING", False),
        "SPEAKER_ID": ("TYPE_INT32", True),
        "LENGTH_SCALE": ("TYPE_FP32", True),
        "NOISE_SCALE": ("TYPE_FP32", True),
        "NOISE_W": ("TYPE_FP32", True),
    }
    outputs = {o.name: model_config_pb2.DataType.Name(o.data_type) for o in config.output}
    assert outputs == {"AUDIO": "TYPE_INT16", "SAMPLE_RATE": "TYPE_INT32"}


def test_bad_plans_are_refused() -> None:
    with pytest.raises(ValueError, match="used twice: joe"):
        build_model_repository([plan("joe"), plan("joe")])
    with pytest.raises(ValueError, match="max_text_bytes"):
        plan(max_text_bytes=0)
    with pytest.raises(ValueError, match="unknown serving plan field"):
        ServingPlan.from_json('{"name": "joe", "engine_dir": "", "x": 1}')
    with pytest.raises(ValueError, match="unknown serving plan windows field"):
        ServingPlan.from_json('{"name": "joe", "engine_dir": "", "windows": {"frames": 1}}')
    with pytest.raises(ValueError, match="unknown runtime 'cuda'; choose one of"):
        plan(runtime="cuda")
    with pytest.raises(ValueError, match="runtime onnxruntime does not build fp16"):
        plan(precision="fp16")
    with pytest.raises(ValueError, match="not valid JSON"):
        ServingPlan.from_json("{")


def test_defaults_follow_the_runtime_and_the_engine_entry() -> None:
    voice = plan(runtime="torch-cuda")
    assert voice.precision == "fp16"  # the runtime's default
    assert voice.voice_config_path == "/engines/joe/voice.onnx.json"
    assert json.loads(voice.to_json())["windows"]["window_frames"] == 128
