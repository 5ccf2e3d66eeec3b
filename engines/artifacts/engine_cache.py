"""Content-addressed engine cache: build each voice's stage artifacts once per GPU type.

An entry is a directory named by the sha256 of its `EngineKey` (model digest, runtime,
precision, optimisation profiles, runtime version, GPU product and compute capability; each
stage's own key adds the stage name). It holds the stage files and a ``manifest.json`` that
records the key and every file's size and sha256. The manifest is written last and the entry
appears by one ``rename`` of a finished temporary directory, so a reader sees either no entry
or a whole one; a crash mid-build leaves only a ``.tmp-*`` directory that the next build
removes. An entry whose files no longer match its manifest (a truncated copy, a disk error, a
hand edit) is reported by `EngineCache.verify` and rebuilt by `EngineCache.build`.

This module is pure bookkeeping: it imports neither onnx, onnxruntime, torch nor TensorRT,
so the operator can compute keys (`EngineKey.digest`) without building anything.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engines.contract.plan import PRECISIONS, RUNTIME_NAMES

FORMAT_VERSION = 1
STAGES = ("encoder", "flow", "vocoder")
MANIFEST = "manifest.json"
# An unfinished build older than this is taken to be dead and its directory is removed.
STALE_TMP_SECONDS = 6 * 3600

# (min, opt, max) shape of one input, as TensorRT optimisation profiles take them.
ShapeRange = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
# stage -> input name -> (min, opt, max) shapes
Profiles = Mapping[str, Mapping[str, Sequence[Sequence[int]]]]


class EngineCacheError(RuntimeError):
    """An engine cache entry is missing, corrupt, or was built for another target."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def normalize_gpu_product(name: str) -> str:
    """`Tesla T4` -> `Tesla-T4`: the spelling of the `nvidia.com/gpu.product` node label."""
    return "-".join(name.replace("NVIDIA ", "NVIDIA-").split()).replace("--", "-")


def _canonical_profiles(profiles: Profiles | None) -> dict[str, dict[str, list[list[int]]]]:
    if not profiles:
        return {}
    canonical: dict[str, dict[str, list[list[int]]]] = {}
    for stage in sorted(profiles):
        if stage not in STAGES:
            raise ValueError(f"profile for unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        canonical[stage] = {
            name: [list(map(int, shape)) for shape in shape_range]
            for name, shape_range in sorted(profiles[stage].items())
        }
        for name, shapes in canonical[stage].items():
            if len(shapes) != 3 or len({len(shape) for shape in shapes}) != 1:
                raise ValueError(
                    f"profile {stage}.{name} must be three shapes (min, opt, max) of one rank, "
                    f"got {shapes}"
                )
            low, opt, high = shapes
            if not all(a <= b <= c for a, b, c in zip(low, opt, high, strict=True)):
                raise ValueError(f"profile {stage}.{name} needs min <= opt <= max, got {shapes}")
    return canonical


@dataclass(frozen=True)
class EngineKey:
    """Everything an engine artifact depends on. Equal keys mean interchangeable artifacts."""

    model_sha256: str
    runtime: str
    precision: str
    runtime_version: str
    gpu_product: str = "cpu"
    compute_capability: str = ""
    # Only for runtimes whose artifacts depend on them (TensorRT); `{}` otherwise.
    profiles: Profiles = field(default_factory=dict)
    config_sha256: str = ""
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIME_NAMES:
            raise ValueError(f"runtime {self.runtime!r} is not one of {', '.join(RUNTIME_NAMES)}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision {self.precision!r} is not one of {', '.join(PRECISIONS)}")
        if len(self.model_sha256) != 64:
            raise ValueError(f"model_sha256 must be 64 hex digits, got {self.model_sha256!r}")
        object.__setattr__(self, "profiles", _canonical_profiles(self.profiles))

    def fields(self) -> dict[str, Any]:
        return asdict(self)

    def digest(self) -> str:
        return _digest(self.fields())

    def stage_digest(self, stage: str) -> str:
        """Key of one stage's artifact: the entry's fields, the stage and only its profile."""
        if stage not in STAGES:
            raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
        fields = self.fields()
        assert isinstance(self.profiles, dict)
        fields["stage"] = stage
        fields["profiles"] = self.profiles.get(stage, {})
        return _digest(fields)

    def short(self) -> str:
        """16 hex digits: enough to name a Kubernetes Job after its key."""
        return self.digest()[:16]

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> EngineKey:
        known = {name for name in cls.__dataclass_fields__}
        unknown = set(fields) - known
        if unknown:
            raise EngineCacheError(f"unknown key fields {sorted(unknown)}")
        return cls(**dict(fields))


def _digest(fields: Mapping[str, Any]) -> str:
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class EngineEntry:
    """A verified cache entry. `built` says whether this call built it or found it."""

    path: Path
    key: EngineKey
    files: dict[str, dict[str, Any]]
    built: bool = False

    def stage_path(self, stage: str) -> Path:
        for name, info in self.files.items():
            if info.get("stage") == stage:
                return self.path / name
        raise EngineCacheError(f"entry {self.path} has no artifact for stage {stage!r}")

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST


# A builder writes the artifacts into the directory it is given and returns
# file name (relative) -> stage name, or "" for files that belong to no single stage.
Builder = Callable[[Path], Mapping[str, str]]


