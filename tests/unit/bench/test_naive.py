"""The triton-naive baseline's model repository (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.bench.naive import build_naive_repository, naive_config


def test_repository_is_a_batched_python_model_with_the_voice_path() -> None:
    files = build_naive_repository(
        Path("/voices/joe.onnx"), "joe-naive", max_batch_size=8, max_queue_delay_us=1500
    )
    assert set(files) == {"joe-naive/config.pbtxt", "joe-naive/1/model.py"}
    config = files["joe-naive/config.pbtxt"].decode()
    assert 'name: "joe-naive"' in config
    assert 'backend: "python"' in config
    assert "max_batch_size: 8" in config
    assert "max_queue_delay_microseconds: 1500" in config
    assert "decoupled" not in config  # one response per request: not streaming
    assert 'string_value: "/voices/joe.onnx"' in config
    assert b"class TritonPythonModel" in files["joe-naive/1/model.py"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": 0}, "max_batch_size must be at least 1"),
        ({"max_queue_delay_us": -1}, "max_queue_delay_us must not be negative"),
    ],
)
def test_impossible_batching_settings_are_refused(kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        naive_config("joe-naive", Path("/v.onnx"), **kwargs)
