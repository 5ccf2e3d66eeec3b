"""Serving plan → Triton model repository: a pure function from plain data to file contents."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from engines.voice_plan import VoicePlan

_INPUTS = (
    ("TEXT", "TYPE_STRING", False),
    ("SPEAKER_ID", "TYPE_INT32", True),
    ("LENGTH_SCALE", "TYPE_FP32", True),
    ("NOISE_SCALE", "TYPE_FP32", True),
    ("NOISE_W", "TYPE_FP32", True),
)
_OUTPUTS = (("AUDIO", "TYPE_INT16", "-1"), ("SAMPLE_RATE", "TYPE_INT32", "1"))


@dataclass(frozen=True)
class ServingPlan:
    voices: tuple[VoicePlan, ...]

    def __post_init__(self) -> None:
        names = [voice.name for voice in self.voices]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"voice name(s) used twice: {', '.join(duplicates)}")


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def stream_model_config(voice: VoicePlan) -> str:
    """The `config.pbtxt` of one voice's decoupled stream model."""
    inputs = ",\n".join(
        f"  {{ name: {_quote(name)} data_type: {dtype} dims: [ 1 ]"
        + (" optional: true }" if optional else " }")
        for name, dtype, optional in _INPUTS
    )
    outputs = ",\n".join(
        f"  {{ name: {_quote(name)} data_type: {dtype} dims: [ {dims} ] }}"
        for name, dtype, dims in _OUTPUTS
    )
    return (
        f"name: {_quote(voice.name)}\n"
        'backend: "python"\n'
        "max_batch_size: 0\n"
        "model_transaction_policy { decoupled: true }\n"
        f"input [\n{inputs}\n]\n"
        f"output [\n{outputs}\n]\n"
        f"instance_group [ {{ count: {voice.instance_count} kind: KIND_CPU }} ]\n"
        "parameters [\n"
        f'  {{ key: "voxfleet_plan" value: {{ string_value: {_quote(voice.to_json())} }} }}\n'
        "]\n"
    )


def stream_model_source() -> bytes:
    return resources.files("engines.triton_model").joinpath("model.py").read_bytes()


def build_model_repository(plan: ServingPlan) -> dict[str, bytes]:
    """Relative path → file content for every model in the plan."""
    source = stream_model_source()
    files: dict[str, bytes] = {}
    for voice in plan.voices:
        files[f"{voice.name}/config.pbtxt"] = stream_model_config(voice).encode()
        files[f"{voice.name}/1/model.py"] = source
    return files


def write_model_repository(files: dict[str, bytes], root: Path) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root
