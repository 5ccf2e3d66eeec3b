"""Several voices' windows in one call: `python -m lab.grouped_voices`.

A pool pod's scheduler runs one call per voice and stage in a step (docs/gpu.md, "Many voices
on one GPU"): ten voices with 12 windows each make ten vocoder calls of 12 windows where one
voice makes one call of 120, and a call's cost is mostly fixed. This bench measures what one
call over several voices' weights would buy, before the scheduler is changed to make such
calls: the torch-cuda runtime's encoder core (engines/runtimes/torch_cuda/acoustic.py), flow
and vocoder (the ONNX interpreter the pod runs, engines/runtimes/torch_cuda/convert.py), run
under `torch.func.vmap` over stacked weights, so that each voice's rows meet only its own
weights (the convolutions become grouped ones, the matrix products batched ones).

For each voice count L it times, at the same total of windows:
- `one`: one voice, one call of every window (what one voice gets today);
- `split`: L calls of their share each, the weights bound before each (what L voices get);
- `grouped`: one call over L voices' stacked weights.

and checks that each voice's rows of the grouped call equal its own call's. On a GPU each of
the three is also captured into a CUDA graph and timed as replays (`*_graph_ms`), as the pod
runs its calls; eager calls pay a launch per kernel, which overstates what fewer calls save.
The ratios, not the milliseconds, are the figures. Writes JSON to `--out`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engines.runtimes.torch_cuda import acoustic
from engines.runtimes.torch_cuda.convert import OnnxModule
from engines.streaming.frames import LATENT_CHANNELS
from lab.gpu_bench import median_seconds


def graphed(call: Callable[[], Any], device: torch.device) -> Callable[[], Any]:
    """`call` captured into a CUDA graph (after two calls on a side stream): its replay."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(2):
            call()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph.replay


def perturbed(weights: dict[str, torch.Tensor], count: int, seed: int = 7) -> list[dict]:
    """`count` weight sets: the voice's own and copies with 1 % noise (distinct voices)."""
    generator = torch.Generator().manual_seed(seed)
    sets = [weights]
    for _ in range(count - 1):
        sets.append(
            {
                name: tensor
                + 0.01
                * tensor.abs().mean()
                * torch.randn(tensor.shape, generator=generator).to(tensor.device, tensor.dtype)
                for name, tensor in weights.items()
            }
        )
    return sets


class Stage:
    """One ONNX stage whose weights can be swapped, or stacked and mapped over."""

    def __init__(self, module: Any, inputs: Callable[[int], dict[str, torch.Tensor]]):
        self.module = module
        self.inputs = inputs
        self.own = {n: t.clone() for n, t in module.weight_tensors().items()}

    def call(self, weights: dict[str, torch.Tensor], feeds: dict[str, torch.Tensor]) -> Any:
        self.module.use_weights(weights)
        return self.module(**feeds)[0]

    def grouped(self, stacked: dict[str, torch.Tensor], feeds: dict[str, torch.Tensor]) -> Any:
        """One call: feeds and weights carry a leading voice dimension."""
        try:
            return torch.func.vmap(self.call)(stacked, feeds)
        finally:
            self.module.use_weights(self.own)


