"""The speech API gateway's settings, as the chart gives them to the operator.

The chart writes `speechApi` of its values as JSON into the operator's ConfigMap and points
`VOXFLEET_SPEECH_API_FILE` at it. Without a file the gateway is not rendered.

    {"enabled": true, "image": "ghcr.io/voxfleet/speech-api:0.1.0", "replicas": 2,
     "voiceAliases": {"alloy": "joe"}, "defaultVoice": "joe", "apiKeysSecret": "tts-keys"}
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

DEFAULT_SPEECH_API_IMAGE = "ghcr.io/voxfleet/speech-api:0.1.0"


class SpeechApiConfigError(ValueError):
    """The gateway's settings are wrong; the message names the file and the field."""


class SpeechApiConfig(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )

    enabled: bool = Field(
        default=False,
        description="Render a speech API gateway (Deployment, Service, voice table) in every "
        "namespace with voices.",
    )
    image: str = Field(default=DEFAULT_SPEECH_API_IMAGE, min_length=1)
    image_pull_policy: str = Field(default="IfNotPresent")
    replicas: int = Field(default=1, ge=1, le=100)
    resources: dict[str, Any] = Field(default_factory=dict)
    voice_aliases: dict[str, str] = Field(
        default_factory=dict, description="Voice names clients may send → TTSVoice names."
    )
    default_voice: str | None = Field(
        default=None, description="The voice for OpenAI's built-in names without an alias."
    )
    api_keys_secret: str | None = Field(
        default=None,
        description="A Secret in each voice namespace whose `api-keys` entry lists the bearer "
        "keys, one per line; none: the API is open inside the cluster.",
    )


def parse_speech_api(data: Any, source: str = "speech API settings") -> SpeechApiConfig:
    try:
        return SpeechApiConfig.model_validate(data or {})
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '.'}: {e['msg']}" for e in error.errors()
        )
        raise SpeechApiConfigError(f"{source}: {problems}") from None


def load_speech_api(path: str | os.PathLike[str] | None) -> SpeechApiConfig:
    """The settings in `path` (`$VOXFLEET_SPEECH_API_FILE`); none: the gateway is off."""
    if not path:
        return SpeechApiConfig()
    try:
        data = json.loads(Path(path).read_text("utf-8"))
    except OSError as error:
        raise SpeechApiConfigError(f"cannot read {path}: {error.strerror}") from None
    except ValueError as error:
        raise SpeechApiConfigError(f"{path} is not JSON: {error}") from None
    return parse_speech_api(data, str(path))
