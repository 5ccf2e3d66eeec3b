"""How one voice is served: engines, windows, batching and limits. Plain data, JSON round-trip."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from engines.streaming import WindowConfig

DEFAULT_MAX_TEXT_BYTES = 5000


@dataclass(frozen=True)
class VoicePlan:
    name: str
    engine_dir: str
    voice_config_path: str
    runtime: str = "onnxruntime"
    windows: WindowConfig = field(default_factory=WindowConfig)
    cross_stream_batching: bool = True
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    max_streams: int = 0  # 0: no limit
    speaking_rate: float = 1.0  # multiplies the voice's length scale
    instance_count: int = 1

    def __post_init__(self) -> None:
        if self.max_text_bytes < 1:
            raise ValueError(f"max_text_bytes must be at least 1, got {self.max_text_bytes}")
        if self.max_streams < 0:
            raise ValueError(f"max_streams must not be negative, got {self.max_streams}")
        if not 0.1 <= self.speaking_rate <= 10:
            raise ValueError(f"speaking_rate must be within 0.1..10, got {self.speaking_rate}")
        if self.instance_count < 1:
            raise ValueError(f"instance_count must be at least 1, got {self.instance_count}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> VoicePlan:
        data = json.loads(raw)
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown voice plan field(s): {', '.join(sorted(unknown))}")
        data["windows"] = WindowConfig(**data.get("windows", {}))
        return cls(**data)
