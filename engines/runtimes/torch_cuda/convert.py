"""Run a stage's ONNX graph with PyTorch: weights from the initializers, one torch op per node.

This is a small ONNX interpreter for the operators the Piper VITS stages use (`SUPPORTED`),
not a general converter. It keeps the graph's own arithmetic, so it is checked against
onnxruntime on the same inputs (tests/gpu/test_torch_port.py) rather than trusted.

Shape arithmetic (``Shape``, and everything computed only from shapes and integer
constants) stays on the CPU as small int64 tensors, so the flow and the vocoder run without
a single device-to-host read or host-to-device copy: a requirement for capturing them into
CUDA graphs. `OnnxModule.transfers` counts the values that had to move (it must stay 0 for
those two stages; the encoder, whose output length depends on the predicted durations,
needs a few reads and runs eagerly).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper
from torch import Tensor

# ONNX TensorProto data types -> torch dtypes ("float" ones follow the module's precision).
_ONNX_DTYPES: dict[int, torch.dtype] = {
    onnx.TensorProto.FLOAT: torch.float32,
    onnx.TensorProto.FLOAT16: torch.float16,
    onnx.TensorProto.DOUBLE: torch.float64,
    onnx.TensorProto.INT64: torch.int64,
    onnx.TensorProto.INT32: torch.int32,
    onnx.TensorProto.INT8: torch.int8,
    onnx.TensorProto.UINT8: torch.uint8,
    onnx.TensorProto.BOOL: torch.bool,
}


class UnsupportedGraphError(ValueError):
    """The graph uses an operator or attribute the torch port does not implement."""


def _ints(value: Tensor) -> list[int]:
    return [int(v) for v in value.reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


class _Node:
    __slots__ = ("attrs", "inputs", "name", "op", "outputs")

    def __init__(self, node: onnx.NodeProto) -> None:
        self.op = node.op_type
        self.name = node.name
        self.inputs = list(node.input)
        self.outputs = list(node.output)
        self.attrs: dict[str, Any] = {}
        for attribute in node.attribute:
            value = helper.get_attribute_value(attribute)
            if isinstance(value, onnx.TensorProto):
                value = numpy_helper.to_array(value)
            elif isinstance(value, bytes):
                value = value.decode()
            self.attrs[attribute.name] = value


# A GPU module in FP16 runs its 1-D convolutions as channels-last 2-D ones: cuDNN's tensor-core
# kernels work in channels-last, and a 1-D convolution in the default layout paid two layout
# transposes per call, 31 % of the vocoder's device time on the H100; without them a window
# costs 0.84 to 0.90 us per frame against 1.23 to 1.32 (a probe of 2026-11-24,
# docs/history.md).
# Prefix of a convolution weight's channels-last form among a module's weight tensors.
ROWS_PREFIX = "rows:"


class OnnxModule:
    """One ONNX graph run with torch ops; ``module(**inputs)`` returns the graph's outputs."""

    def __init__(
        self,
        model: onnx.ModelProto | Path | str,
        device: torch.device | str = "cpu",
        float_dtype: torch.dtype = torch.float32,
    ) -> None:
        if not isinstance(model, onnx.ModelProto):
            model = onnx.load(str(model))
        check_supported(model)
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            # "cuda" != "cuda:0" when devices are compared; results carry the index.
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.float_dtype = float_dtype
        self.input_names = [value.name for value in model.graph.input]
        self.output_names = [value.name for value in model.graph.output]
        self.nodes = [_Node(node) for node in model.graph.node]
        # The values each node is the last to read: dropped once it has run, so that a call's
        # memory is its live activations, not every intermediate of the graph (the vocoder's
        # at 128 windows: several GB, which a captured graph's pool would keep).
        self._last_reads = _last_reads(self.nodes, set(self.output_names))
        # Values moved between host and device while running: 0 means capturable.
        self.transfers = 0
        self.generator: torch.Generator | None = None
        # Small integer constants feed shape arithmetic and stay on the host.
        self.host_constants: dict[str, Tensor] = {}
        self.device_constants: dict[str, Tensor] = {}
        for initializer in model.graph.initializer:
            array = numpy_helper.to_array(initializer)
            tensor = torch.from_numpy(np.array(array, copy=True))
            if tensor.is_floating_point():
                self.device_constants[initializer.name] = tensor.to(self.device, float_dtype)
            else:
                self.host_constants[initializer.name] = tensor
        # Host values the device needs, by content: the same shapes give the same index
        # tensors call after call, and a pageable host-to-device copy waits for the GPU.
        self._uploads: dict[tuple[str, torch.dtype, tuple[int, ...], bytes], Tensor] = {}
        self.channels_last = self.device.type == "cuda" and float_dtype == torch.float16
        # Convolution weights as channels-last 2-D ones, made once (a graph replays no copy).
        self._channels_last_weights: dict[str, Tensor] = {}

    def _upload(self, name: str, value: Tensor) -> Tensor:
        if value.device == self.device:
            return value
        if value.numel() > 65536:
            self.transfers += 1
            return value.to(self.device)
        key = (name, value.dtype, tuple(value.shape), value.numpy().tobytes())
        cached = self._uploads.get(key)
        if cached is None:
            self.transfers += 1
            if len(self._uploads) >= 4096:
                self._uploads.clear()
            cached = self._uploads[key] = value.to(self.device)
        return cached

    def parameter_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.weight_tensors().values())

    def _prepare_weights(self) -> None:
        """The channels-last forms of the 1-D convolution weights, made now rather than at
        their first call (`_rows_weight`), so that `weight_tensors` is complete before any."""
        if not self.channels_last:
            return
        for node in self.nodes:
            if node.op not in ("Conv", "ConvTranspose") or len(node.inputs) < 2:
                continue
            name = node.inputs[1]
            weight = self.device_constants.get(name)
            if weight is not None and weight.dim() == 3 and name not in self._channels_last_weights:
                self._channels_last_weights[name] = _as_rows(weight)

    def weight_tensors(self) -> dict[str, Tensor]:
        """Every float tensor the graph reads, by name: a convolution weight run on
        channels-last rows in that form only (`ROWS_PREFIX`), the rest as initialized."""
        self._prepare_weights()
        tensors = {f"{ROWS_PREFIX}{n}": t for n, t in self._channels_last_weights.items()}
        tensors.update(
            (n, t) for n, t in self.device_constants.items() if n not in self._channels_last_weights
        )
        return tensors

    def use_weights(self, tensors: Mapping[str, Tensor]) -> None:
        """Read the weights from `tensors` (as `weight_tensors` names them) from now on: views
        of a bound buffer (engines/runtimes/torch_cuda/weights.py). A convolution weight's plain
        form becomes a view of its channels-last one, so that only that one takes memory."""
        for key, tensor in tensors.items():
            if key.startswith(ROWS_PREFIX):
                name = key[len(ROWS_PREFIX) :]
                self._channels_last_weights[name] = tensor
                self.device_constants[name] = tensor.squeeze(2)
            else:
                self.device_constants[key] = tensor

    def structure(self) -> str:
        """A digest of the graph without its float weights: nodes, attributes, integer
        constants, inputs, outputs and precision. Two voices with the same structure can run
        on one module, each with its own weights."""
        digest = hashlib.sha256(str(self.float_dtype).encode())
        for names in (self.input_names, self.output_names):
            digest.update(repr(names).encode())
        for node in self.nodes:
            attrs = sorted((k, repr(v)) for k, v in node.attrs.items())
            digest.update(repr((node.op, node.inputs, node.outputs, attrs)).encode())
        for name in sorted(self.host_constants):
            digest.update(name.encode())
            digest.update(self.host_constants[name].numpy().tobytes())
        return digest.hexdigest()

    def __call__(self, **inputs: Tensor) -> list[Tensor]:
        return self.forward(**inputs)

    @torch.no_grad()
    def forward(self, **inputs: Tensor) -> list[Tensor]:
        values: dict[str, Tensor] = dict(self.host_constants)
        host: set[str] = set(self.host_constants)
        values.update(self.device_constants)
        for name in self.input_names:
            if name not in inputs:
                raise ValueError(f"missing graph input {name!r}; inputs are {self.input_names}")
            tensor = inputs[name]
            if tensor.is_floating_point():
                tensor = tensor.to(self.float_dtype)
            values[name] = tensor
        for index, node in enumerate(self.nodes):
            present = [name for name in node.inputs if name]
            if node.op in _HOST_ARGUMENT_OPS:
                # Data stays where it is; shape/axis arguments are read as Python ints.
                on_host = bool(present) and present[0] in host
                reads = [name for name in present[1:] if name not in host]
                if node.op == "Gather" and not on_host:
                    reads = []  # device data indexed by device indices: no read
                self.transfers += len(reads)
                args = [values[name] if name else None for name in node.inputs]
            else:
                on_host = all(name in host for name in present)
                args = []
                for name in node.inputs:
                    if not name:
                        args.append(None)
                    elif not on_host and name in host:
                        args.append(self._upload(name, values[name]))
                    else:
                        args.append(values[name])
            results = _OPS[node.op](self, node, args)
            if node.op == "Shape":
                on_host = True
            elif node.op == "Range":
                on_host = all(name in host for name in present)
            elif node.op == "ConstantOfShape":
                on_host = not results[0].is_floating_point()
            if not on_host and any(r.device != self.device for r in results):
                # e.g. a Range whose start is a host constant but whose limit is data
                self.transfers += 1
                results = [r.to(self.device) for r in results]
            for name, result in zip(node.outputs, results, strict=False):
                values[name] = result
                if on_host:
                    host.add(name)
            for name in self._last_reads[index]:
                values.pop(name, None)
        return [values[name] for name in self.output_names]


