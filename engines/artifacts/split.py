"""Cut a monolithic Piper VITS graph into streamable stages.

The VITS generator is text encoder + duration predictor → prior frames → normalising flow →
HiFi-GAN decoder. Only the first part needs the whole sentence; the flow and the decoder are
convolutional along time, so both can run on windows of frames with context on each side.
We therefore cut three graphs out of the one ONNX file:

- ``encoder``: phoneme ids, lengths, scales → ``prior`` (z_p, [B, 192, T]) and ``mask`` ([B, 1, T])
- ``flow``: ``prior``, ``mask`` → ``latent`` (z * mask, the decoder's only outside input)
- ``vocoder``: ``latent`` → ``audio`` ([B, 1, T * hop])

``encoder`` + ``flow`` is the acoustic stage (ids → latent frames). Chained, the three reproduce
the monolithic output exactly when the noise scales are 0 (tests/unit/engines/test_split.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import utils as onnx_utils

STAGES = ("encoder", "flow", "vocoder")


@dataclass(frozen=True)
class CutPoints:
    """Tensor names at which a Piper VITS export is cut (those of the standard export)."""

    prior: str = "/Add_output_0"  # m_p + noise * exp(logs_p) * noise_scale
    mask: str = "/Cast_2_output_0"  # y_mask, float [B, 1, T]
    latent: str = "/Mul_7_output_0"  # flow output times the mask: the decoder's input


class SplitError(ValueError):
    """The graph is not a Piper VITS export we know how to cut."""


def _rename(model: onnx.ModelProto, renames: dict[str, str]) -> onnx.ModelProto:
    for node in model.graph.node:
        node.input[:] = [renames.get(name, name) for name in node.input]
        node.output[:] = [renames.get(name, name) for name in node.output]
    for value in list(model.graph.input) + list(model.graph.output):
        value.name = renames.get(value.name, value.name)
    return model


def _check_cut_points(model: onnx.ModelProto, cuts: CutPoints) -> None:
    produced = {name for node in model.graph.node for name in node.output}
    missing = [name for name in (cuts.prior, cuts.mask, cuts.latent) if name not in produced]
    if missing:
        raise SplitError(
            f"the voice graph has no tensor(s) {', '.join(missing)}; expected a Piper VITS "
            "export whose HiFi-GAN decoder nodes are named /dec/..."
        )
    decoder_inputs = {
        name
        for node in model.graph.node
        if node.name.startswith("/dec/")
        for name in node.input
        if name not in {init.name for init in model.graph.initializer}
        and not any(name in n.output for n in model.graph.node if n.name.startswith("/dec/"))
    }
    if decoder_inputs and decoder_inputs != {cuts.latent}:
        raise SplitError(
            f"the decoder reads {sorted(decoder_inputs)}, not only {cuts.latent}; "
            "this export cannot be split at the decoder input"
        )


def split_voice(model_path: Path, out_dir: Path, cuts: CutPoints | None = None) -> dict[str, Path]:
    """Write ``encoder.onnx``, ``flow.onnx`` and ``vocoder.onnx`` into ``out_dir``."""
    cuts = cuts or CutPoints()
    model = onnx.load(str(model_path))
    _check_cut_points(model, cuts)
    out_dir.mkdir(parents=True, exist_ok=True)
    graph_inputs = [value.name for value in model.graph.input]
    graph_output = model.graph.output[0].name
    plans = {
        "encoder": (graph_inputs, [cuts.prior, cuts.mask]),
        "flow": ([cuts.prior, cuts.mask], [cuts.latent]),
        "vocoder": ([cuts.latent], [graph_output]),
    }
    renames = {cuts.prior: "prior", cuts.mask: "mask", cuts.latent: "latent", graph_output: "audio"}
    extractor = onnx_utils.Extractor(model)
    paths: dict[str, Path] = {}
    for stage, (inputs, outputs) in plans.items():
        part = extractor.extract_model(inputs, outputs)
        part = _rename(part, renames)
        part.graph.name = f"voxfleet_{stage}"
        path = out_dir / f"{stage}.onnx"
        onnx.save(part, str(path))
        paths[stage] = path
    return paths
