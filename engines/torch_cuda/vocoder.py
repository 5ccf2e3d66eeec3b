"""The Piper VITS generator (the vocoder stage) written as PyTorch modules, for torch.compile.

Ported node by node (engines.torch_cuda.convert), the vocoder's element-wise work (the leaky
ReLUs, residual adds and the division of each stage's resblock sum) runs a kernel per ONNX
node: 71 % of its device time on the H100 once its convolutions are channels-last
(a probe of 2026-11-24, docs/history.md). `VocoderCore` computes the same arithmetic as plain torch
calls, so that torch.compile (inductor) can fuse that work into few kernels:

- convolutions over channels-last rows [N, C, 1, T] (``rows=True``, as the port runs them on
  a GPU in FP16) or over [N, C, T];
- the resblocks of a stage share the leaky ReLU of their common input;
- each stage's resblock sum is divided by their count in the ONNX graph; that division is
  folded into the next convolution's weights instead (``leaky(x / k) = leaky(x) / k`` for
  ``k > 0``, and a convolution is linear in its input).

Weights are the ONNX initializers, found by the names Piper's export keeps (``dec.conv_pre``,
``dec.ups.N``, ``dec.resblocks.N.convs.J``, ``dec.conv_post``); `from_onnx` refuses graphs
that lack them, hold other operators (multi-speaker voices' ``dec.cond``, the three-pair
resblocks of other VITS configs) or whose arithmetic it does not reproduce, and the runtime then
keeps the node-by-node port. Checked against onnxruntime in tests/gpu/test_torch_port.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import Tensor

from engines.torch_cuda.convert import _Node

# The operators of a Piper generator graph (ResBlock2, single speaker), and nothing else.
GENERATOR_OPS = {"Conv", "ConvTranspose", "LeakyRelu", "Add", "Div", "Tanh", "Unsqueeze"}
# The largest relative error against the node-by-node port `check` accepts: FP16 rounding
# differs where the division moves into the weights (about 2e-3, 52 dB of SNR); a graph
# this core does not reproduce is off by its whole signal.
CHECK_TOLERANCE = 2e-2


class NotPiperGenerator(ValueError):
    """The graph is not a single-speaker Piper VITS generator that `VocoderCore` reproduces."""


@dataclass(frozen=True)
class _Layer:
    """One 1-D convolution (or transposed convolution) of the generator."""

    weight: Tensor
    bias: Tensor | None
    stride: int
    padding: int
    dilation: int
    transposed: bool


class VocoderCore(torch.nn.Module):
    """latent [N, 192, T] -> audio [N, 1, 1, T * hop], as the vocoder ONNX graph computes it."""

    def __init__(
        self,
        layers: dict[str, _Layer],
        slope: float,
        last_slope: float,
        stages: int,
        kernels: int,
        rows: bool,
    ) -> None:
        super().__init__()
        self.rows = rows
        self.slope, self.last_slope = slope, last_slope
        self.kernels = kernels
        self.pre = layers["dec.conv_pre"]
        self.ups = [layers[f"dec.ups.{i}"] for i in range(stages)]
        self.blocks = [
            [layers[f"dec.resblocks.{b}.convs.{j}"] for j in range(2)]
            for b in range(stages * kernels)
        ]
        self.post = layers["dec.conv_post"]

    def _conv(self, x: Tensor, layer: _Layer) -> Tensor:
        if self.rows:
            stride, padding = (1, layer.stride), (0, layer.padding)
            if layer.transposed:
                return F.conv_transpose2d(x, layer.weight, layer.bias, stride, padding)
            dilation = (1, layer.dilation)
            return F.conv2d(x, layer.weight, layer.bias, stride, padding, dilation)
        if layer.transposed:
            return F.conv_transpose1d(x, layer.weight, layer.bias, layer.stride, layer.padding)
        return F.conv1d(x, layer.weight, layer.bias, layer.stride, layer.padding, layer.dilation)

    def forward(self, latent: Tensor) -> Tensor:
        x = (
            latent.unsqueeze(2).contiguous(memory_format=torch.channels_last)
            if self.rows
            else latent
        )
        x = self._conv(x, self.pre)
        for stage, up in enumerate(self.ups):
            x = self._conv(F.leaky_relu(x, self.slope), up)
            first = F.leaky_relu(x, self.slope)
            total: Tensor | None = None
            for block in self.blocks[stage * self.kernels : (stage + 1) * self.kernels]:
                y = self._conv(first, block[0]) + x
                y = self._conv(F.leaky_relu(y, self.slope), block[1]) + y
                total = y if total is None else total + y
            assert total is not None
            x = total  # divided by self.kernels in the next convolution's weights
        x = torch.tanh(self._conv(F.leaky_relu(x, self.last_slope), self.post))
        return x.reshape(x.shape[0], 1, 1, -1)


def _one(values: Any, name: str, node: onnx.NodeProto) -> int:
    """A 1-D convolution's per-axis attribute (pads: begin and end must agree)."""
    items = list(values) if isinstance(values, list | tuple) else [values]
    if len(set(items)) != 1:
        raise NotPiperGenerator(f"{node.name}: {name} {items} is not one symmetric value")
    return int(items[0])


