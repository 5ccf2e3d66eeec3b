"""Build a voice's stage engines into the engine cache (what the engine-build Job runs).

    entry = build_engines(model_path, "torch-cuda", "fp16", Path("/cache"))
    stages = load_stages("torch-cuda", entry.path)

Per runtime, the "build" is:
- onnxruntime (CPU, fp32): `split_voice` into encoder/flow/vocoder ONNX graphs;
- torch-cuda (fp32/fp16): the same split graphs, checked for operators the torch port lacks;
  the runtime loads their initializers into torch at start (a few seconds);
- tensorrt (fp16 default, fp32, int8 with calibration): one serialized plan per stage with
  optimisation profiles from the serving shapes. Needs the `tensorrt` package (NVIDIA images
  only); never run in this project's CI.

Every entry also holds the voice's ``.onnx.json`` as ``voice.onnx.json``, so a Triton pod can
serve from the cache volume alone.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from engines.engine_cache import (
    PRECISIONS,
    RUNTIMES,
    STAGES,
    EngineCache,
    EngineCacheError,
    EngineEntry,
    EngineKey,
    Profiles,
    normalize_gpu_product,
    sha256_file,
)

VOICE_CONFIG_NAME = "voice.onnx.json"
# Precisions each runtime can build; the first is its default.
RUNTIME_PRECISIONS = {
    "onnxruntime": ("fp32",),
    "torch-cuda": ("fp16", "fp32"),
    "tensorrt": ("fp16", "fp32", "int8"),
}


class EngineBuildError(RuntimeError):
    """The engines cannot be built here as asked (wrong runtime, precision, GPU, input)."""


@dataclass(frozen=True)
class Target:
    """Where the artifacts will run: part of the cache key."""

    runtime_version: str
    gpu_product: str = "cpu"
    compute_capability: str = ""


def default_precision(runtime: str) -> str:
    _check_runtime(runtime)
    return RUNTIME_PRECISIONS[runtime][0]


def _check_runtime(runtime: str) -> None:
    if runtime not in RUNTIMES:
        raise EngineBuildError(f"unknown runtime {runtime!r}; choose one of {', '.join(RUNTIMES)}")


def check_precision(runtime: str, precision: str) -> None:
    _check_runtime(runtime)
    if precision not in PRECISIONS:
        raise EngineBuildError(
            f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}"
        )
    if precision not in RUNTIME_PRECISIONS[runtime]:
        raise EngineBuildError(
            f"runtime {runtime} does not build {precision} engines; it builds "
            f"{', '.join(RUNTIME_PRECISIONS[runtime])}"
        )


def _nvidia_smi_gpu() -> tuple[str, str] | None:
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


def detect_target(runtime: str) -> Target:
    """The target of this machine for `runtime`, or a clear error if it cannot run it."""
    _check_runtime(runtime)
    if runtime == "onnxruntime":
        import onnxruntime

        return Target(runtime_version=f"onnxruntime-{onnxruntime.__version__}")
    if runtime == "torch-cuda":
        try:
            import torch
        except ImportError:
            raise EngineBuildError(
                "runtime torch-cuda needs PyTorch with CUDA (pip install torch); it is not "
                "installed here"
            ) from None
        if not torch.cuda.is_available():
            raise EngineBuildError(
                "runtime torch-cuda is keyed by the GPU it runs on, and this machine has no "
                "CUDA GPU; build on a GPU node or pass --gpu-product and --compute-capability"
            )
        major, minor = torch.cuda.get_device_capability(0)
        return Target(
            runtime_version=f"torch-{torch.__version__}-cuda-{torch.version.cuda}",
            gpu_product=normalize_gpu_product(torch.cuda.get_device_name(0)),
            compute_capability=f"{major}.{minor}",
        )
    try:
        import tensorrt
    except ImportError:
        raise EngineBuildError(
            "runtime tensorrt needs the `tensorrt` Python package, which ships in NVIDIA's "
            "TensorRT and Triton images (PyPI has only download stubs); run build-engines there"
        ) from None
    gpu = _nvidia_smi_gpu()
    if gpu is None:
        raise EngineBuildError(
            "TensorRT plans are built for one GPU type, and nvidia-smi found no GPU here"
        )
    return Target(
        runtime_version=f"tensorrt-{tensorrt.__version__}",
        gpu_product=gpu[0],
        compute_capability=gpu[1],
    )


def resolve_voice_model(spec: str | Path, download_dir: Path | None = None) -> Path:
    """NAME (embedded voice), PATH (``.onnx`` file or folder) or http(s) URL -> ``.onnx`` path."""
    text = str(spec)
    if text.startswith(("http://", "https://")):
        if download_dir is None:
            raise EngineBuildError("a voice URL needs a download directory")
        return _download_voice(text, download_dir)
    from engines.voice import VoiceError, load_voice

    try:
        return load_voice(text).model_path
    except VoiceError as error:
        raise EngineBuildError(str(error)) from None


def _download_voice(url: str, download_dir: Path) -> Path:
    name = Path(urllib.parse.urlparse(url).path).name
    if not name.endswith(".onnx"):
        raise EngineBuildError(f"voice URL {url} must name a Piper .onnx file")
    folder = download_dir / hashlib.sha256(url.encode()).hexdigest()[:16]
    folder.mkdir(parents=True, exist_ok=True)
    for remote, local in ((url, folder / name), (url + ".json", folder / (name + ".json"))):
        if local.is_file():
            continue
        partial = local.with_name(local.name + ".part")
        try:
            with urllib.request.urlopen(remote, timeout=60) as response, partial.open("wb") as out:
                shutil.copyfileobj(response, out)
        except OSError as error:
            raise EngineBuildError(f"could not download {remote}: {error}") from None
        partial.rename(local)
    return folder / name


def check_voice_digest(model_path: Path, expected_sha256: str) -> None:
    """Refuse a voice whose bytes are not the ones the TTSVoice named (a changed URL, say)."""
    actual = sha256_file(model_path)
    if actual != expected_sha256.strip().lower():
        raise EngineBuildError(
            f"voice {model_path.name} has sha256 {actual}, not the expected {expected_sha256}; "
            "fix the voice's sha256 or its source"
        )


_PUBLISH_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


def publish_entry(entry_path: Path, name: str) -> Path:
    """Make CACHE/NAME point at a cache entry, atomically (a relative symlink, then rename).

    The operator names engines by its own key; pods load `/engines/<key>/`. Replacing the
    link is atomic, so a pod sees the old entry or the new one, never a half-written one.
    """
    if not _PUBLISH_NAME.match(name):
        raise EngineBuildError(
            f"--publish-as {name!r}: use 1-63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    root = entry_path.parent
    link = root / name
    if link.exists() and not link.is_symlink():
        raise EngineBuildError(f"{link} exists and is not a published link; not replacing it")
    temporary = root / f".tmp-link-{name}-{os.getpid()}"
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(entry_path.name)
    os.replace(temporary, link)
    return link


def engine_key(
    model_path: Path,
    runtime: str,
    precision: str,
    target: Target,
    profiles: Profiles | None = None,
) -> EngineKey:
    config_path = model_path.with_name(model_path.name + ".json")
    return EngineKey(
        model_sha256=sha256_file(model_path),
        runtime=runtime,
        precision=precision,
        runtime_version=target.runtime_version,
        gpu_product=target.gpu_product,
        compute_capability=target.compute_capability,
        # Only TensorRT plans are shaped by the profiles; other artifacts are shape-free.
        profiles=dict(profiles or {}) if runtime == "tensorrt" else {},
        config_sha256=sha256_file(config_path) if config_path.is_file() else "",
    )


def build_engines(
    voice_model_path: Path | str,
    runtime: str,
    precision: str | None,
    cache_dir: Path | str,
    profiles: Profiles | None = None,
    target: Target | None = None,
    calibration_ids: list[list[int]] | None = None,
    force: bool = False,
) -> EngineEntry:
    """The cache entry for this voice/runtime/precision on `target`, building it if needed.

    A second call with the same inputs returns the same entry without building
    (``entry.built`` is False); a damaged entry is rebuilt.
    """
    model_path = Path(voice_model_path)
    if not model_path.is_file():
        raise EngineBuildError(f"voice model {model_path} does not exist")
    precision = precision or default_precision(runtime)
    check_precision(runtime, precision)
    target = target or detect_target(runtime)
    if runtime == "tensorrt" and not profiles:
        from engines.tensorrt.profiles import stage_profiles

        profiles = stage_profiles()
    key = engine_key(model_path, runtime, precision, target, profiles)
    cache = EngineCache(cache_dir)

    def builder(out_dir: Path) -> Mapping[str, str]:
        from engines.split import split_voice

        if runtime == "tensorrt":
            from engines.tensorrt.build import build_plans

            onnx_dir = out_dir / "onnx"
            stage_onnx = split_voice(model_path, onnx_dir)
            ids = calibration_ids
            if precision == "int8" and not ids:
                from engines.tensorrt.build import corpus_ids

                ids = corpus_ids(model_path.with_name(model_path.name + ".json"))
            files = build_plans(stage_onnx, out_dir, key, calibration_ids=ids, target=target)
            shutil.rmtree(onnx_dir)
        else:
            stage_onnx = split_voice(model_path, out_dir)
            files = {path.name: stage for stage, path in stage_onnx.items()}
            if runtime == "torch-cuda":
                from engines.torch_cuda.convert import check_supported

                for path in stage_onnx.values():
                    check_supported(path)
        config_path = model_path.with_name(model_path.name + ".json")
        if config_path.is_file():
            shutil.copyfile(config_path, out_dir / VOICE_CONFIG_NAME)
            files[VOICE_CONFIG_NAME] = ""
        missing = [stage for stage in STAGES if stage not in files.values()]
        if missing:
            raise EngineBuildError(f"the {runtime} build produced no {', '.join(missing)} stage")
        return files

    try:
        return cache.build(key, builder, force=force)
    except EngineCacheError as error:
        raise EngineBuildError(str(error)) from None


def check_entry_target(entry: EngineEntry, target: Target) -> None:
    """Refuse to run an entry built for another GPU or runtime version, saying which."""
    key = entry.key
    built_for = (key.runtime_version, key.gpu_product, key.compute_capability)
    here = (target.runtime_version, target.gpu_product, target.compute_capability)
    if built_for != here:
        raise EngineBuildError(
            f"engine {key.short()} was built for {key.gpu_product} (compute capability "
            f"{key.compute_capability or 'n/a'}, {key.runtime_version}) but this machine is "
            f"{target.gpu_product} (compute capability {target.compute_capability or 'n/a'}, "
            f"{target.runtime_version}); rebuild it here with `voxfleet build-engines`"
        )
