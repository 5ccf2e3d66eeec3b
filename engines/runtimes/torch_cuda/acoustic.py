"""The Piper VITS encoder stage written as PyTorch modules, for CUDA-graph replay.

The ONNX encoder (text encoder + stochastic duration predictor + length regulator) has about
2,400 nodes, a dozen of them data-dependent (``NonZero`` in the spline's inside/outside
masks, the output length from the durations). Run node by node it costs ~50 ms of launches
per call whatever the batch. Here the same arithmetic is split in two:

- `EncoderCore` (fixed shapes for a given batch and phoneme count, so it is captured into a
  CUDA graph): text encoder with relative-position attention, the duration predictor's
  reverse flows with the rational-quadratic spline evaluated densely (every element
  computed, outside-interval ones replaced by the identity, exactly as the masked original);
- `expand` (eager, ~20 kernels and one device read for the output length): durations,
  alignment path, prior frames and their noise.

Weights are the ONNX initializers, found by the names the standard Piper export keeps
(`enc_p.*`, `dp.*`); `from_onnx` refuses graphs that lack them (the runtime then falls back
to the node-by-node port). Checked against onnxruntime and the node-by-node port in
tests/gpu/test_torch_port.py.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper
from torch import Tensor

TAIL_BOUND = 5.0
NUM_BINS = 10
MIN_BIN = 1e-3
MIN_DERIVATIVE = 1e-3


class NotPiperVits(ValueError):
    """The graph's initializers are not those of a single-speaker Piper VITS encoder."""


def _layer_norm(x: Tensor, gamma: Tensor, beta: Tensor) -> Tensor:
    # channels-first LayerNorm, as VITS applies it
    return F.layer_norm(x.transpose(1, -1), (x.shape[1],), gamma, beta, 1e-5).transpose(1, -1)


def _conv(x: Tensor, w: dict[str, Tensor], name: str, **kwargs: int) -> Tensor:
    return F.conv1d(x, w[f"{name}.weight"], w[f"{name}.bias"], **kwargs)


# The text encoder's precisions (`EncoderCore.text_dtype`): its weights stay FP32, and under
# "bf16" or "fp16" its convolutions and matrix products run at that precision (autocast); the
# duration predictor always runs in FP32, from the text encoder's output made FP32 again.
TEXT_PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


