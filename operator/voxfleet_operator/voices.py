"""From TTSVoice objects (API or YAML) to validated `Voice`s, with errors users can act on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from voxfleet_operator.names import voice_name_problem
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import PoolsConfig
from voxfleet_operator.spec import GROUP, KIND, VERSION, TTSVoiceSpec
from voxfleet_operator.status import INVALID_NAME, INVALID_SPEC, NOT_A_TTSVOICE, UNKNOWN_POOL

API_VERSION = f"{GROUP}/{VERSION}"


class InvalidVoice(ValueError):
    """A TTSVoice that can never be served as written; `reason` is a condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def describe_validation_error(error: ValidationError) -> str:
    parts = []
    for item in error.errors():
        location = ".".join(str(p) for p in item["loc"])
        message = str(item["msg"]).removeprefix("Value error, ")
        parts.append(f"spec.{location}: {message}" if location else message)
    return "; ".join(parts)


def parse_voice(name: str, namespace: str, spec: Mapping[str, Any], pools: PoolsConfig) -> Voice:
    """A validated voice; InvalidVoice says what is wrong and what the limit is."""
    problem = voice_name_problem(name)
    if problem:
        raise InvalidVoice(INVALID_NAME, problem)
    try:
        parsed = TTSVoiceSpec.model_validate(dict(spec))
    except ValidationError as error:
        raise InvalidVoice(INVALID_SPEC, describe_validation_error(error)) from None
    try:
        pools.get(parsed.pool)
    except KeyError as error:
        raise InvalidVoice(UNKNOWN_POOL, str(error.args[0])) from None
    return Voice(name=name, namespace=namespace, spec=parsed)


def voice_from_object(
    obj: Mapping[str, Any], pools: PoolsConfig, default_namespace: str = "default"
) -> Voice:
    """A Voice from a whole TTSVoice document, as in a file given to `voxfleet render`."""
    if obj.get("apiVersion") != API_VERSION or obj.get("kind") != KIND:
        raise InvalidVoice(
            NOT_A_TTSVOICE,
            f"expected apiVersion {API_VERSION} and kind {KIND}, got "
            f"{obj.get('apiVersion')!r} {obj.get('kind')!r}",
        )
    meta = obj.get("metadata") or {}
    name = meta.get("name")
    if not name:
        raise InvalidVoice(INVALID_NAME, "metadata.name is missing")
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        raise InvalidVoice(INVALID_SPEC, f"TTSVoice {name}: spec is missing or not a mapping")
    return parse_voice(name, meta.get("namespace") or default_namespace, spec, pools)
