from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engines.text.voice import VoiceError, load_voice, voice_name_from_path


def test_the_embedded_default_voice() -> None:
    voice = load_voice("joe")
    assert voice.name == "joe"
    assert voice.config.sample_rate == 22050 and voice.config.espeak_voice == "en-us"
    assert voice.model_path.suffix == ".onnx" and voice.model_path.is_file()


def test_any_piper_voice_from_a_path(tmp_path: Path) -> None:
    joe = load_voice("joe")
    model = tmp_path / "en_US-joe-medium.onnx"
    model.symlink_to(joe.model_path)
    shutil.copy(joe.config_path, tmp_path / "en_US-joe-medium.onnx.json")
    voice = load_voice(str(model))
    assert voice.name == "en_us-joe-medium" == voice_name_from_path(model)
    assert voice.config == joe.config
    assert load_voice(tmp_path).model_path == model  # a folder with one voice works too


def test_missing_voices_and_configs_say_what_is_wrong(tmp_path: Path) -> None:
    with pytest.raises(VoiceError, match=r"no voice named 'nobody'.*embedded voices: joe"):
        load_voice("nobody")
    lonely = tmp_path / "lonely.onnx"
    lonely.write_bytes(b"not really onnx")
    with pytest.raises(VoiceError, match=r"lonely\.onnx\.json is missing"):
        load_voice(str(lonely))
    (tmp_path / "lonely.onnx.json").write_text('{"audio": {}}')
    with pytest.raises(VoiceError, match="not a Piper voice config"):
        load_voice(str(lonely))
