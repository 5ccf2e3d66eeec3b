"""Engine cache bookkeeping: keys, atomic entries, damage detection and rebuilds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engines.artifacts.engine_cache import (
    MANIFEST,
    EngineCache,
    EngineCacheError,
    EngineKey,
    normalize_gpu_product,
)
from engines.runtimes.tensorrt.profiles import ServingShapes, stage_profiles
from engines.streaming import WindowConfig

SHA = "ab" * 32


def key(**overrides: object) -> EngineKey:
    fields: dict[str, object] = {
        "model_sha256": SHA,
        "runtime": "tensorrt",
        "precision": "fp16",
        "runtime_version": "tensorrt-10.3.0",
        "gpu_product": "Tesla-T4",
        "compute_capability": "7.5",
        "profiles": stage_profiles(),
    }
    fields.update(overrides)
    return EngineKey(**fields)  # type: ignore[arg-type]


class CountingBuilder:
    def __init__(self, payload: bytes = b"plan bytes") -> None:
        self.calls = 0
        self.payload = payload

    def __call__(self, out_dir: Path) -> dict[str, str]:
        self.calls += 1
        for stage in ("encoder", "flow", "vocoder"):
            (out_dir / f"{stage}.plan").write_bytes(self.payload + stage.encode())
        return {f"{stage}.plan": stage for stage in ("encoder", "flow", "vocoder")}


@pytest.mark.parametrize(
    "field, value",
    [
        ("model_sha256", "cd" * 32),
        ("runtime", "torch-cuda"),
        ("precision", "int8"),
        ("runtime_version", "tensorrt-10.4.0"),
        ("gpu_product", "NVIDIA-A10G"),
        ("compute_capability", "8.6"),
        # The default batch is WindowConfig's 128 windows: a different maximum.
        ("profiles", stage_profiles(ServingShapes(max_batch=256))),
    ],
)
def test_every_key_field_changes_the_digest(field: str, value: object) -> None:
    assert key(**{field: value}).digest() != key().digest()


def test_digest_is_stable_and_independent_of_profile_order() -> None:
    profiles = stage_profiles()
    reordered = {
        stage: dict(reversed(list(profiles[stage].items()))) for stage in reversed(profiles)
    }
    assert key(profiles=reordered).digest() == key().digest()
    assert len(key().short()) == 16


def test_stage_keys_differ_and_follow_only_their_own_profile() -> None:
    base = key()
    assert len({base.stage_digest(stage) for stage in ("encoder", "flow", "vocoder")}) == 3
    wider_encoder = key(profiles=stage_profiles(ServingShapes(max_phonemes=1024)))
    assert wider_encoder.stage_digest("encoder") != base.stage_digest("encoder")
    assert wider_encoder.stage_digest("vocoder") == base.stage_digest("vocoder")


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"runtime": "openvino"}, "runtime 'openvino'"),
        ({"precision": "bf16"}, "precision 'bf16'"),
        ({"model_sha256": "abc"}, "64 hex digits"),
        ({"profiles": {"decoder": {}}}, "unknown stage 'decoder'"),
        (
            {"profiles": {"vocoder": {"latent": ((4, 192, 48), (1, 192, 48), (8, 192, 48))}}},
            "min <= opt <= max",
        ),
    ],
)
def test_bad_keys_are_refused_with_the_reason(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        key(**overrides)


def test_profiles_follow_the_serving_shapes() -> None:
    shapes = ServingShapes(
        max_batch=128,
        opt_batch=32,
        min_vocoder_frames=40,
        opt_vocoder_frames=56,
        max_vocoder_frames=72,
    )
    profiles = stage_profiles(shapes)
    assert profiles["vocoder"]["latent"] == ((1, 192, 40), (32, 192, 56), (128, 192, 72))
    assert profiles["flow"]["mask"][2] == (128, 1, shapes.max_flow_frames)
    assert profiles["encoder"]["input"][2] == (shapes.encoder_max_batch, shapes.max_phonemes)
    with pytest.raises(ValueError, match="phonemes: need min <= opt <= max"):
        ServingShapes(opt_phonemes=600, max_phonemes=512)
    with pytest.raises(ValueError, match="flow frames: need min <= opt <= max"):
        ServingShapes(min_flow_frames=400)


def test_other_windows_give_another_key() -> None:
    windows = WindowConfig(first_window_frames=8, window_frames=256)
    other = key(profiles=stage_profiles(ServingShapes.from_windows(windows)))
    assert other.digest() != key().digest()
    assert other.stage_digest("encoder") == key().stage_digest("encoder")
    assert other.stage_digest("vocoder") != key().stage_digest("vocoder")


def test_gpu_product_takes_the_node_label_spelling() -> None:
    assert normalize_gpu_product("Tesla T4") == "Tesla-T4"
    assert normalize_gpu_product("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"


def test_second_build_is_a_no_op(tmp_path: Path) -> None:
    cache, builder = EngineCache(tmp_path), CountingBuilder()
    first = cache.build(key(), builder)
    second = cache.build(key(), builder)
    assert (first.built, second.built, builder.calls) == (True, False, 1)
    assert second.path == first.path == tmp_path / key().digest()
    manifest = json.loads((first.path / MANIFEST).read_text())
    assert manifest["key"] == key().fields()
    assert manifest["files"]["vocoder.plan"]["stage_key"] == key().stage_digest("vocoder")
    assert first.stage_path("flow").read_bytes() == b"plan bytesflow"
    assert [path.name for path in tmp_path.iterdir() if not path.name.startswith(".lock")] == [
        first.path.name
    ]


@pytest.mark.parametrize(
    "damage",
    ["truncate", "flip", "delete_file", "delete_manifest", "foreign_manifest"],
)
def test_damaged_entry_is_detected_and_rebuilt(tmp_path: Path, damage: str) -> None:
    cache, builder = EngineCache(tmp_path), CountingBuilder()
    entry = cache.build(key(), builder)
    plan = entry.path / "vocoder.plan"
    if damage == "truncate":
        plan.write_bytes(plan.read_bytes()[:-3])
    elif damage == "flip":
        plan.write_bytes(b"X" + plan.read_bytes()[1:])
    elif damage == "delete_file":
        plan.unlink()
    elif damage == "delete_manifest":
        (entry.path / MANIFEST).unlink()
    else:
        manifest = json.loads((entry.path / MANIFEST).read_text())
        manifest["key"]["gpu_product"] = "NVIDIA-A10G"
        (entry.path / MANIFEST).write_text(json.dumps(manifest))
    assert cache.verify(key())
    assert cache.lookup(key()) is None
    with pytest.raises(EngineCacheError, match="not usable"):
        cache.open(key())
    rebuilt = cache.build(key(), builder)
    assert rebuilt.built and builder.calls == 2
    assert cache.verify(key()) == []


def test_failed_build_leaves_no_entry_and_no_temp_dir(tmp_path: Path) -> None:
    def broken(out_dir: Path) -> dict[str, str]:
        (out_dir / "encoder.plan").write_bytes(b"half")
        raise RuntimeError("builder crashed")

    cache = EngineCache(tmp_path)
    with pytest.raises(RuntimeError, match="builder crashed"):
        cache.build(key(), broken)
    assert not cache.entry_dir(key()).exists()
    assert not list(tmp_path.glob(".tmp-*"))
    assert cache.build(key(), CountingBuilder()).built


def test_builder_that_lies_about_its_files_is_refused(tmp_path: Path) -> None:
    with pytest.raises(EngineCacheError, match="did not write it"):
        EngineCache(tmp_path).build(key(), lambda out_dir: {"vocoder.plan": "vocoder"})


def test_entries_lists_keys_by_manifest(tmp_path: Path) -> None:
    cache = EngineCache(tmp_path)
    cache.build(key(), CountingBuilder())
    cache.build(key(precision="int8"), CountingBuilder())
    assert {k.precision for k in cache.entries()} == {"fp16", "int8"}