def measure(stage: Stage, voices: int, windows: int, device: torch.device, repeat: int) -> dict:
    per_voice = max(1, windows // voices)
    total = per_voice * voices
    sets = perturbed(stage.own, voices)
    stacked = {n: torch.stack([s[n] for s in sets]) for n in stage.own}
    feeds = stage.inputs(total)
    lanes = {n: t.reshape(voices, per_voice, *t.shape[1:]) for n, t in feeds.items()}
    shares = [{n: t[i] for n, t in lanes.items()} for i in range(voices)]

    def one() -> Any:
        return stage.call(stage.own, feeds)

    def split() -> list[Any]:
        return [stage.call(sets[i], shares[i]) for i in range(voices)]

    def grouped() -> Any:
        return stage.grouped(stacked, lanes)

    with torch.no_grad():
        separate = split()
        together = grouped()
        error = max(
            float((together[i].float() - separate[i].float()).abs().max()) for i in range(voices)
        )
        scale = max(float(s.float().abs().max()) for s in separate)
        distinct = (
            float((separate[0].float() - separate[-1].float()).abs().max()) if voices > 1 else 0.0
        )
        one_s = median_seconds(one, repeat, warmup=2)
        split_s = median_seconds(split, repeat, warmup=2)
        grouped_s = median_seconds(grouped, repeat, warmup=2)
        graphs: dict[str, Any] = {}
        if device.type == "cuda":
            for label, call in (("one", one), ("split", split), ("grouped", grouped)):
                try:
                    graphs[f"{label}_graph_ms"] = round(
                        median_seconds(graphed(call, device), repeat, warmup=2) * 1000, 3
                    )
                except Exception as error:  # report it; the eager figures still stand
                    graphs[f"{label}_graph_error"] = f"{type(error).__name__}: {error}"[:300]
            if "one_graph_ms" in graphs:
                for label in ("split", "grouped"):
                    if f"{label}_graph_ms" in graphs:
                        graphs[f"{label}_graph_vs_one"] = round(
                            graphs["one_graph_ms"] / graphs[f"{label}_graph_ms"], 3
                        )
    stage.module.use_weights(stage.own)
    return {
        "voices": voices,
        "windows": total,
        "one_ms": round(one_s * 1000, 3),
        "split_ms": round(split_s * 1000, 3),
        "grouped_ms": round(grouped_s * 1000, 3),
        # Throughput against one voice's at the same windows (1.0: as fast as one voice).
        "split_vs_one": round(one_s / split_s, 3),
        "grouped_vs_one": round(one_s / grouped_s, 3),
        "max_abs_error": error,
        "output_scale": scale,
        "voices_differ_by": distinct,
        **graphs,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-dir", type=Path, required=True, help="a torch-cuda engine entry")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--voices", default="1,2,4,8,10")
    parser.add_argument("--windows", default="32,128", help="total windows per call")
    parser.add_argument("--frames", type=int, default=48, help="latent frames per window")
    parser.add_argument("--phonemes", type=int, default=64, help="phonemes per sentence")
    parser.add_argument("--stages", default="encoder,flow,vocoder")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    generator = torch.Generator().manual_seed(3)

    def latent(batch: int) -> dict[str, torch.Tensor]:
        shape = (batch, LATENT_CHANNELS, args.frames)
        return {"latent": torch.randn(shape, generator=generator).to(device, dtype)}

    def prior(batch: int) -> dict[str, torch.Tensor]:
        shape = (batch, LATENT_CHANNELS, args.frames)
        return {
            "prior": torch.randn(shape, generator=generator).to(device, dtype),
            "mask": torch.ones(batch, 1, args.frames, device=device, dtype=dtype),
        }

    def sentences(batch: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(1, 100, (batch, args.phonemes), generator=generator)
        return {
            "ids": ids.to(device),
            "lengths": torch.full((batch,), args.phonemes, dtype=torch.int64, device=device),
            "noise": torch.randn(batch, 2, args.phonemes, generator=generator).to(device) * 0.8,
        }

    makers = {"vocoder": latent, "flow": prior, "encoder": sentences}
    result: dict[str, Any] = {
        "command": " ".join(["python -m lab.grouped_voices", *(argv or sys.argv[1:])]),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dtype": str(dtype),
        "frames": args.frames,
        "stages": {},
    }
    for name in args.stages.split(","):
        path = args.engine_dir / f"{name}.onnx"
        if name == "encoder":  # FP32, as the pod runs it
            module: Any = acoustic.from_onnx(path, device)
        else:
            module = OnnxModule(path, device, dtype)
            # vmap cannot lay batched tensors out channels-last (PyTorch: "NYI"): plain 1-D
            # convolutions in all three modes, where the pod runs FP16 ones channels-last.
            module.channels_last = False
        stage = Stage(module, makers[name])
        if name != "encoder" and module.float_dtype == torch.float16 and device.type == "cuda":
            # The pod's own kernels for one voice's call (channels-last FP16): the baseline the
            # plain-convolution figures stand beside.
            pod = OnnxModule(path, device, dtype)
            pod_rows = {}
            with torch.no_grad():
                for windows in (int(w) for w in args.windows.split(",")):
                    feeds = makers[name](windows)

                    def one_call(pod: OnnxModule = pod, feeds: dict = feeds) -> Any:
                        return pod(**feeds)[0]

                    replay = graphed(one_call, device)
                    seconds = median_seconds(replay, args.repeat, warmup=2)
                    pod_rows[str(windows)] = round(seconds * 1000, 3)
            result.setdefault("one_voice_pod_kernels_graph_ms", {})[name] = pod_rows
            print(name, "pod kernels, one voice (graph ms by windows):", pod_rows, flush=True)
        rows = []
        for windows in (int(w) for w in args.windows.split(",")):
            for voices in (int(v) for v in args.voices.split(",")):
                row = measure(stage, voices, windows, device, args.repeat)
                rows.append(row)
                print(name, json.dumps(row), flush=True)
        result["stages"][name] = rows
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
