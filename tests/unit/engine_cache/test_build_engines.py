"""`voxfleet build-engines` on the real joe voice (onnxruntime: the split graphs)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engines.build.engine_build import (
    EngineBuildError,
    Target,
    build_engines,
    check_entry_target,
    resolve_voice_model,
)
from engines.cli import main
from engines.runtimes import load_stages


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict, str]:
    status = main(["build-engines", *argv])
    captured = capsys.readouterr()
    return status, (json.loads(captured.out) if status == 0 else {}), captured.err


def test_build_once_then_no_op_then_serve_from_the_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, first, _ = run_cli(capsys, "--voice", "joe", "--cache", str(tmp_path))
    assert status == 0 and first["built"] is True
    assert set(first["files"]) == {"encoder.onnx", "flow.onnx", "vocoder.onnx", "voice.onnx.json"}
    status, second, _ = run_cli(capsys, "--voice", "joe", "--cache", str(tmp_path))
    assert status == 0 and second["built"] is False and second["key"] == first["key"]

    stages = load_stages("onnxruntime", Path(first["entry"]))
    ids = np.array([[1, 0, 20, 0, 25, 0, 2]], dtype=np.int64)
    prior, mask = stages.encode(ids, np.array([7]), np.array([0.0, 1.0, 0.0], np.float32))
    audio = stages.vocode(stages.flow(prior, mask))
    assert audio.shape == (1, mask.shape[-1] * 256)
    assert np.abs(audio).max() > 0.01  # speech, not silence


def test_damaged_entry_is_rebuilt_by_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = resolve_voice_model("joe")
    target = Target(runtime_version="onnxruntime-test")
    entry = build_engines(model, "onnxruntime", "fp32", tmp_path, target=target)
    vocoder = entry.stage_path("vocoder")
    vocoder.write_bytes(vocoder.read_bytes()[: vocoder.stat().st_size // 2])
    again = build_engines(model, "onnxruntime", "fp32", tmp_path, target=target)
    assert again.built and again.path == entry.path
    assert again.stage_path("vocoder").stat().st_size == entry.files["vocoder.onnx"]["bytes"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runtime", "onnxruntime", "--precision", "fp16"], "does not build fp16"),
        (["--runtime", "torch-cuda", "--precision", "int8"], "does not build int8"),
        (["--voice", "nobody"], "no voice named 'nobody'"),
        (["--voice", "http://example.invalid/voice.txt"], "must name a Piper .onnx"),
        (["--runtime", "tensorrt", "--gpu-product", "Tesla-T4"], "only with --runtime torch-cuda"),
    ],
)
def test_bad_requests_get_a_specific_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    status, _, err = run_cli(capsys, *argv, "--cache", str(tmp_path))
    assert status == 2
    assert message in err
    assert not [p for p in tmp_path.iterdir() if not p.name.startswith(".")]


def test_tensorrt_without_tensorrt_says_where_to_run_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("onnx")
    try:
        import tensorrt  # noqa: F401

        pytest.skip("tensorrt is installed here; the build itself is tested in tests/gpu")
    except ImportError:
        pass
    status, _, err = run_cli(capsys, "--runtime", "tensorrt", "--cache", str(tmp_path))
    assert status == 2 and "NVIDIA's TensorRT and Triton images" in err


def test_entry_for_another_gpu_is_refused_with_both_names(tmp_path: Path) -> None:
    model = resolve_voice_model("joe")
    built_for = Target("torch-2.13.0-cuda-12.8", "Tesla-T4", "7.5")
    entry = build_engines(model, "onnxruntime", "fp32", tmp_path, target=built_for)
    with pytest.raises(EngineBuildError, match=r"built for Tesla-T4.*this machine is NVIDIA-H100"):
        check_entry_target(entry, Target("torch-2.13.0-cuda-12.8", "NVIDIA-H100-80GB-HBM3", "9.0"))
    check_entry_target(entry, built_for)


def test_publish_as_names_the_entry_where_pods_load_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status, report, _ = run_cli(
        capsys, "--voice", "joe", "--cache", str(tmp_path), "--publish-as", "a1b2c3"
    )
    assert status == 0
    published = tmp_path / "a1b2c3"
    assert report["published"] == str(published)
    assert published.resolve() == Path(report["entry"]).resolve()
    assert (published / "voice.onnx.json").is_file() and (published / "vocoder.onnx").is_file()
    # Publishing again (a rerun of the Job) is a no-op that keeps the link valid.
    status, again, _ = run_cli(
        capsys, "--voice", "joe", "--cache", str(tmp_path), "--publish-as", "a1b2c3"
    )
    assert status == 0 and again["built"] is False and published.resolve() == published.resolve()
    status, _, error = run_cli(
        capsys, "--voice", "joe", "--cache", str(tmp_path), "--publish-as", "../escape"
    )
    assert status == 2 and "--publish-as" in error


def test_a_voice_with_another_digest_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VOXFLEET_VOICE_SHA256", "0" * 64)
    status, _, error = run_cli(capsys, "--voice", "joe", "--cache", str(tmp_path))
    assert status == 2
    assert "not the expected 0000" in error
    assert not any(tmp_path.glob("*/manifest.json")), "nothing may be built from the wrong voice"