def from_onnx(
    model: onnx.ModelProto | Path | str,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    rows: bool = False,
) -> VocoderCore:
    """A `VocoderCore` from a Piper vocoder graph, or `NotPiperGenerator` (see the module)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    if [value.name for value in model.graph.input] != ["latent"]:
        raise NotPiperGenerator("multi-speaker vocoders use the node-by-node port")
    ops = Counter(node.op_type for node in model.graph.node)
    if set(ops) - GENERATOR_OPS:
        raise NotPiperGenerator(f"operators beyond a Piper generator's: {set(ops) - GENERATOR_OPS}")
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    convolutions = {
        node.input[1].removesuffix(".weight"): node
        for node in model.graph.node
        if node.op_type in ("Conv", "ConvTranspose")
    }
    slopes = [
        float(_Node(node).attrs.get("alpha", 0.01))
        for node in model.graph.node
        if node.op_type == "LeakyRelu"
    ]
    stages = len([n for n in convolutions if re.fullmatch(r"dec\.ups\.\d+", n)])
    blocks = len([n for n in convolutions if re.fullmatch(r"dec\.resblocks\.\d+\.convs\.0", n)])
    expected = {"dec.conv_pre", "dec.conv_post"}
    expected |= {f"dec.ups.{i}" for i in range(stages)}
    expected |= {f"dec.resblocks.{b}.convs.{j}" for b in range(blocks) for j in range(2)}
    if not stages or blocks % stages or set(convolutions) != expected or ops["Div"] != stages:
        raise NotPiperGenerator("the vocoder graph does not keep a Piper generator's layers")
    if len(slopes) < 2:
        raise NotPiperGenerator("the vocoder graph has no leaky ReLUs")
    kernels = blocks // stages
    # A stage's resblock sum is divided by their count before the next leaky ReLU: that
    # division goes into the next convolution's weights.
    divided = {f"dec.ups.{i}" for i in range(1, stages)} | {"dec.conv_post"}
    layers = {
        name: _layer(node, arrays, 1.0 / kernels if name in divided else 1.0, device, dtype, rows)
        for name, node in convolutions.items()
    }
    return VocoderCore(layers, slopes[0], slopes[-1], stages, kernels, rows)


def _layer(
    node: onnx.NodeProto,
    arrays: dict[str, np.ndarray],
    scale: float,
    device: torch.device | str,
    dtype: torch.dtype,
    rows: bool,
) -> _Layer:
    attributes = _Node(node).attrs
    if attributes.get("group", 1) != 1 or any(attributes.get("output_padding", [0])):
        raise NotPiperGenerator(f"{node.name}: a grouped or output-padded convolution")
    weight = torch.from_numpy(np.array(arrays[node.input[1]], dtype=np.float32)) * scale
    if rows:
        weight = weight.unsqueeze(2).contiguous(memory_format=torch.channels_last)
    bias = arrays.get(node.input[2]) if len(node.input) > 2 else None
    return _Layer(
        weight=weight.to(device, dtype),
        bias=None if bias is None else torch.from_numpy(np.array(bias)).to(device, dtype),
        stride=_one(attributes.get("strides", [1]), "strides", node),
        padding=_one(attributes.get("pads", [0, 0]), "pads", node),
        dilation=_one(attributes.get("dilations", [1]), "dilations", node),
        transposed=node.op_type == "ConvTranspose",
    )


def check(
    core: VocoderCore, reference: Callable[..., Sequence[Tensor]], device: torch.device
) -> float:
    """The relative error of `core` against `reference` (called as ``reference(latent=...)``,
    the node-by-node port) on a fixed latent; `NotPiperGenerator` above CHECK_TOLERANCE."""
    dtype = core.pre.weight.dtype
    generator = torch.Generator().manual_seed(0)
    latent = (torch.randn(2, 192, 32, generator=generator) * 0.8).to(device, dtype)
    with torch.no_grad():
        expected = reference(latent=latent)[0].float()
        got = core(latent).float()
    error = float(
        (got.reshape(expected.shape) - expected).norm() / expected.norm().clamp_min(1e-12)
    )
    if not error <= CHECK_TOLERANCE:
        raise NotPiperGenerator(
            f"VocoderCore's audio is {error:.3g} off the graph's (relative error), over "
            f"{CHECK_TOLERANCE}"
        )
    return error