def _last_reads(nodes: Sequence[_Node], outputs: set[str]) -> list[list[str]]:
    """For each node, the values no later node reads (the graph's outputs excepted)."""
    last: dict[str, int] = {}
    for index, node in enumerate(nodes):
        for name in node.inputs:
            if name:
                last[name] = index
    reads: list[list[str]] = [[] for _ in nodes]
    for name, index in last.items():
        if name not in outputs:
            reads[index].append(name)
    return reads


# Operators whose non-data arguments are shapes or axes: those stay on the host even when
# the data is on the device (they are read with `_ints`, never computed with).
_HOST_ARGUMENT_OPS = {
    "Gather",
    "Reshape",
    "Expand",
    "Slice",
    "Unsqueeze",
    "Squeeze",
    "Split",
    "Pad",
    "ReduceSum",
    "CumSum",
    "ConstantOfShape",
    "Shape",
    "Range",
}

Op = Callable[[OnnxModule, _Node, list[Any]], Sequence[Tensor]]
_OPS: dict[str, Op] = {}


def _op(*names: str) -> Callable[[Op], Op]:
    def register(function: Op) -> Op:
        for name in names:
            _OPS[name] = function
        return function

    return register


def _binary(function: Callable[[Tensor, Tensor], Tensor]) -> Op:
    def run(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
        return [function(args[0], args[1])]

    return run


def _unary(function: Callable[[Tensor], Tensor]) -> Op:
    def run(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
        return [function(args[0])]

    return run


def _div(a: Tensor, b: Tensor) -> Tensor:
    if a.is_floating_point() or b.is_floating_point():
        return a / b
    return torch.div(a, b, rounding_mode="trunc")


_BINARY: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "Add": torch.add,
    "Sub": torch.sub,
    "Mul": torch.mul,
    "Div": _div,
    "Pow": torch.pow,
    "MatMul": torch.matmul,
    "Equal": torch.eq,
    "Less": torch.lt,
    "LessOrEqual": torch.le,
    "GreaterOrEqual": torch.ge,
    "And": torch.logical_and,
}
for _name, _function in _BINARY.items():
    _OPS[_name] = _binary(_function)

for _name, _unary_function in {
    "Neg": torch.neg,
    "Exp": torch.exp,
    "Sqrt": torch.sqrt,
    "Erf": torch.erf,
    "Relu": torch.relu,
    "Tanh": torch.tanh,
    "Sigmoid": torch.sigmoid,
    "Ceil": torch.ceil,
    "Not": torch.logical_not,
    "Softplus": F.softplus,
}.items():
    _OPS[_name] = _unary(_unary_function)


@_op("LeakyRelu")
def _leaky_relu(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    return [F.leaky_relu(args[0], float(node.attrs.get("alpha", 0.01)))]


@_op("Shape")
def _shape(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    shape = torch.tensor(list(args[0].shape), dtype=torch.int64)
    start, end = node.attrs.get("start", 0), node.attrs.get("end")
    return [shape[start:end]]


@_op("Cast")
def _cast(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    dtype = _ONNX_DTYPES[int(node.attrs["to"])]
    if dtype.is_floating_point and args[0].device == module.device:
        # Device floats follow the module's precision; host (shape) floats stay exact.
        dtype = module.float_dtype
    return [args[0].to(dtype)]


@_op("Gather")
def _gather(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, indices = args
    axis = _axis(int(node.attrs.get("axis", 0)), data.dim())
    if indices.dim() == 0 and indices.device.type == "cpu":
        return [data.select(axis, int(indices))]  # a Python index: no copy to the device
    if data.device.type == "cpu" and indices.device.type != "cpu":
        indices = indices.cpu()
    elif indices.device != data.device:
        indices = module._upload(node.inputs[1], indices)
    indices = torch.where(indices < 0, indices + data.shape[axis], indices)
    picked = data.index_select(axis, indices.reshape(-1))
    shape = (*data.shape[:axis], *indices.shape, *data.shape[axis + 1 :])
    return [picked.reshape(shape)]


@_op("GatherElements")
def _gather_elements(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, indices = args
    axis = _axis(int(node.attrs.get("axis", 0)), data.dim())
    indices = torch.where(indices < 0, indices + data.shape[axis], indices)
    return [torch.gather(data, axis, indices)]


@_op("GatherND")
def _gather_nd(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, indices = args
    if int(node.attrs.get("batch_dims", 0)) != 0:
        raise UnsupportedGraphError(f"{node.name}: GatherND with batch_dims is not supported")
    depth = indices.shape[-1]
    return [data[tuple(indices[..., i] for i in range(depth))]]


@_op("ScatterND")
def _scatter_nd(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, indices, updates = args
    if node.attrs.get("reduction", "none") != "none":
        raise UnsupportedGraphError(f"{node.name}: ScatterND with reduction is not supported")
    out = data.clone()
    depth = indices.shape[-1]
    out[tuple(indices[..., i] for i in range(depth))] = updates.to(out.dtype)
    return [out]


@_op("NonZero")
def _non_zero(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    return [torch.nonzero(args[0]).transpose(0, 1).contiguous()]


@_op("Where")
def _where(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    condition, a, b = args
    if a.dtype != b.dtype:
        b = b.to(a.dtype)
    return [torch.where(condition, a, b)]


@_op("Transpose")
def _transpose(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    perm = node.attrs.get("perm") or list(reversed(range(args[0].dim())))
    return [args[0].permute(*perm)]


@_op("Unsqueeze")
def _unsqueeze(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data = args[0]
    axes = _ints(args[1]) if len(args) > 1 and args[1] is not None else node.attrs["axes"]
    rank = data.dim() + len(axes)
    for axis in sorted(_axis(a, rank) for a in axes):
        data = data.unsqueeze(axis)
    return [data]


@_op("Squeeze")
def _squeeze(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data = args[0]
    if len(args) > 1 and args[1] is not None:
        axes = _ints(args[1])
    else:
        axes = node.attrs.get("axes") or [i for i, n in enumerate(data.shape) if n == 1]
    for axis in sorted((_axis(a, data.dim()) for a in axes), reverse=True):
        data = data.squeeze(axis)
    return [data]


@_op("Concat")
def _concat(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    tensors = [a for a in args if a is not None]
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        tensors = [t.to(module.device) for t in tensors]
    return [torch.cat(tensors, dim=int(node.attrs["axis"]))]


@_op("Reshape")
def _reshape(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, shape = args[0], _ints(args[1])
    if not node.attrs.get("allowzero", 0):
        shape = [data.shape[i] if n == 0 else n for i, n in enumerate(shape)]
    return [data.reshape(shape)]


@_op("Expand")
def _expand(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, shape = args[0], _ints(args[1])
    return [data.expand(torch.broadcast_shapes(tuple(data.shape), tuple(shape)))]


@_op("ConstantOfShape")
def _constant_of_shape(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    shape = _ints(args[0])
    value = node.attrs.get("value")
    array = np.zeros(1, dtype=np.float32) if value is None else np.asarray(value).reshape(-1)
    fill = torch.from_numpy(array.copy())
    if fill.is_floating_point():
        return [torch.full(shape, float(array[0]), dtype=module.float_dtype, device=module.device)]
    return [torch.full(shape, int(array[0]), dtype=fill.dtype)]


@_op("Range")
def _range(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    start, limit, delta = args
    device = start.device
    if start.is_floating_point():
        return [
            torch.arange(float(start), float(limit), float(delta), dtype=start.dtype, device=device)
        ]
    return [torch.arange(int(start), int(limit), int(delta), dtype=start.dtype, device=device)]


@_op("Slice")
def _slice(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data = args[0]
    starts, ends = _ints(args[1]), _ints(args[2])
    axes = _ints(args[3]) if len(args) > 3 and args[3] is not None else list(range(len(starts)))
    steps = _ints(args[4]) if len(args) > 4 and args[4] is not None else [1] * len(starts)
    index: list[slice] = [slice(None)] * data.dim()
    flip_axes: list[int] = []
    for start, end, axis, step in zip(starts, ends, axes, steps, strict=True):
        axis = _axis(axis, data.dim())
        size = data.shape[axis]
        if step > 0:
            start = max(0, min(size, start + size if start < 0 else start))
            end = max(0, min(size, end + size if end < 0 else end))
            index[axis] = slice(start, end, step)
        else:
            # Walk the flipped axis forwards: no index tensor, so no host-to-device copy.
            start = max(0, min(size - 1, start + size if start < 0 else start))
            end = max(-1, min(size - 1, end + size if end < 0 else end))
            flip_axes.append(axis)
            index[axis] = slice(size - 1 - start, size - 1 - end, -step)
    if flip_axes:
        data = data.flip(flip_axes)
    return [data[tuple(index)]]


@_op("Split")
def _split(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data = args[0]
    axis = _axis(int(node.attrs.get("axis", 0)), data.dim())
    if len(args) > 1 and args[1] is not None:
        sizes = _ints(args[1])
    elif "split" in node.attrs:
        sizes = list(node.attrs["split"])
    else:
        parts = len(node.outputs)
        sizes = [data.shape[axis] // parts] * parts
    return list(torch.split(data, sizes, dim=axis))


@_op("Pad")
def _pad(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, pads = args[0], _ints(args[1])
    mode = node.attrs.get("mode", "constant")
    if mode != "constant":
        raise UnsupportedGraphError(f"{node.name}: Pad mode {mode!r} is not supported")
    value = float(args[2].reshape(-1)[0]) if len(args) > 2 and args[2] is not None else 0.0
    rank = data.dim()
    torch_pads: list[int] = []
    for axis in reversed(range(rank)):
        torch_pads += [pads[axis], pads[axis + rank]]
    return [F.pad(data, torch_pads, value=value)]


def _reduce_axes(node: _Node, args: list[Any], data: Tensor) -> list[int] | None:
    if len(args) > 1 and args[1] is not None:
        axes = _ints(args[1])
    else:
        axes = list(node.attrs.get("axes", []))
    if not axes:
        return None if not node.attrs.get("noop_with_empty_axes", 0) else []
    return [_axis(a, data.dim()) for a in axes]


def _reducer(function: Callable[[Tensor, list[int], bool], Tensor]) -> Op:
    def run(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
        data = args[0]
        axes = _reduce_axes(node, args, data)
        keep = bool(node.attrs.get("keepdims", 1))
        if axes == []:
            return [data]
        return [function(data, axes if axes is not None else list(range(data.dim())), keep)]

    return run


def _amax(data: Tensor, axes: list[int], keep: bool) -> Tensor:
    return torch.amax(data, dim=axes, keepdim=keep)


_OPS["ReduceSum"] = _reducer(lambda d, axes, keep: torch.sum(d, dim=axes, keepdim=keep))
_OPS["ReduceMean"] = _reducer(lambda d, axes, keep: torch.mean(d, dim=axes, keepdim=keep))
_OPS["ReduceMax"] = _reducer(_amax)


@_op("Softmax")
def _softmax(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    return [torch.softmax(args[0], dim=int(node.attrs.get("axis", -1)))]


@_op("CumSum")
def _cumsum(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, axis = args[0], _ints(args[1])[0]
    if node.attrs.get("reverse", 0):
        data = data.flip(axis)
    out = torch.cumsum(data, dim=axis).to(data.dtype)
    if node.attrs.get("exclusive", 0):
        out = out - data
    if node.attrs.get("reverse", 0):
        out = out.flip(axis)
    return [out]


@_op("Clip")
def _clip(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data = args[0]
    low = args[1] if len(args) > 1 else None
    high = args[2] if len(args) > 2 else None
    return [torch.clamp(data, min=low, max=high)]


@_op("RandomNormalLike")
def _random_normal_like(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    like = args[0]
    dtype = module.float_dtype if "dtype" in node.attrs else like.dtype
    noise = torch.randn(like.shape, dtype=dtype, device=like.device, generator=module.generator)
    scale, mean = float(node.attrs.get("scale", 1.0)), float(node.attrs.get("mean", 0.0))
    return [noise * scale + mean]


def _conv_padding(node: _Node, spatial: int) -> tuple[list[int], list[int]]:
    if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", ""):
        raise UnsupportedGraphError(f"{node.name}: auto_pad is not supported")
    pads = list(node.attrs.get("pads", [0] * (2 * spatial)))
    return pads[:spatial], pads[spatial:]


_CONV = {1: F.conv1d, 2: F.conv2d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d}


def _as_rows(data: Tensor) -> Tensor:
    """[N, C, T] as a channels-last [N, C, 1, T] (no copy where it is laid out so already: the
    output of the convolution before)."""
    return data.unsqueeze(2).contiguous(memory_format=torch.channels_last)


def _rows_weight(module: OnnxModule, name: str, weight: Tensor) -> Tensor:
    """A 1-D convolution's weight as a channels-last 2-D one, kept where it is a constant."""
    if name not in module.device_constants:
        return _as_rows(weight)
    cached = module._channels_last_weights.get(name)
    if cached is None:
        cached = module._channels_last_weights[name] = _as_rows(weight)
    return cached


# A 1-D argument on channels-last rows [N, C, 1, T] leads with this for the added axis.
_ROWS_LEAD = {"stride": 1, "dilation": 1, "padding": 0, "output_padding": 0}


def _on_rows(
    module: OnnxModule,
    node: _Node,
    function: Callable[..., Tensor],
    args: tuple[Tensor, Tensor, Tensor | None],
    groups: int,
    axes: dict[str, list[int]],
) -> Tensor:
    """A 1-D convolution (`function`: F.conv2d or F.conv_transpose2d) run over channels-last
    rows, back as [N, C, T] (laid out channels-last, which the next convolution takes as is);
    `axes` are its per-axis arguments (stride, padding, ...)."""
    data, weight, bias = args
    rows = {name: (_ROWS_LEAD[name], values[0]) for name, values in axes.items()}
    weight = _rows_weight(module, node.inputs[1], weight)
    return function(_as_rows(data), weight, bias, groups=groups, **rows).squeeze(2)


@_op("Conv")
def _conv(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    spatial = data.dim() - 2
    begin, end = _conv_padding(node, spatial)
    if begin != end:
        torch_pads: list[int] = []
        for axis in reversed(range(spatial)):
            torch_pads += [begin[axis], end[axis]]
        data, begin = F.pad(data, torch_pads), [0] * spatial
    axes = {
        "stride": list(node.attrs.get("strides", [1] * spatial)),
        "padding": begin,
        "dilation": list(node.attrs.get("dilations", [1] * spatial)),
    }
    groups = int(node.attrs.get("group", 1))
    if spatial == 1 and module.channels_last:
        return [_on_rows(module, node, F.conv2d, (data, weight, bias), groups, axes)]
    return [_CONV[spatial](data, weight, bias, groups=groups, **axes)]


@_op("ConvTranspose")
def _conv_transpose(module: OnnxModule, node: _Node, args: list[Any]) -> Sequence[Tensor]:
    data, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    spatial = data.dim() - 2
    if "output_shape" in node.attrs:
        raise UnsupportedGraphError(f"{node.name}: ConvTranspose output_shape is not supported")
    begin, end = _conv_padding(node, spatial)
    symmetric = begin == end
    axes = {
        "stride": list(node.attrs.get("strides", [1] * spatial)),
        "padding": begin if symmetric else [0] * spatial,
        "output_padding": list(node.attrs.get("output_padding", [0] * spatial)),
        "dilation": list(node.attrs.get("dilations", [1] * spatial)),
    }
    groups = int(node.attrs.get("group", 1))
    if spatial == 1 and module.channels_last:
        out = _on_rows(module, node, F.conv_transpose2d, (data, weight, bias), groups, axes)
    else:
        out = _CONV_T[spatial](data, weight, bias, groups=groups, **axes)
    if symmetric:
        return [out]
    index = [slice(None), slice(None)] + [
        slice(begin[axis], out.shape[axis + 2] - end[axis]) for axis in range(spatial)
    ]
    return [out[tuple(index)]]


SUPPORTED = frozenset(_OPS)


def check_supported(model: onnx.ModelProto | Path | str) -> None:
    """Raise `UnsupportedGraphError` naming every operator of `model` the port lacks."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model), load_external_data=False)
    missing = sorted({node.op_type for node in model.graph.node} - SUPPORTED)
    if missing:
        raise UnsupportedGraphError(
            f"graph {model.graph.name or '?'} uses operators the torch-cuda runtime does not "
            f"implement: {', '.join(missing)}"
        )
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version < 13:
            raise UnsupportedGraphError(
                f"graph {model.graph.name or '?'} uses ONNX opset {opset.version}; the "
                "torch-cuda runtime reads opset 13 or newer (re-export the voice)"
            )
