"""Local serving: voices → engines (from the cache) → model repository → a running Triton."""

from __future__ import annotations

import os
import tempfile
from dataclasses import replace
from pathlib import Path

from engines.build.engine_build import build_engines
from engines.contract.plan import ServingPlan
from engines.contract.repository import build_model_repository, write_model_repository
from engines.pod.triton_server import TritonServer
from engines.text.voice import load_voice


def default_cache_dir() -> Path:
    if os.environ.get("VOXFLEET_CACHE"):
        return Path(os.environ["VOXFLEET_CACHE"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "voxfleet" / "engines"


def plan_local_voices(
    voices: list[str],
    cache_dir: Path | None = None,
    template: ServingPlan | None = None,
) -> list[ServingPlan]:
    """Build (or find in the cache) the engines of each voice and plan one model per voice.

    `template` carries everything but the voice itself (runtime, precision, windows, limits);
    its `name` and `engine_dir` are replaced per voice.
    """
    cache = cache_dir or default_cache_dir()
    template = template or ServingPlan(name="template", engine_dir="")
    plans = []
    for spec in voices or ["joe"]:
        voice = load_voice(spec)
        entry = build_engines(voice.model_path, template.runtime, template.precision, cache)
        plans.append(
            replace(
                template,
                name=voice.name,
                engine_dir=str(entry.path),
                voice_config_path=str(voice.config_path),
            )
        )
    return plans


def local_server(
    plans: list[ServingPlan],
    grpc_port: int | None = None,
    http_port: int | None = None,
    metrics_port: int | None = None,
    work_dir: Path | None = None,
    extra_args: list[str] | None = None,
    instances: int = 1,
) -> TritonServer:
    """A not-yet-started TritonServer on a fresh repository for `plans` (`instances` stream
    models per voice)."""
    work = work_dir or Path(tempfile.mkdtemp(prefix="voxfleet-serve-"))
    repository = write_model_repository(build_model_repository(plans, instances), work / "models")
    return TritonServer(
        repository,
        grpc_port=grpc_port,
        http_port=http_port,
        metrics_port=metrics_port,
        extra_args=extra_args,
        work_dir=work,
    )
