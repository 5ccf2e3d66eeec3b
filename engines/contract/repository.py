"""Serving plans → Triton model repository: pure functions from plain data to file contents.

One model per voice. Its configuration is built once, as the dict `stream_model_config`;
`config.pbtxt` (a repository on disk, `voxfleet serve`) and the JSON `config` of Triton's
load API (the operator) are two spellings of that dict. The serving plan rides inside it
as one JSON string parameter, the only serialisation between operator and stream model.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from engines.contract import names
from engines.contract.plan import ServingPlan

MODEL_SOURCE = "1/model.py"


def check_unique_names(plans: Iterable[ServingPlan]) -> None:
    seen: list[str] = [plan.name for plan in plans]
    duplicates = sorted({name for name in seen if seen.count(name) > 1})
    if duplicates:
        raise ValueError(f"voice name(s) used twice: {', '.join(duplicates)}")


def stream_model_config(plan: ServingPlan, instances: int | None = None) -> dict[str, Any]:
    """One voice's decoupled stream model, in the fields of Triton's ModelConfig.

    `instances` (default: the plan's): stream-model processes for the voice (one scheduler
    each, on the same GPU); Triton spreads the voice's requests over them.
    """
    if instances is None:
        instances = plan.instances
    if instances < 1:
        raise ValueError(f"a voice needs at least 1 model instance, got {instances}")
    return {
        "name": plan.name,
        "backend": "python",
        "max_batch_size": 0,
        "model_transaction_policy": {"decoupled": True},
        "input": [
            {"name": name, "data_type": dtype, "dims": [1], "optional": optional}
            for name, dtype, optional in names.INPUTS
        ],
        "output": [
            {"name": name, "data_type": dtype, "dims": list(dims)}
            for name, dtype, dims in names.OUTPUTS
        ],
        # One instance per pod by default: the scheduler batches every stream of the voice
        # itself. More instances are more scheduler processes sharing the GPU (a TTSVoice's
        # batching.instances).
        "instance_group": [{"count": instances, "kind": "KIND_CPU"}],
        "parameters": {names.PLAN_PARAMETER: {"string_value": plan.to_json()}},
    }


def instance_count(config: Mapping[str, Any]) -> int:
    """The stream-model instances a model config (as Triton reports it) runs: its
    `instance_group` counts, 1 where it has none."""
    return sum(int(group.get("count", 1)) for group in config.get("instance_group") or [{}])


def _pbtxt_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if value.startswith(("TYPE_", "KIND_")):
            return value  # enum values are bare words
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"no text-format spelling for {value!r}")


def _pbtxt_fields(data: Mapping[str, Any], indent: str) -> list[str]:
    lines: list[str] = []
    for key, value in data.items():
        if key == "parameters":  # a map<string, ModelParameter>: key/value entries
            for name, parameter in value.items():
                lines.append(f"{indent}parameters {{")
                lines.append(f"{indent}  key: {_pbtxt_value(name)}")
                lines.append(f"{indent}  value {{")
                lines.extend(_pbtxt_fields(parameter, indent + "    "))
                lines.append(f"{indent}  }}")
                lines.append(f"{indent}}}")
        elif isinstance(value, Mapping):
            lines.append(f"{indent}{key} {{")
            lines.extend(_pbtxt_fields(value, indent + "  "))
            lines.append(f"{indent}}}")
        elif isinstance(value, list) and value and isinstance(value[0], Mapping):
            for item in value:
                lines.append(f"{indent}{key} {{")
                lines.extend(_pbtxt_fields(item, indent + "  "))
                lines.append(f"{indent}}}")
        elif isinstance(value, list):
            lines.append(f"{indent}{key}: [ {', '.join(_pbtxt_value(v) for v in value)} ]")
        else:
            lines.append(f"{indent}{key}: {_pbtxt_value(value)}")
    return lines


def config_pbtxt(config: Mapping[str, Any]) -> str:
    """A ModelConfig dict in protobuf text format (what `config.pbtxt` holds)."""
    return "\n".join(_pbtxt_fields(config, "")) + "\n"


def stream_model_source() -> bytes:
    return resources.files("engines.pod.triton_model").joinpath("model.py").read_bytes()


def build_model_repository(
    plans: Sequence[ServingPlan], instances: int | None = None
) -> dict[str, bytes]:
    """Relative path → file content for every voice's model (`instances` each, default: each
    plan's own)."""
    check_unique_names(plans)
    source = stream_model_source()
    files: dict[str, bytes] = {}
    for plan in plans:
        files[f"{plan.name}/config.pbtxt"] = config_pbtxt(
            stream_model_config(plan, instances)
        ).encode()
        files[f"{plan.name}/{MODEL_SOURCE}"] = source
    return files


def load_request(plan: ServingPlan) -> dict[str, Any]:
    """The body of Triton's `POST /v2/repository/models/<voice>/load` for one voice.

    The config goes as the JSON `config` parameter; the model's files as `file:<path>`
    parameters (base64), so a pod needs nothing voice-specific on disk but its engines.
    """
    return {
        "parameters": {
            "config": json.dumps(stream_model_config(plan), sort_keys=True),
            f"file:{MODEL_SOURCE}": base64.b64encode(stream_model_source()).decode(),
        }
    }


def write_model_repository(files: Mapping[str, bytes], root: Path) -> Path:
    for relative, content in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
    return root