class EngineCache:
    """A directory of entries, one per key digest. Safe to share between pods (see module doc)."""

    def __init__(self, root: Path | str) -> None:
        self.root = Path(root)

    def entry_dir(self, key: EngineKey) -> Path:
        return self.root / key.digest()

    def verify(self, key: EngineKey, full: bool = True) -> list[str]:
        """What is wrong with the entry for `key`; an empty list means it is whole.

        `full` hashes every file (seconds for a large voice); otherwise sizes only.
        """
        path = self.entry_dir(key)
        if not path.is_dir():
            return [f"no entry at {path}"]
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            return [f"{path} has no {MANIFEST} (an interrupted or partial copy)"]
        except (OSError, json.JSONDecodeError) as error:
            return [f"{path / MANIFEST} is unreadable: {error}"]
        problems: list[str] = []
        if manifest.get("key") != key.fields():
            problems.append(f"{path / MANIFEST} was written for another key")
        files = manifest.get("files")
        if not isinstance(files, dict) or not files:
            return [*problems, f"{path / MANIFEST} lists no files"]
        for name, info in sorted(files.items()):
            file_path = path / name
            if not file_path.is_file():
                problems.append(f"{name} is missing")
                continue
            size = file_path.stat().st_size
            if size != info.get("bytes"):
                problems.append(f"{name} has {size} bytes, the manifest says {info.get('bytes')}")
            elif full and sha256_file(file_path) != info.get("sha256"):
                problems.append(f"{name} does not match its sha256 in the manifest")
        return problems

    def lookup(self, key: EngineKey, full: bool = True) -> EngineEntry | None:
        """The whole entry for `key`, or None when it is absent or damaged."""
        if self.verify(key, full=full):
            return None
        return self._read(key, built=False)

    def open(self, key: EngineKey, full: bool = True) -> EngineEntry:
        """Like `lookup`, but say what is wrong instead of returning None."""
        problems = self.verify(key, full=full)
        if problems:
            raise EngineCacheError(
                f"engine cache entry {key.short()} is not usable: {'; '.join(problems)}. "
                "Run `voxfleet build-engines` for this voice, runtime and precision."
            )
        return self._read(key, built=False)

    def _read(self, key: EngineKey, built: bool) -> EngineEntry:
        path = self.entry_dir(key)
        manifest = json.loads((path / MANIFEST).read_text())
        return EngineEntry(path=path, key=key, files=manifest["files"], built=built)

    def build(self, key: EngineKey, builder: Builder, force: bool = False) -> EngineEntry:
        """Return the entry for `key`, running `builder` only if it is absent or damaged."""
        if not force:
            entry = self.lookup(key)
            if entry is not None:
                return entry
        self.root.mkdir(parents=True, exist_ok=True)
        self._sweep_stale()
        with self._lock(key):
            # Another process may have finished the same build while we waited for the lock.
            if not force:
                entry = self.lookup(key)
                if entry is not None:
                    return entry
            tmp = self.root / f".tmp-{key.digest()[:16]}-{uuid.uuid4().hex[:8]}"
            tmp.mkdir()
            try:
                stages = dict(builder(tmp))
                self._write_manifest(tmp, key, stages)
                self._publish(tmp, self.entry_dir(key))
            finally:
                if tmp.exists():
                    shutil.rmtree(tmp, ignore_errors=True)
        return self._read(key, built=True)

    def _write_manifest(self, tmp: Path, key: EngineKey, stages: Mapping[str, str]) -> None:
        if not stages:
            raise EngineCacheError("the builder produced no files")
        files: dict[str, dict[str, Any]] = {}
        for name, stage in sorted(stages.items()):
            file_path = tmp / name
            if not file_path.is_file():
                raise EngineCacheError(f"the builder reported {name} but did not write it")
            files[name] = {
                "stage": stage,
                "stage_key": key.stage_digest(stage) if stage else "",
                "bytes": file_path.stat().st_size,
                "sha256": sha256_file(file_path),
            }
            _fsync(file_path)
        manifest = {
            "key": key.fields(),
            "digest": key.digest(),
            "files": files,
            "created_unix": round(time.time(), 3),
        }
        manifest_path = tmp / MANIFEST
        manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        _fsync(manifest_path)

    def _publish(self, tmp: Path, final: Path) -> None:
        if final.exists():
            # A damaged entry: move it out of the way in one rename, then delete it.
            trash = self.root / f".trash-{final.name[:16]}-{uuid.uuid4().hex[:8]}"
            os.rename(final, trash)
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.rename(tmp, final)
        except OSError:
            # Lost a race with a builder on another host sharing the volume: theirs stands
            # if it is whole.
            if not final.is_dir():
                raise
        _fsync_dir(self.root)

    @contextlib.contextmanager
    def _lock(self, key: EngineKey) -> Iterator[None]:
        """Serialise builders of one key on this host (an NFS volume may ignore it)."""
        import fcntl

        lock_path = self.root / f".lock-{key.digest()[:16]}"
        with lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _sweep_stale(self) -> None:
        now = time.time()
        for path in self.root.glob(".t*-*"):
            if path.name.startswith((".tmp-", ".trash-")):
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > STALE_TMP_SECONDS:
                        shutil.rmtree(path, ignore_errors=True)

    def entries(self) -> list[EngineKey]:
        """Keys of the entries present (whole or not), read from their manifests."""
        keys: list[EngineKey] = []
        if not self.root.is_dir():
            return keys
        for path in sorted(self.root.iterdir()):
            # Published names (`build-engines --publish-as`) are links to entries, not entries.
            if path.name.startswith(".") or path.is_symlink() or not (path / MANIFEST).is_file():
                continue
            with contextlib.suppress(ValueError, OSError, EngineCacheError, TypeError):
                keys.append(EngineKey.from_fields(json.loads((path / MANIFEST).read_text())["key"]))
        return keys


def _fsync(path: Path) -> None:
    with path.open("rb") as handle:
        os.fsync(handle.fileno())


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
