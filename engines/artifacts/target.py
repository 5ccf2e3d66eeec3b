"""Where engine artifacts run: the runtime version and GPU that are part of the cache key."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass

from engines.artifacts.engine_cache import normalize_gpu_product


@dataclass(frozen=True)
class Target:
    """Where the artifacts will run: part of the cache key."""

    runtime_version: str
    gpu_product: str = "cpu"
    compute_capability: str = ""


def nvidia_smi_gpu() -> tuple[str, str] | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.strip().splitlines()[0] if out.strip() else ""
    if "," not in first:
        return None
    name, capability = (part.strip() for part in first.split(",", 1))
    return normalize_gpu_product(name), capability
