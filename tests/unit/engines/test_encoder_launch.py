"""How a GPU runs encoder calls is part of the serving plan (`WindowConfig.encoder_launch`):
`voxfleet serve --encoder-launch` and a TTSVoice's `batching.encoderLaunch` set it, the plan
refuses what no runtime knows; the encoder's precision likewise (`--encoder-precision`,
`encoderPrecision`), refused where the runtime cannot run it; `--first-window-frames`
likewise sets the first window. (That the scheduler gives the same audio in every launch
mode is checked on a GPU: tests/gpu/test_torch_cuda_gpu.py.)"""

from __future__ import annotations

import pytest

from engines import cli
from engines.commands.serve import plan_from_args
from engines.contract.plan import ENCODER_LAUNCHES, RUNTIMES, ServingPlan, WindowConfig


def _serve_plan(monkeypatch: pytest.MonkeyPatch, *options: str) -> ServingPlan:
    # The voice's engines are not built here: the plan template is what the options decide.
    monkeypatch.setattr(
        "engines.commands.local_serving.plan_local_voices",
        lambda voices, cache, template: [template],
    )
    args = cli.build_parser().parse_args(["serve", "--voice", "joe", *options])
    (plan,) = plan_from_args(args)
    return plan


def test_serve_queues_the_encoder_behind_the_windows_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _serve_plan(monkeypatch).windows.encoder_launch == "queued"
    for mode in ENCODER_LAUNCHES:
        plan = _serve_plan(monkeypatch, "--runtime", "torch-cuda", "--encoder-launch", mode)
        assert plan.windows.encoder_launch == mode
        # The plan travels as JSON to the stream model: the mode arrives.
        assert ServingPlan.from_json(plan.to_json()).windows.encoder_launch == mode


def test_an_unknown_encoder_launch_is_refused_with_the_choices(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _serve_plan(monkeypatch, "--encoder-launch", "sideways")
    assert "invalid choice: 'sideways'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="encoder_launch is one of inline, beside, queued"):
        WindowConfig(encoder_launch="sideways")


def test_serve_sets_the_first_window_and_refuses_one_past_the_steady_size(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`voxfleet serve --first-window-frames` is a TTSVoice's `streaming.firstWindowFrames`:
    the plan carries it to the stream model, and one longer than the steady window is refused
    with the reason."""
    assert _serve_plan(monkeypatch).windows.first_window_frames == 16
    plan = _serve_plan(monkeypatch, "--first-window-frames", "32")
    assert ServingPlan.from_json(plan.to_json()).windows.first_window_frames == 32
    with pytest.raises(ValueError, match=r"first_window_frames \(200\) must not exceed"):
        _serve_plan(monkeypatch, "--first-window-frames", "200")


def test_serve_keeps_the_encoder_at_fp32_unless_told_and_only_where_it_can_run_faster(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The voice's own audio by default; fp16 or bf16 only on the torch-cuda runtime, where
    the plan carries it to the stream model; asked of a runtime that cannot run it, a clear
    error naming what that runtime runs, not a silent fp32."""
    assert _serve_plan(monkeypatch).windows.encoder_precision == "fp32"
    for precision in ("fp16", "bf16"):
        plan = _serve_plan(monkeypatch, "--runtime", "torch-cuda", "--encoder-precision", precision)
        assert ServingPlan.from_json(plan.to_json()).windows.encoder_precision == precision
    with pytest.raises(
        ValueError, match=r"onnxruntime runtime runs the encoder at fp32, not 'fp16'"
    ):
        _serve_plan(monkeypatch, "--runtime", "onnxruntime", "--encoder-precision", "fp16")
    with pytest.raises(SystemExit):
        _serve_plan(monkeypatch, "--encoder-precision", "int8")
    assert "invalid choice: 'int8'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="encoder_precision is one of fp32, fp16, bf16"):
        WindowConfig(encoder_precision="int8")
    # Every runtime runs the voice's own audio first.
    assert {info.encoder_precisions[0] for info in RUNTIMES.values()} == {"fp32"}