class EncoderCore(torch.nn.Module):
    """ids, lengths, duration noise -> m_p, logs_p, x_mask, logw (all fixed-shape)."""

    def __init__(
        self,
        weights: dict[str, Tensor],
        embedding: Tensor,
        exp_neg_logs: Tensor,
        banded: bool = True,
        text_precision: str = "fp32",
    ) -> None:
        super().__init__()
        if text_precision not in TEXT_PRECISIONS:
            raise ValueError(
                f"the text encoder runs {', '.join(TEXT_PRECISIONS)}, not {text_precision!r}"
            )
        self.text_precision = text_precision
        self.text_dtype = TEXT_PRECISIONS[text_precision]
        self.banded = banded
        self.w = weights
        self.embedding = embedding
        self.exp_neg_logs = exp_neg_logs  # ElementwiseAffine: exp(-logs), folded by the export
        self.hidden = embedding.shape[1]
        self.layers = 1 + max(
            int(m.group(1))
            for name in weights
            if (m := re.match(r"enc_p\.encoder\.attn_layers\.(\d+)\.", name))
        )
        rel = weights["enc_p.encoder.attn_layers.0.emb_rel_k"]
        self.window = (rel.shape[1] - 1) // 2
        self.k_channels = rel.shape[2]
        self.heads = self.hidden // self.k_channels
        self.flows = sorted(
            {
                int(m.group(1))
                for name in weights
                if (m := re.match(r"dp\.flows\.(\d+)\.pre\.", name))
            },
            reverse=True,
        )

    def weight_tensors(self) -> dict[str, Tensor]:
        """Every weight the core reads, by name (engines/runtimes/torch_cuda/weights.py packs
        them)."""
        return {
            **{f"w:{name}": tensor for name, tensor in self.w.items()},
            "embedding": self.embedding,
            "exp_neg_logs": self.exp_neg_logs,
        }

    def use_weights(self, tensors: dict[str, Tensor]) -> None:
        """Read the weights from `tensors` (named as `weight_tensors` names them) from now on."""
        self.w = {name[2:]: tensor for name, tensor in tensors.items() if name.startswith("w:")}
        self.embedding = tensors["embedding"]
        self.exp_neg_logs = tensors["exp_neg_logs"]

    # -- text encoder ------------------------------------------------------------------------
    def _relative_embeddings(self, table: Tensor, length: int) -> Tensor:
        pad = max(length - (self.window + 1), 0)
        start = max((self.window + 1) - length, 0)
        if pad > 0:
            table = F.pad(table, [0, 0, pad, pad, 0, 0])
        return table[:, start : start + 2 * length - 1]

    def _band(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x [B, H, L, L] padded by w columns on each side, and the window's diagonals as a
        [B, H, L, 2w + 1] view of that copy: band[..., i, w + d] is x[..., i, i + d], 0 where
        i + d is outside the sentence. Adding to the view adds to those diagonals of the
        copy; `padded[..., w : w + L]` is x with them."""
        window = self.window
        padded = F.pad(x, [window, window])
        batch, heads, length, width = padded.shape
        band = padded.as_strided(
            (batch, heads, length, 2 * window + 1),
            (heads * length * width, length * width, width + 1, 1),
        )
        return padded, band

    @staticmethod
    def _relative_to_absolute(x: Tensor) -> Tensor:
        batch, heads, length, _ = x.shape
        x = F.pad(x, [0, 1])
        flat = F.pad(x.reshape(batch, heads, length * 2 * length), [0, length - 1])
        return flat.reshape(batch, heads, length + 1, 2 * length - 1)[:, :, :length, length - 1 :]

    @staticmethod
    def _absolute_to_relative(x: Tensor) -> Tensor:
        batch, heads, length, _ = x.shape
        x = F.pad(x, [0, length - 1])
        flat = F.pad(x.reshape(batch, heads, length * length + length * (length - 1)), [length, 0])
        return flat.reshape(batch, heads, length, 2 * length)[:, :, :, 1:]

    def _attention(self, x: Tensor, attn_mask: Tensor, prefix: str) -> Tensor:
        w = self.w
        batch, channels, length = x.shape
        q = _conv(x, w, f"{prefix}.conv_q")
        k = _conv(x, w, f"{prefix}.conv_k")
        v = _conv(x, w, f"{prefix}.conv_v")
        shape = (batch, self.heads, self.k_channels, length)
        q = q.reshape(shape).transpose(2, 3) / math.sqrt(self.k_channels)
        k = k.reshape(shape).transpose(2, 3)
        v = v.reshape(shape).transpose(2, 3)
        scores = torch.matmul(q, k.transpose(-2, -1))
        if self.banded:
            # Only the 2w + 1 diagonals within the window have a relative embedding: compute
            # those and add them there, rather than over all 2L - 1 relative positions (zeros
            # outside the window), which costs O(L^2) memory passes per layer.
            padded, band = self._band(scores)
            band.add_(torch.matmul(q, w[f"{prefix}.emb_rel_k"].unsqueeze(0).transpose(-2, -1)))
            scores = padded[..., self.window : self.window + length]
        else:
            rel_k = self._relative_embeddings(w[f"{prefix}.emb_rel_k"], length)
            scores = scores + self._relative_to_absolute(
                torch.matmul(q, rel_k.unsqueeze(0).transpose(-2, -1))
            )
        scores = scores.masked_fill(attn_mask == 0, -1e4)
        p_attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(p_attn, v)
        if self.banded:
            _, band = self._band(p_attn)
            out = out + torch.matmul(band, w[f"{prefix}.emb_rel_v"].unsqueeze(0))
        else:
            rel_v = self._relative_embeddings(w[f"{prefix}.emb_rel_v"], length)
            out = out + torch.matmul(self._absolute_to_relative(p_attn), rel_v.unsqueeze(0))
        out = out.transpose(2, 3).reshape(batch, channels, length)
        return _conv(out, w, f"{prefix}.conv_o")

    def _ffn(self, x: Tensor, mask: Tensor, prefix: str) -> Tensor:
        y = torch.relu(_conv(x * mask, self.w, f"{prefix}.conv_1", padding=1))
        return _conv(y * mask, self.w, f"{prefix}.conv_2", padding=1) * mask

    def text_encoder(self, ids: Tensor, lengths: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        w = self.w
        x = F.embedding(ids, self.embedding) * math.sqrt(self.hidden)
        x = x.transpose(1, -1)
        positions = torch.arange(ids.shape[1], device=ids.device)
        mask = (positions[None, :] < lengths[:, None]).unsqueeze(1).to(x.dtype)
        attn_mask = mask.unsqueeze(2) * mask.unsqueeze(-1)
        x = x * mask
        for i in range(self.layers):
            prefix = "enc_p.encoder"
            y = self._attention(x, attn_mask, f"{prefix}.attn_layers.{i}")
            x = _layer_norm(
                x + y, w[f"{prefix}.norm_layers_1.{i}.gamma"], w[f"{prefix}.norm_layers_1.{i}.beta"]
            )
            y = self._ffn(x, mask, f"{prefix}.ffn_layers.{i}")
            x = _layer_norm(
                x + y, w[f"{prefix}.norm_layers_2.{i}.gamma"], w[f"{prefix}.norm_layers_2.{i}.beta"]
            )
        x = x * mask
        stats = _conv(x, w, "enc_p.proj") * mask
        m_p, logs_p = torch.split(stats, stats.shape[1] // 2, dim=1)
        return x, m_p, logs_p, mask

    # -- stochastic duration predictor (reverse) --------------------------------------------------
    def _dds_conv(self, x: Tensor, mask: Tensor, prefix: str) -> Tensor:
        w = self.w
        for i in range(3):
            dilation = 3**i
            y = F.conv1d(
                x * mask,
                w[f"{prefix}.convs_sep.{i}.weight"],
                w[f"{prefix}.convs_sep.{i}.bias"],
                dilation=dilation,
                padding=dilation,
                groups=x.shape[1],
            )
            y = F.gelu(
                _layer_norm(y, w[f"{prefix}.norms_1.{i}.gamma"], w[f"{prefix}.norms_1.{i}.beta"])
            )
            y = _conv(y, w, f"{prefix}.convs_1x1.{i}")
            y = F.gelu(
                _layer_norm(y, w[f"{prefix}.norms_2.{i}.gamma"], w[f"{prefix}.norms_2.{i}.beta"])
            )
            x = x + y
        return x * mask

    def _conv_flow(self, z: Tensor, mask: Tensor, g: Tensor, index: int) -> Tensor:
        prefix = f"dp.flows.{index}"
        x0, x1 = z[:, :1], z[:, 1:]
        h = _conv(x0, self.w, f"{prefix}.pre")
        h = self._dds_conv(h + g, mask, f"{prefix}.convs")
        h = _conv(h, self.w, f"{prefix}.proj") * mask
        batch, _, length = x0.shape
        h = h.reshape(batch, 1, -1, length).permute(0, 1, 3, 2)
        scale = math.sqrt(self.hidden)  # filter_channels of the flow
        widths = h[..., :NUM_BINS] / scale
        heights = h[..., NUM_BINS : 2 * NUM_BINS] / scale
        derivatives = h[..., 2 * NUM_BINS :]
        x1 = _inverse_spline(x1, widths, heights, derivatives)
        return torch.cat([x0, x1], 1) * mask

    def duration_predictor(self, x: Tensor, mask: Tensor, noise: Tensor) -> Tensor:
        h = _conv(x, self.w, "dp.pre")
        h = self._dds_conv(h, mask, "dp.convs")
        g = _conv(h, self.w, "dp.proj") * mask
        z = noise
        for index in self.flows:
            z = torch.flip(z, [1])
            z = self._conv_flow(z, mask, g, index)
        z = torch.flip(z, [1])
        z = (z - self.w["dp.flows.0.m"]) * self.exp_neg_logs * mask
        return z[:, :1]

    def forward(self, ids: Tensor, lengths: Tensor, noise: Tensor) -> tuple[Tensor, ...]:
        if self.text_dtype is None:
            x, m_p, logs_p, mask = self.text_encoder(ids, lengths)
        else:
            # No cache of cast weights: a captured graph casts the bound weights at each
            # replay, so that it speaks whichever voice is bound.
            with torch.autocast(ids.device.type, dtype=self.text_dtype, cache_enabled=False):
                x, m_p, logs_p, mask = self.text_encoder(ids, lengths)
            x, m_p, logs_p, mask = (t.float() for t in (x, m_p, logs_p, mask))
        logw = self.duration_predictor(x, mask, noise)
        return m_p, logs_p, mask, logw


def _inverse_spline(inputs: Tensor, widths: Tensor, heights: Tensor, derivs: Tensor) -> Tensor:
    """Inverse rational-quadratic spline with linear tails, evaluated for every element."""
    inside = (inputs >= -TAIL_BOUND) & (inputs <= TAIL_BOUND)
    x = inputs.clamp(-TAIL_BOUND, TAIL_BOUND)
    constant = math.log(math.exp(1 - MIN_DERIVATIVE) - 1)
    derivs = F.pad(derivs, (1, 1), value=constant)
    left, right, bottom, top = -TAIL_BOUND, TAIL_BOUND, -TAIL_BOUND, TAIL_BOUND

    widths = torch.softmax(widths, dim=-1)
    widths = MIN_BIN + (1 - MIN_BIN * NUM_BINS) * widths
    cumwidths = F.pad(torch.cumsum(widths, dim=-1), (1, 0))
    cumwidths = (right - left) * cumwidths + left
    cumwidths = torch.cat(
        [
            torch.full_like(cumwidths[..., :1], left),
            cumwidths[..., 1:-1],
            torch.full_like(cumwidths[..., :1], right),
        ],
        dim=-1,
    )
    widths = cumwidths[..., 1:] - cumwidths[..., :-1]
    derivatives = MIN_DERIVATIVE + F.softplus(derivs)

    heights = torch.softmax(heights, dim=-1)
    heights = MIN_BIN + (1 - MIN_BIN * NUM_BINS) * heights
    cumheights = F.pad(torch.cumsum(heights, dim=-1), (1, 0))
    cumheights = (top - bottom) * cumheights + bottom
    cumheights = torch.cat(
        [
            torch.full_like(cumheights[..., :1], bottom),
            cumheights[..., 1:-1],
            torch.full_like(cumheights[..., :1], top),
        ],
        dim=-1,
    )
    heights = cumheights[..., 1:] - cumheights[..., :-1]

    locations = torch.cat([cumheights[..., :-1], cumheights[..., -1:] + 1e-6], dim=-1)
    bin_idx = (torch.sum(x[..., None] >= locations, dim=-1) - 1).clamp(0, NUM_BINS - 1)[..., None]

    def pick(values: Tensor) -> Tensor:
        return values.gather(-1, bin_idx)[..., 0]

    input_cumwidths, input_bin_widths = pick(cumwidths), pick(widths)
    input_cumheights, input_heights = pick(cumheights), pick(heights)
    delta = heights / widths
    input_delta = pick(delta)
    input_derivatives = pick(derivatives)
    input_derivatives_plus_one = pick(derivatives[..., 1:])

    shifted = x - input_cumheights
    slope_sum = input_derivatives + input_derivatives_plus_one - 2 * input_delta
    a = shifted * slope_sum + input_heights * (input_delta - input_derivatives)
    b = input_heights * input_derivatives - shifted * slope_sum
    c = -input_delta * shifted
    discriminant = b.pow(2) - 4 * a * c
    root = (2 * c) / (-b - torch.sqrt(discriminant))
    outputs = root * input_bin_widths + input_cumwidths
    return torch.where(inside, outputs, inputs)


def durations(logw: Tensor, x_mask: Tensor, length_scale: float) -> tuple[Tensor, Tensor]:
    """Frames per phoneme (``ceil``ed) and per sentence, on the device: (w_ceil [B, 1, P],
    y_lengths [B])."""
    w_ceil = torch.ceil(torch.exp(logw) * x_mask * length_scale)
    return w_ceil, torch.clamp_min(torch.sum(w_ceil, [1, 2]), 1).long()


def expand_frames(
    m_p: Tensor,
    logs_p: Tensor,
    x_mask: Tensor,
    w_ceil: Tensor,
    y_lengths: Tensor,
    frames: int,
    noise_scale: float,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Phonemes -> `frames` prior frames (the longest sentence's, read from `y_lengths`
    beforehand): no device read, so it can be queued behind an encoder call still running."""
    t = torch.arange(frames, device=m_p.device)
    y_mask = (t[None, :] < y_lengths[:, None]).to(m_p.dtype)  # [B, T]
    cum = torch.cumsum(w_ceil[:, 0], dim=-1)  # [B, P]
    path = (t[None, :, None] < cum[:, None, :]).to(m_p.dtype)  # [B, T, P]
    path = path - F.pad(path, (1, 0))[:, :, :-1]
    path = path * x_mask[:, :, :] * y_mask[:, :, None]
    m = torch.matmul(path, m_p.transpose(1, 2)).transpose(1, 2)
    logs = torch.matmul(path, logs_p.transpose(1, 2)).transpose(1, 2)
    noise = torch.randn(m.shape, device=m.device, dtype=m.dtype, generator=generator)
    prior = m + noise * torch.exp(logs) * noise_scale
    return prior, y_mask.unsqueeze(1)


def expand(
    m_p: Tensor,
    logs_p: Tensor,
    x_mask: Tensor,
    logw: Tensor,
    length_scale: float,
    noise_scale: float,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor]:
    """Durations -> frames: the data-dependent tail of the encoder (one device read)."""
    w_ceil, y_lengths = durations(logw, x_mask, length_scale)
    frames = int(y_lengths.max())
    return expand_frames(m_p, logs_p, x_mask, w_ceil, y_lengths, frames, noise_scale, generator)


def from_onnx(
    model: onnx.ModelProto | Path | str,
    device: torch.device,
    banded: bool = True,
    text_precision: str = "fp32",
) -> EncoderCore:
    """An `EncoderCore` from a Piper VITS encoder graph's initializers, or `NotPiperVits`."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    if any(value.name == "sid" for value in model.graph.input):
        raise NotPiperVits("multi-speaker voices use the node-by-node port")
    arrays = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    weights = {
        name: torch.from_numpy(np.array(a, dtype=np.float32)).to(device)
        for name, a in arrays.items()
        if name.startswith(("enc_p.", "dp.")) and a.dtype == np.float32
    }
    embedding_name = next(
        (n.input[0] for n in model.graph.node if n.op_type == "Gather" and n.input[1] == "input"),
        None,
    )
    affine = next((name for name in arrays if name.startswith("/dp/flows.0/Exp")), None)
    needed = [
        "enc_p.proj.weight",
        "dp.pre.weight",
        "dp.flows.0.m",
        "enc_p.encoder.attn_layers.0.emb_rel_k",
    ]
    if embedding_name is None or affine is None or any(name not in weights for name in needed):
        raise NotPiperVits("the encoder graph does not keep the Piper VITS weight names")
    embedding = torch.from_numpy(np.array(arrays[embedding_name], dtype=np.float32)).to(device)
    exp_neg_logs = torch.from_numpy(np.array(arrays[affine], dtype=np.float32)).to(device)
    return EncoderCore(weights, embedding, exp_neg_logs, banded, text_precision)
