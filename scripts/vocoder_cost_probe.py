"""The vocoder's device cost per frame on a GPU, and where its kernels spend it.

The torch-cuda runtime's vocoder (the ONNX graph ported node by node, replayed from CUDA
graphs) is timed per call for the window batches the stream model sends, with its 1-D
convolutions in the default layout (VOXFLEET_CONV_CHANNELS_LAST=0) and as channels-last 2-D
ones (the default on a GPU in FP16: cuDNN's tensor-core kernels work in channels-last, so a
1-D convolution in the default layout pays two layout transposes per call), with the audio's
SNR between the two. Then each one's kernels, run eagerly under torch.profiler, by kind:
element-wise (the LeakyReLU, Add and Div between the convolutions), layout transposes,
convolutions, other.

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
from engines.torch_cuda.convert import CHANNELS_LAST_ENV
from engines.torch_cuda.runtime import TorchCudaStages

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
    if "elementwise" in name:
        return "element-wise"
    if "xmma" in name or "cutlass" in name or "conv" in name.lower() or "gemm" in name.lower():
        return "convolutions"
    return "other"


def kernel_shares(stages: TorchCudaStages, windows: int, frames: int) -> dict[str, Any]:
    latent = torch.randn(windows, 192, frames, device="cuda", dtype=stages.vocoder_dtype)
    module = stages.vocoder_module
    for _ in range(3):
        module(latent=latent)
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(5):
            module(latent=latent)
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


def main() -> None:
    entry = build_engines(resolve_voice_model("joe"), "torch-cuda", "fp16", "/tmp/vc").path
    generator = torch.Generator(device="cuda").manual_seed(0)
    latents = [
        torch.randn(windows, 192, frames, device="cuda", generator=generator) * 0.8
        for windows, frames in SHAPES
    ]
    results: dict[str, Any] = {"gpu": torch.cuda.get_device_name(), "calls": {}, "kernels": {}}
    outputs: dict[str, list[torch.Tensor]] = {}
    for name, switch in (("default_layout", "0"), ("channels_last", "1")):
        os.environ[CHANNELS_LAST_ENV] = switch  # read as each module loads
        stages = TorchCudaStages(entry)
        outputs[name] = []
        for (windows, frames), latent in zip(SHAPES, latents, strict=True):
            ms, out = time_ms(partial(stages.vocode_tensor, latent))
            outputs[name].append(out)
            row = results["calls"].setdefault(f"{windows}x{frames}", {})
            row[name] = {
                "ms": round(ms, 3),
                "us_per_frame": round(ms * 1e3 / (windows * frames), 3),
            }
        results["kernels"][name] = kernel_shares(stages, 64, 144)
        print(name, json.dumps(results["kernels"][name]), flush=True)
    for index, key in enumerate(results["calls"]):
        row = results["calls"][key]
        pair = outputs["default_layout"][index], outputs["channels_last"][index]
        row["snr_db"] = audio_snr_db(*pair)
        print(key, json.dumps(row), flush=True)
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "vocoder-probe.json"), "w") as handle:
        json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()
