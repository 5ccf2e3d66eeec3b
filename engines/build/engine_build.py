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
import importlib
import os
import re
import shutil
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from engines.artifacts.engine_cache import (
    STAGES,
    EngineCache,
    EngineCacheError,
    EngineEntry,
    EngineKey,
    Profiles,
    normalize_gpu_product,
    sha256_file,
)
from engines.contract.plan import VOICE_CONFIG_NAME, WindowConfig, runtime_info
from engines.contract.plan import check_precision as _check_plan_precision
from engines.artifacts.target import Target, nvidia_smi_gpu


class EngineBuildError(RuntimeError):
    """The engines cannot be built here as asked (wrong runtime, precision, GPU, input)."""


def default_precision(runtime: str) -> str:
    _check_runtime(runtime)
    return runtime_info(runtime).default_precision


def _check_runtime(runtime: str) -> None:
    try:
        runtime_info(runtime)
    except ValueError as error:
        raise EngineBuildError(str(error)) from None


def check_precision(runtime: str, precision: str) -> None:
    try:
        _check_plan_precision(runtime, precision)
    except ValueError as error:
        raise EngineBuildError(str(error)) from None


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
    gpu = nvidia_smi_gpu()
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
    from engines.text.voice import VoiceError, load_voice

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


def cache_key(
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
        # Only shaped runtimes' artifacts (TensorRT plans) depend on the profiles.
        profiles=dict(profiles or {}) if runtime_info(runtime).shaped else {},
        config_sha256=sha256_file(config_path) if config_path.is_file() else "",
    )


# A runtime's build: (voice .onnx, output folder, cache key, target, calibration ids) ->
# file name -> stage ("" for other files). Named in the runtime registry (engines/contract/plan.py).
Builder = Callable[
    [Path, Path, EngineKey, Target, "Sequence[Sequence[int]] | None"], dict[str, str]
]


def split_stages(
    model_path: Path,
    out_dir: Path,
    key: EngineKey,
    target: Target,
    calibration_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, str]:
    """onnxruntime's build: the voice split into encoder, flow and vocoder ONNX graphs."""
    from engines.artifacts.split import split_voice

    stage_onnx = split_voice(model_path, out_dir)
    return {path.name: stage for stage, path in stage_onnx.items()}


def split_stages_for_torch(
    model_path: Path,
    out_dir: Path,
    key: EngineKey,
    target: Target,
    calibration_ids: Sequence[Sequence[int]] | None = None,
) -> dict[str, str]:
    """torch-cuda's build: the split graphs, checked for operators the torch port lacks."""
    from engines.runtimes.torch_cuda.convert import check_supported

    files = split_stages(model_path, out_dir, key, target)
    for name in files:
        check_supported(out_dir / name)
    return files


def load_builder(runtime: str) -> Builder:
    module, _, attribute = runtime_info(runtime).builder.partition(":")
    builder: Builder = getattr(importlib.import_module(module), attribute)
    return builder


def build_engines(
    voice_model_path: Path | str,
    runtime: str,
    precision: str | None,
    cache_dir: Path | str,
    profiles: Profiles | None = None,
    target: Target | None = None,
    calibration_ids: list[list[int]] | None = None,
    force: bool = False,
    windows: WindowConfig | None = None,
) -> EngineEntry:
    """The cache entry for this voice/runtime/precision on `target`, building it if needed.

    Shaped runtimes (TensorRT) take their profiles from `profiles`, else from `windows`
    (the serving plan's), else from the default windows. A second call with the same inputs
    returns the same entry without building (``entry.built`` is False); a damaged entry is
    rebuilt.
    """
    model_path = Path(voice_model_path)
    if not model_path.is_file():
        raise EngineBuildError(f"voice model {model_path} does not exist")
    precision = precision or default_precision(runtime)
    check_precision(runtime, precision)
    target = target or detect_target(runtime)
    if runtime_info(runtime).shaped and not profiles:
        from engines.runtimes.tensorrt.profiles import ServingShapes, stage_profiles

        profiles = stage_profiles(ServingShapes.from_windows(windows or WindowConfig()))
    key = cache_key(model_path, runtime, precision, target, profiles)
    cache = EngineCache(cache_dir)
    build_stages = load_builder(runtime)

    def builder(out_dir: Path) -> Mapping[str, str]:
        files = build_stages(model_path, out_dir, key, target, calibration_ids)
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
