"""The `triton-naive` baseline: its model repository (pure) and a way to serve it.

`build_naive_repository` returns the repository as files (relative path → bytes), like
`engines.contract.repository.build_model_repository` does for voxfleet's own models.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

DEFAULT_MODEL_NAME = "joe-naive"


def naive_config(
    model_name: str,
    voice_model: Path,
    max_batch_size: int = 16,
    max_queue_delay_us: int = 2000,
    intra_op_threads: int = 0,
) -> str:
    """config.pbtxt of the baseline: one CPU instance, Triton's dynamic batcher."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
    if max_queue_delay_us < 0:
        raise ValueError(f"max_queue_delay_us must not be negative, got {max_queue_delay_us}")
    return f"""\
name: "{model_name}"
backend: "python"
max_batch_size: {max_batch_size}
input [
  {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }}
]
output [
  {{ name: "AUDIO" data_type: TYPE_INT16 dims: [ -1 ] }},
  {{ name: "SAMPLE_RATE" data_type: TYPE_INT32 dims: [ 1 ] }}
]
dynamic_batching {{
  max_queue_delay_microseconds: {max_queue_delay_us}
}}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "voice_model" value: {{ string_value: "{voice_model}" }} }}
parameters {{ key: "intra_op_threads" value: {{ string_value: "{intra_op_threads}" }} }}
"""


def build_naive_repository(
    voice_model: Path,
    model_name: str = DEFAULT_MODEL_NAME,
    max_batch_size: int = 16,
    max_queue_delay_us: int = 2000,
    intra_op_threads: int = 0,
) -> dict[str, bytes]:
    model_py = resources.files("engines.bench.naive").joinpath("model.py").read_bytes()
    config = naive_config(
        model_name, voice_model, max_batch_size, max_queue_delay_us, intra_op_threads
    )
    return {
        f"{model_name}/config.pbtxt": config.encode("utf-8"),
        f"{model_name}/1/model.py": model_py,
    }


def write_files(files: dict[str, bytes], root: Path) -> None:
    for relative, content in files.items():
        target = root / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
