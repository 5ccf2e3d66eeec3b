"""The vocoder's device cost per frame on a GPU, and where its kernels spend it.

The torch-cuda runtime's vocoder (replayed from CUDA graphs) is timed per call for the window
batches the stream model sends, in four forms:

- ``default_layout``: the ONNX graph ported node by node, its 1-D convolutions in the default
  layout (VOXFLEET_CONV_CHANNELS_LAST=0);
- ``channels_last``: the same as channels-last 2-D convolutions (the default on a GPU in FP16:
  cuDNN's tensor-core kernels work in channels-last, so a 1-D convolution in the default
  layout pays two layout transposes per call);
- ``compiled``: `VocoderCore` compiled by torch.compile with dynamic shapes, as
  VOXFLEET_VOCODER_COMPILE=1 runs it;
- ``compiled_static``: the same compiled once per shape (for comparison only: the runtime
  captures dozens of shapes, more than torch.compile recompiles for).

Each is compared with the default layout's audio (SNR). Then each one's kernels, run without
graphs under torch.profiler, by kind: element-wise (the LeakyReLU, Add and Div between the
convolutions, or inductor's fused kernels), layout transposes, convolutions, other.

Usage, on a CUDA machine with the joe voice installed (docs/gpu.md):
    OUT=results PYTHONPATH=. python3 scripts/vocoder_cost_probe.py
Writes $OUT/vocoder-probe.json.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from engines.bench.gpu_bench import snr_db
from engines.engine_build import build_engines, resolve_voice_model
from engines.torch_cuda import vocoder
from engines.torch_cuda.convert import CHANNELS_LAST_ENV
from engines.torch_cuda.runtime import (
    DEFAULT_BATCH_BUCKETS,
    VOCODER_COMPILE_ENV,
    GraphedStage,
    StageFunction,
    TorchCudaStages,
)

# (windows, frames): steady windows of 128 frames with 8 context frames each side, as a step
# batches them, and a batch of first windows (16 frames and their context, padded to 32).
SHAPES = [(32, 144), (64, 144), (128, 144), (16, 32)]
CALLS = 30


def time_ms(call: Callable[[], torch.Tensor]) -> tuple[float, torch.Tensor]:
    """Mean device milliseconds of CALLS calls after three to warm up, and the last output."""
    for _ in range(3):
        out = call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(CALLS):
        out = call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / CALLS, out


def audio_snr_db(reference: torch.Tensor, other: torch.Tensor) -> float:
    """`gpu_bench.snr_db` of two calls' audio (inf where they are identical)."""
    return round(snr_db(reference.float().cpu().numpy(), other.float().cpu().numpy()), 1)


def kernel_kind(name: str) -> str:
    if "nchwToNhwc" in name or "nhwcToNchw" in name:
        return "layout transposes"
    if name.startswith("triton_"):
        return "fused element-wise (inductor)"
    if "elementwise" in name:
        return "element-wise"
    if "xmma" in name or "cutlass" in name or "conv" in name.lower() or "gemm" in name.lower():
        return "convolutions"
    return "other"


def kernel_shares(
    function: StageFunction, dtype: torch.dtype, windows: int, frames: int
) -> dict[str, Any]:
    """Device time per call of `function` (a stage's calls, without graphs) by kernel kind."""
    latent = torch.randn(windows, 192, frames, device="cuda", dtype=dtype)
    for _ in range(3):
        function({"latent": latent})
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(5):
            function({"latent": latent})
        torch.cuda.synchronize()
    kinds: dict[str, float] = {}
    for event in profile.key_averages():
        device_us = float(getattr(event, "self_device_time_total", 0.0))
        if device_us > 0:
            kind = kernel_kind(event.key)
            kinds[kind] = kinds.get(kind, 0.0) + device_us
    total = sum(kinds.values())
    return {
        "shape": [windows, frames],
        "device_ms_per_call": round(total / 5 / 1000, 3),
        "shares": {kind: round(us / total, 3) for kind, us in sorted(kinds.items())},
    }


# The runtime's switches per form (read as each runtime loads).
FORMS = {
    "default_layout": {CHANNELS_LAST_ENV: "0", VOCODER_COMPILE_ENV: "0"},
    "channels_last": {CHANNELS_LAST_ENV: "1", VOCODER_COMPILE_ENV: "0"},
    "compiled": {CHANNELS_LAST_ENV: "1", VOCODER_COMPILE_ENV: "1"},
}


def static_compiled(stages: TorchCudaStages, entry: Any) -> GraphedStage:
    """The channels-last `VocoderCore` compiled once per shape, graphed as the runtime does."""
    module = stages.vocoder_module
    core = vocoder.from_onnx(entry / "vocoder.onnx", stages.device, module.float_dtype, True)
    compiled = torch.compile(core, dynamic=False)
    return GraphedStage(
        module,
        DEFAULT_BATCH_BUCKETS,
        pool=torch.cuda.graph_pool_handle(),
        frame_multiple=stages.vocoder_stage.frame_multiple,
        function=lambda inputs: [compiled(inputs["latent"])],
    )


def main() -> None:
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/vc").path
    generator = torch.Generator(device="cuda").manual_seed(0)
    latents = [
        (torch.randn(windows, 192, frames, device="cuda", generator=generator) * 0.8).half()
        for windows, frames in SHAPES
    ]
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "calls": {}, "kernels": {}}
    outputs: dict[str, list[torch.Tensor]] = {}
    for name in [*FORMS, "compiled_static"]:
        os.environ.update(FORMS.get(name, FORMS["channels_last"]))
        stages = TorchCudaStages(entry)
        stage = (
            static_compiled(stages, entry) if name == "compiled_static" else stages.vocoder_stage
        )
        if name == "compiled":
            assert stages.vocoder_compiled, "VocoderCore refused this voice (see the log)"
        outputs[name] = []
        for index, ((windows, frames), latent) in enumerate(zip(SHAPES, latents, strict=True)):
            ms, out = time_ms(partial(stage, {"latent": latent}))
            outputs[name].append(out)
            row = results["calls"].setdefault(f"{windows}x{frames}", {})
            row[name] = {
                "ms": round(ms, 3),
                "us_per_frame": round(ms * 1e3 / (windows * frames), 3),
            }
            if name != "default_layout":
                row[name]["snr_db"] = audio_snr_db(outputs["default_layout"][index], out)
            print(name, windows, frames, json.dumps(row[name]), flush=True)
        if name != "compiled_static":
            shares = kernel_shares(stage.function, stages.vocoder_dtype, 64, 144)
            results["kernels"][name] = shares
            print(name, json.dumps(shares), flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "vocoder-probe.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
