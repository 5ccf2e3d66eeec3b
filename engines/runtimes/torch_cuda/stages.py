"""`TorchCudaStages`: the `StageRuntime` of the torch-cuda engines, for every voice of one
architecture.

- encoder (text encoder + stochastic duration predictor): FP32 (its text part at FP16 or BF16
  where the plan's `encoder_precision` asks), its fixed-shape core replayed from CUDA
  graphs. Its output length depends on the predicted durations (a device read per call),
  and FP16 or TF32 there moves frame boundaries (``ceil`` of durations).
  With the plan's `encoder_launch` "beside" (`batching.encoderLaunch` of a TTSVoice; "queued"
  by default) `encode_launch` runs it on a CUDA stream of its own (its graphs in a memory
  pool of their own), and with "queued" on the windows' stream behind them, so that the
  stream model can go on launching windows while it runs; otherwise its graphs share the
  flow's and vocoder's pool.
- flow and vocoder: the entry's precision (FP16 by default). Their calls come from the
  stream model as batches of fixed-size windows, so each call is padded up to a batch bucket
  (1, 2, 4, ..., 256) and replayed from a CUDA graph captured once per (bucket, frames):
  hundreds of small kernel launches become one graph launch. In FP16 their 1-D convolutions
  run as channels-last 2-D ones (engines.runtimes.torch_cuda.convert). With
  `vocoder_streams` above 1 (off by default) a step's small vocoder calls take further CUDA
  streams in turn (`vocoder_stream`), each with graphs of its own; measured on an H200 only.

Voices are weight sets (engines/runtimes/torch_cuda/weights.py): the modules and graphs are made
once, from the engine entry the runtime is created with, and `load_voice` adds another
voice of the same architecture as a flat buffer per stage, bound into the modules' weights
before each of its calls. A voice costs its weights, not a process, a context and graphs.

GPU memory, from what `voxfleet bench gpu-memory` measured (docs/gpu.md):
- every graph of a stage reads its inputs from and writes its outputs to flat buffers shared
  by all of them (`StaticBuffers`), outside the graphs' memory pool; inside the pool a
  graph's intermediates are all freed by the end of its capture, so graphs captured later
  reuse them;
- the warmup captures the largest shapes first, so that the smaller ones fit in what the
  largest left free, and the pool holds about the largest graph's working set;
- cuDNN's autotuning tries no algorithm that needs more than `CUDNN_WORKSPACE_MIB` of
  workspace, and the allocator's cached blocks go back to the device after the warmup.

Weights are the stage ONNX files' initializers (engines.runtimes.torch_cuda.convert).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from engines.contract.plan import check_encoder_launch
from engines.runtimes.reader import ProcessReader
from engines.runtimes.torch_cuda import acoustic
from engines.runtimes.torch_cuda.acoustic import EncoderCore
from engines.runtimes.torch_cuda.convert import ROWS_PREFIX, OnnxModule, _as_rows
from engines.runtimes.torch_cuda.weights import ArchitectureMismatch, WeightBinding, WeightLayout

DEFAULT_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# 24 between 16 and 32: encoder calls under load carry 18 to 28 sentences, and the core's
# cost grows with its padded rows (20 x 320 ids: 8.4 ms as 24 rows against 10.3 ms as 32 on
# the H100, a probe of 2026-11-24, docs/history.md); 20 more graphs at warmup.
ENCODER_BATCH_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 64)
DTYPES = {"fp16": torch.float16, "fp32": torch.float32}
# Encoder calls the scheduler keeps in flight when they are queued on the windows' stream:
# they run one after another there, so more in flight only means that new sentences wait
# less for a call. On the H100 through Triton, 3 gave more audio and a lower first-audio p95
# than 1 or 6 (one to two runs each, docs/history.md).
QUEUED_ENCODER_CALLS_IN_FLIGHT = 3
# cuDNN's autotuning (every graph is captured for one fixed shape, so it times its
# algorithms once per shape) skips algorithms that need more workspace than this. Unbounded,
# it tried some that took several GB for a moment, and one process of the earlier design took
# 47.99 GiB while loading; PyTorch reads the cap from this variable at its first convolution.
CUDNN_WORKSPACE_MIB = 256
CUDNN_WORKSPACE_ENV = "CUDNN_CONV_WSCAP_DBG"
STAGES = ("encoder", "flow", "vocoder")
# Grouped calls (`GraphedStage.run_lanes`): the voices one call takes, padded up to these
# lane counts, and the most rows of one voice in it; a voice with more rows than that in a
# call has a call of its own (its rows already fill one). The stages whose calls the stream
# model sends with several voices' rows, and the lanes a runtime gives them by default: each
# lane past the first costs one voice's weights of the stage (26.6 MiB for joe's FP16
# vocoder).
LANE_BUCKETS = (2, 4, 8)
MAX_LANE_ROWS = 16
GROUPED_STAGES = ("encoder",)
GROUPABLE_STAGES = ("encoder", "vocoder")
VOICE_LANES = 1
# An encoder call's voices rarely bring more than a few sentences each (a voice with more
# fills a call of its own), and its graphs are captured per phoneme width (20 of them).
MAX_ENCODER_LANE_ROWS = 4
LOGGER = logging.getLogger(__name__)
# The stages whose graphs are captured with cuDNN's autotuning; the others take cuDNN's
# heuristics. Autotuning is most of a warmup's time (87.7 s against 13.6 s for 228 graphs on
# the H200, 2026-11-28), and it pays for the vocoder alone: on the H200 (2026-11-29,
# `STAGE=limits bash tests/gpu/pace_session.sh`) the vocoder took 0.10 ms a window of 144
# frames autotuned (256 windows) against 0.30 with the heuristics (128 windows); the flow
# 0.055 ms a window of 304 frames either way, the encoder 0.71 against 0.78 ms a sentence.
AUTOTUNED_STAGES = frozenset({"vocoder"})
# Of those stages' graphs, only the ones of at least this many rows are autotuned: each
# autotuned vocoder capture took 0.9 to 1.1 s whatever its rows, 25 of a 39 s warmup for 28
# graphs, while a call of fewer rows is mostly its fixed cost (0.39 ms for 1 window of 144
# frames, 1.1 ms for 8, 6.9 ms for 64; H200, 2026-11-29, `STAGE=warmup bash
# tests/gpu/pace_session.sh`, docs/gpu.md).
AUTOTUNE_MIN_ROWS = 16
# Vocoder calls on further CUDA streams (`vocoder_streams`, `TorchCudaStages.vocoder_stream`):
# 1, none, by default; a call of at most SPREAD_MAX_ROWS windows may go to one, a larger one
# stays on the windows' stream. A busy step of several voices launches a call a voice, of 6
# to 16 windows at ten voices, and on one stream each waits for the one before although it
# fills little of the GPU (a call's fixed part, docs/gpu.md). Each further stream costs one
# voice's vocoder weights and graphs of its own for the buckets up to SPREAD_MAX_ROWS, in a
# memory pool of their own (graphs that share a pool must never run at the same time).
VOCODER_STREAMS = 1
SPREAD_MAX_ROWS = 16
# Queued encoder calls on further CUDA streams (`encoder_streams`, `encode_launch`): 1, none,
# by default. An encoder call is a long chain of small kernels that leaves most of the GPU
# idle: on the H200 eight calls of 4 sentences (128 phonemes) took 14.9 ms one after another
# on one stream, 6.6 ms spread over four and 4.9 over eight, where the vocoder's calls of 4
# windows gained a fifth at most (`python -m lab.stream_overlap`, docs/gpu-runs.md). A step's
# encoder calls of at most ENCODER_SPREAD_MAX_ROWS sentences take the streams in turn, the
# windows' own first, all starting after the windows queued before the first of them. Each
# further stream costs one voice's encoder weights (FP32) and graphs of its own for the
# buckets up to that many sentences, in a memory pool of its own.
ENCODER_STREAMS = 1
ENCODER_SPREAD_MAX_ROWS = 8


class TorchCudaError(RuntimeError):
    """The torch-cuda runtime cannot run here or was asked for something it cannot do."""


def padded_phonemes(count: int) -> int:
    """Phoneme ids an encoder call of sentences up to `count` ids is padded to: a multiple of
    32 (exact: the encoder masks by length), so that calls repeat shapes."""
    return -(-count // 32) * 32


def bucket_for(batch: int, buckets: Sequence[int]) -> int:
    """The smallest bucket that holds `batch` (the largest, if none does: callers split)."""
    for bucket in buckets:
        if bucket >= batch:
            return bucket
    return buckets[-1]


class StaticBuffers:
    """The flat buffers every graph of one stage reads its inputs from and writes its
    outputs to, allocated outside the graphs' memory pool.

    A stage's graphs replay one at a time (its lock, one CUDA stream), each input is copied in
    just before its replay and each output copied out just after, so one buffer per input and
    output serves them all, sized for the largest. Per-graph static tensors would keep every
    graph's inputs and outputs allocated, and outputs made inside the pool would keep their
    blocks from the graphs captured after them."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._flats: dict[tuple[str, str], torch.Tensor] = {}

    def view(self, key: tuple[str, str], shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
        numel = math.prod(shape)
        flat = self._flats.get(key)
        if flat is None or flat.dtype != dtype or flat.numel() < numel:
            # Graphs captured before keep the smaller buffer alive through their views.
            flat = torch.zeros(numel, dtype=dtype, device=self.device)
            self._flats[key] = flat
        return flat[:numel].view(tuple(shape))

    def nbytes(self) -> int:
        return sum(flat.numel() * flat.element_size() for flat in self._flats.values())


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: list[torch.Tensor]


StageFunction = Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]


@dataclass(eq=False)
class _StreamSlot:
    """A further CUDA stream a stage's calls may run on (`TorchCudaStages.vocoder_stream`,
    `encode_launch`): its graphs read the weights bound to lane `lane` of the stage's
    binding."""

    stream: torch.cuda.Stream
    graphed: GraphedStage
    lane: int
    stage: str = "vocoder"


class _EncoderGroup:
    """A step's encoder calls launched one after another over the encoder's streams
    (`encoder_streams`): they start together, after the windows queued before the first of
    them (`start`, on the windows' stream), and run side by side, and the windows' stream
    waits for all of them before its next call (`join_encoder_streams`), as it waits for a
    queued call on it: the group runs as one queued call would, in less time, and no window
    runs beside it (with windows beside them, a pod on the H200 counted its vocoder calls at
    1.7 to 2.1 ms where they took 0.5 ms alone, and turned listeners away: docs/gpu-runs.md).
    A call's own span is about the group's over the calls on its stream, so each is charged
    its span over the streams the group took (`EncoderCall.seconds`): the group's calls
    together are charged about its span, what they added to the device's time, not the time
    each took."""

    def __init__(self, start: torch.cuda.Event) -> None:
        self.start = start
        self.turns: set[int] = set()  # the streams its calls took (0: the windows' own)

    @property
    def overlap(self) -> int:
        return max(1, len(self.turns))


class GraphedStage:
    """A stage whose calls are padded to batch buckets and replayed from CUDA graphs."""

    def __init__(
        self,
        module: OnnxModule | None,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        use_graphs: bool = True,
        max_graphs: int = 256,
        pool: Any = None,
        frame_multiple: int = 1,
        function: StageFunction | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.module = module
        if function is None:
            assert module is not None
            onnx_module = module

            def function(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
                return onnx_module(**inputs)

        self.function = function
        if device is None:
            assert module is not None
            device = module.device
        self.device = device
        self.buckets = tuple(sorted(batch_buckets))
        # Frames are padded (zeros, on the right) up to a multiple of this, so that the few
        # window widths the stream model sends share graphs; outputs are cut back.
        self.frame_multiple = frame_multiple
        self.use_graphs = use_graphs and self.device.type == "cuda"
        self.max_graphs = max_graphs
        # A shape without a graph is captured on its first call (a stall of a few hundred ms
        # on a GPU) while this is set; once a pod serves, it runs eagerly instead, with
        # cuDNN's heuristics (`TorchCudaStages.stop_capturing`).
        self.capture_on_use = True
        # cuDNN's autotuning for this stage's captures (None: the process's setting), for
        # graphs of at least `autotune_min_rows` rows.
        self.autotune: bool | None = None
        self.autotune_min_rows = 1
        self.pool = pool
        self.graphs: dict[tuple[int, tuple[tuple[int, ...], ...]], _Captured] = {}
        # Grouped calls (`run_lanes`): several voices' rows in one call, each lane against its
        # own voice's weights; set by the runtime where the stage's weights have lanes
        # (`TorchCudaStages`, `voice_lanes`). Graphed per (lanes, rows a lane, shape).
        self.lane_function: StageFunction | None = None
        self.lane_buckets: tuple[int, ...] = LANE_BUCKETS
        self.max_lane_rows = MAX_LANE_ROWS
        self.lane_autotune: bool | None = None  # the stage's own (`autotune`)
        self.lane_graphs: dict[tuple[int, int, tuple[tuple[int, ...], ...]], _Captured] = {}
        # Grouped calls by (lanes, rows a lane) they were padded to.
        self.lane_histogram: dict[tuple[int, int], int] = {}
        self.batch_histogram: dict[int, int] = {}
        self.buffers = StaticBuffers(self.device)
        # The warm runs before each capture go on one stream: each stream a library call runs
        # on gets workspaces of its own (cuBLAS keeps about 40 MiB per stream on Hopper), and a
        # new stream per capture kept one set per graph.
        self._warm_stream: torch.cuda.Stream | None = None
        self._lock = threading.Lock()

    def _transfers(self) -> int:
        return self.module.transfers if self.module is not None else 0

    @staticmethod
    def _cudnn(autotune: bool | None) -> Any:
        """cuDNN's flags for a capture or an eager call: autotuning on or off, the rest as set."""
        if autotune is None:
            return contextlib.nullcontext()
        return torch.backends.cudnn.flags(
            enabled=True,
            benchmark=autotune,
            deterministic=torch.backends.cudnn.deterministic,
            allow_tf32=torch.backends.cudnn.allow_tf32,
        )

    def _capture(
        self, bucket: int, inputs: dict[str, torch.Tensor], autotune: bool | None = None
    ) -> _Captured:
        tune = self.autotune if autotune is None else autotune
        if tune and bucket < self.autotune_min_rows:
            tune = False
        with self._cudnn(tune):
            return self._capture_now(bucket, inputs)

    def _capture_now(self, bucket: int, inputs: dict[str, torch.Tensor]) -> _Captured:
        static = {
            name: self.buffers.view(("in", name), (bucket, *tensor.shape[1:]), tensor.dtype)
            for name, tensor in inputs.items()
        }
        return self._capture_static(static, self.function, "out")

    def _capture_static(
        self, static: dict[str, torch.Tensor], function: StageFunction, outputs_key: str
    ) -> _Captured:
        if self._warm_stream is None:
            self._warm_stream = torch.cuda.Stream(device=self.device)
        side = self._warm_stream
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            # cuDNN picks its algorithms here, outside the capture: timing them takes a
            # second run; its heuristics pick at the first.
            for _ in range(2 if torch.backends.cudnn.benchmark else 1):
                shapes = [(tuple(o.shape), o.dtype) for o in function(static)]
        torch.cuda.current_stream(self.device).wait_stream(side)
        # What the warm runs and cuDNN's autotuning left cached goes back before the capture
        # takes its own memory for the same shape.
        torch.cuda.empty_cache()
        outputs = [
            self.buffers.view((outputs_key, str(index)), shape, dtype)
            for index, (shape, dtype) in enumerate(shapes)
        ]
        transfers = self._transfers()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            for out, result in zip(outputs, function(static), strict=True):
                out.copy_(result)
        if self._transfers() != transfers:
            raise TorchCudaError("the stage moved values between host and device while captured")
        return _Captured(graph=graph, inputs=static, outputs=outputs)

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.run(inputs)[0]

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        outputs = self._padded(inputs, self._run)
        assert outputs is not None  # a plain call always runs
        return outputs

    def _padded(
        self,
        inputs: dict[str, torch.Tensor],
        call: Callable[[dict[str, torch.Tensor]], list[torch.Tensor] | None],
    ) -> list[torch.Tensor] | None:
        """`call` with the frames padded up to `frame_multiple`, its outputs cut back."""
        frames = next(iter(inputs.values())).shape[-1]
        padded = -(-frames // self.frame_multiple) * self.frame_multiple
        if padded == frames:
            return call(inputs)
        outputs = call(
            {
                name: torch.nn.functional.pad(t, (0, padded - frames)) if t.dim() == 3 else t
                for name, t in inputs.items()
            }
        )
        if outputs is None:
            return None
        cut = []
        for output in outputs:
            per_frame = output.shape[-1] // padded
            cut.append(output[..., : frames * per_frame])
        return cut

    def lane_shape(self, lanes: int, rows: int) -> tuple[int, int] | None:
        """(lanes, rows a lane) a grouped call of `lanes` voices and at most `rows` rows each
        is padded up to; None where no grouped call takes it (`lane_function` unset, or more
        lanes or rows than `LANE_BUCKETS` and `max_lane_rows`)."""
        if self.lane_function is None or lanes > self.lane_buckets[-1]:
            return None
        if rows > self.max_lane_rows:
            return None
        shape = bucket_for(lanes, self.lane_buckets), bucket_for(rows, self.buckets)
        # No grouped graph takes more rows than the largest plain one: the graphs' pool holds
        # the largest graph's working set.
        return shape if shape[0] * shape[1] <= self.buckets[-1] else None

    def run_lanes(
        self, inputs: dict[str, torch.Tensor], lane: np.ndarray, position: np.ndarray
    ) -> list[torch.Tensor] | None:
        """One grouped call: row i of `inputs` runs in lane `lane[i]` (against the weights
        bound to that lane) at place `position[i]`; the outputs come back in the rows' order.
        None where this shape has no graph and none may be captured now (a pod that serves):
        the caller runs the voices one call each instead."""
        return self._padded(inputs, lambda padded: self._run_lanes(padded, lane, position))

    def _run_lanes(
        self, inputs: dict[str, torch.Tensor], lane: np.ndarray, position: np.ndarray
    ) -> list[torch.Tensor] | None:
        shape = self.lane_shape(int(lane.max()) + 1, int(position.max()) + 1)
        if shape is None:
            return None
        lanes, rows = shape
        where = torch.from_numpy(lane * rows + position).to(self.device)
        assert self.lane_function is not None
        with self._lock:
            self.lane_histogram[shape] = self.lane_histogram.get(shape, 0) + 1
            if not self.use_graphs:
                lane_inputs = {}
                for name, tensor in inputs.items():
                    laid = tensor.new_zeros((lanes * rows, *tensor.shape[1:]))
                    laid.index_copy_(0, where, tensor)
                    lane_inputs[name] = laid.view(lanes, rows, *tensor.shape[1:])
                outputs = self.lane_function(lane_inputs)
                return [out.reshape(lanes * rows, *out.shape[2:])[where] for out in outputs]
            shape_key = tuple(tuple(t.shape[1:]) for t in inputs.values())
            captured = self.lane_graphs.get((lanes, rows, shape_key))
            if captured is None:
                if not self.capture_on_use:
                    return None
                captured = self._capture_lanes(lanes, rows, inputs)
                self.lane_graphs[(lanes, rows, shape_key)] = captured
            for name, tensor in inputs.items():
                flat = captured.inputs[name].view(lanes * rows, *tensor.shape[1:])
                flat.index_copy_(0, where, tensor)
            captured.graph.replay()
            return [out.view(lanes * rows, *out.shape[2:])[where] for out in captured.outputs]

    def _capture_lanes(self, lanes: int, rows: int, inputs: dict[str, torch.Tensor]) -> _Captured:
        """A grouped call's graph, its static inputs [lanes, rows, ...] in buffers of their own."""
        assert self.lane_function is not None
        static = {
            name: self.buffers.view(
                ("lanes-in", name), (lanes, rows, *tensor.shape[1:]), tensor.dtype
            )
            for name, tensor in inputs.items()
        }
        autotune = self.autotune if self.lane_autotune is None else self.lane_autotune
        if autotune and lanes * rows < self.autotune_min_rows:  # (as a plain graph's rows)
            autotune = False
        with self._cudnn(autotune):
            return self._capture_static(static, self.lane_function, "lanes-out")

    def _run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        batch = next(iter(inputs.values())).shape[0]
        largest = self.buckets[-1]
        if batch > largest:
            parts = [
                self._run({name: t[start : start + largest] for name, t in inputs.items()})
                for start in range(0, batch, largest)
            ]
            return [torch.cat(column) for column in zip(*parts, strict=True)]
        bucket = bucket_for(batch, self.buckets)
        with self._lock:
            self.batch_histogram[batch] = self.batch_histogram.get(batch, 0) + 1
            if not self.use_graphs:
                return list(self.function(inputs))
            shape_key = tuple(tuple(t.shape[1:]) for t in inputs.values())
            captured = self.graphs.get((bucket, shape_key))
            if captured is None:
                if not self.capture_on_use or len(self.graphs) >= self.max_graphs:
                    with self._cudnn(False):  # no autotuning stall while serving
                        return list(self.function(inputs))
                captured = self._capture(bucket, inputs)
                self.graphs[(bucket, shape_key)] = captured
            for name, tensor in inputs.items():
                captured.inputs[name][:batch].copy_(tensor)
            captured.graph.replay()
            # The next replay overwrites the static outputs: hand out copies.
            return [output[:batch].clone() for output in captured.outputs]


class EncoderCall:
    """An encoder call queued on the encoder's CUDA stream, or on the windows' stream
    (`TorchCudaStages.encode_launch`).

    `done()` says, without waiting, whether its frame counts are on the host; `finish()` reads
    them and queues the expansion to prior frames on the caller's current stream behind the
    call (that stream waits for the encoder's event, not the host). `seconds()` is the
    encoder's device time, `done()` first.
    """

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        lengths: torch.Tensor,
        noise_scale: float,
        start: torch.cuda.Event,
        end: torch.cuda.Event,
        group: _EncoderGroup | None = None,
    ) -> None:
        self._tensors = tensors  # m_p, logs_p, x_mask, w_ceil, y_lengths (device)
        self._lengths = lengths  # y_lengths in pinned host memory, once `end` is reached
        self._noise_scale = noise_scale
        self._events = (start, end)
        self._group = group  # the calls it ran beside (`encoder_streams`), if any

    def done(self) -> bool:
        return bool(self._events[1].query())

    def seconds(self) -> float:
        """Its device time: its events' span, shared with the calls of its group that ran
        beside it on other streams (`_EncoderGroup`)."""
        start, end = self._events
        end.synchronize()
        overlap = self._group.overlap if self._group is not None else 1
        return start.elapsed_time(end) / 1000.0 / overlap

    def finish(self) -> tuple[torch.Tensor, np.ndarray]:
        """(prior [B, 192, frames] queued on the current stream, frames per row)."""
        end = self._events[1]
        end.synchronize()
        frames = self._lengths.numpy().copy()
        m_p, logs_p, x_mask, w_ceil, y_lengths = self._tensors
        current = torch.cuda.current_stream(m_p.device)
        current.wait_event(end)
        for tensor in self._tensors:
            # Made on the encoder's stream, read on this one: their memory is not handed out
            # again before this stream has read them.
            tensor.record_stream(current)
        prior, _ = acoustic.expand_frames(
            m_p, logs_p, x_mask, w_ceil, y_lengths, int(frames.max()), self._noise_scale
        )
        return prior, frames


def _read_precision(engine_dir: Path) -> str:
    manifest = engine_dir / "manifest.json"
    if manifest.is_file():
        return str(json.loads(manifest.read_text())["key"]["precision"])
    return "fp16"


def _graph_inputs(path: Path) -> list[str]:
    model = onnx.load(str(path), load_external_data=False)
    return [value.name for value in model.graph.input]


@dataclass(eq=False)  # a voice is its identity (a key of grouped calls' lanes)
class VoiceWeights:
    """One voice's weights: a flat buffer per stage, in the architecture's layout."""

    name: str
    flats: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        return sum(flat.numel() * flat.element_size() for flat in self.flats.values())


def _module_tensors(module: OnnxModule, keys: Sequence[str], stage: str) -> dict[str, torch.Tensor]:
    """`module`'s weights (loaded on the host) under the architecture's `keys`: convolution
    weights in the channels-last form where the architecture runs them so."""
    tensors: dict[str, torch.Tensor] = {}
    for key in keys:
        name = key[len(ROWS_PREFIX) :] if key.startswith(ROWS_PREFIX) else key
        weight = module.device_constants.get(name)
        if weight is None:
            raise ArchitectureMismatch(f"{stage}: the voice has no weight {name}")
        tensors[key] = _as_rows(weight) if key.startswith(ROWS_PREFIX) else weight
    extra = set(module.device_constants) - {k.removeprefix(ROWS_PREFIX) for k in keys}
    if extra:
        raise ArchitectureMismatch(
            f"{stage}: the voice has weights the architecture lacks: {', '.join(sorted(extra)[:3])}"
        )
    return tensors


@dataclass(frozen=True)
class VoiceReading:
    """What reading a voice of an architecture needs (`read_voice`), in a form a worker
    process takes: the graphs' structures it must match, each stage's weight layout (its float
    type the stage's), and whether the encoder is the ported module (`EncoderCore`)."""

    structures: dict[str, str]
    layouts: dict[str, WeightLayout]
    encoder_core: bool


def _read_graph(path: Path, stage: str, reading: VoiceReading) -> dict[str, torch.Tensor]:
    """One stage's weights from its graph on the host; ArchitectureMismatch where the graph
    differs from the architecture's."""
    layout = reading.layouts[stage]
    module = OnnxModule(path, torch.device("cpu"), layout.dtype)
    if module.structure() != reading.structures[stage]:
        raise ArchitectureMismatch(
            f"{stage}: the voice's graph differs from the architecture's (nodes, "
            "attributes or integer constants): it needs a pool of its own architecture"
        )
    return _module_tensors(module, [slot.name for slot in layout.slots], stage)


def read_voice(engine_dir: Path, reading: VoiceReading) -> dict[str, bytes]:
    """A voice's weights from its engine entry, checked against the architecture and laid out
    as its buffers are, each stage's as bytes; on the host, in whatever process runs it (a
    voice host runs it in its reader process). ArchitectureMismatch where the voice differs."""
    tensors = {
        stage: _read_graph(engine_dir / f"{stage}.onnx", stage, reading)
        for stage in ("flow", "vocoder")
    }
    path = engine_dir / "encoder.onnx"
    if reading.encoder_core:
        try:
            tensors["encoder"] = acoustic.from_onnx(path, torch.device("cpu")).weight_tensors()
        except acoustic.NotPiperVits as error:
            raise ArchitectureMismatch(f"encoder: {error}") from None
    else:
        tensors["encoder"] = _read_graph(path, "encoder", reading)
    for stage, stage_tensors in tensors.items():  # every check before any layout
        reading.layouts[stage].check(WeightLayout.of(stage_tensors), stage)
    host = torch.device("cpu")
    return {
        stage: reading.layouts[stage].pack(stage_tensors, host).view(torch.uint8).numpy().tobytes()
        for stage, stage_tensors in tensors.items()
    }


def _reader_warm() -> int:
    """The reader process's first task: importing this module (torch, onnx) before a read."""
    return os.getpid()


_READER: ProcessReader | None = None
_READER_LOCK = threading.Lock()


def _voice_reader() -> ProcessReader:
    """The process's one reader of voices, shared by its architectures."""
    global _READER
    with _READER_LOCK:
        if _READER is None:
            _READER = ProcessReader(warm=_reader_warm)
        return _READER


class TorchCudaStages:
    """Encoder, flow and vocoder on one CUDA device, for every voice of one architecture (see
    the module docstring). The engine entry it is made from is its default voice
    (`default_voice`); `load_voice` adds others."""

    name = "torch-cuda"

    def __init__(
        self,
        engine_dir: Path,
        device: str | torch.device = "cuda",
        precision: str | None = None,
        batch_buckets: Sequence[int] = DEFAULT_BATCH_BUCKETS,
        use_graphs: bool = True,
        flow_frame_multiple: int = 32,
        vocoder_frame_multiple: int = 16,
        encoder_batch_buckets: Sequence[int] = ENCODER_BATCH_BUCKETS,
        encoder_launch: str = "inline",
        autotune: bool = True,
        encoder_precision: str = "fp32",
        voice_lanes: int = VOICE_LANES,
        grouped_stages: Sequence[str] = GROUPED_STAGES,
        autotune_min_rows: int = AUTOTUNE_MIN_ROWS,
        vocoder_streams: int = VOCODER_STREAMS,
        encoder_streams: int = ENCODER_STREAMS,
    ) -> None:
        engine_dir = Path(engine_dir)
        if voice_lanes < 1:
            raise TorchCudaError(
                f"voice_lanes is at least 1 (1: no grouped calls), got {voice_lanes}"
            )
        for stage, streams in (("vocoder", vocoder_streams), ("encoder", encoder_streams)):
            if streams < 1:
                raise TorchCudaError(
                    f"{stage}_streams is at least 1 (1: the windows' stream alone), got {streams}"
                )
            if streams > 1 and voice_lanes > 1 and stage in grouped_stages:
                raise TorchCudaError(
                    f"the {stage}'s calls are grouped over voices (voice_lanes) or spread over "
                    f"CUDA streams ({stage}_streams), not both"
                )
        if encoder_streams > 1 and encoder_launch != "queued":
            raise TorchCudaError(
                "encoder_streams spreads queued encoder calls (encoder_launch queued), not "
                f"{encoder_launch!r} ones"
            )
        unknown = [name for name in grouped_stages if name not in GROUPABLE_STAGES]
        if unknown:
            raise TorchCudaError(
                f"grouped calls are for {' or '.join(GROUPABLE_STAGES)}, not {', '.join(unknown)}"
            )
        self.device = torch.device(device)
        # cuDNN times its algorithms for each captured shape (else its heuristics choose).
        self.autotune = autotune
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise TorchCudaError(
                "the torch-cuda runtime needs a CUDA GPU and PyTorch built with CUDA; "
                f"this PyTorch ({torch.__version__}) sees none"
            )
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        try:
            check_encoder_launch(encoder_launch)
        except ValueError as error:
            raise TorchCudaError(str(error)) from None
        self.precision = precision or _read_precision(engine_dir)
        if self.precision not in DTYPES:
            raise TorchCudaError(
                f"the torch-cuda runtime runs fp16 or fp32, not {self.precision!r}"
            )
        dtype = DTYPES[self.precision]
        if self.device.type == "cuda":
            # Every graph is captured for one fixed shape: let cuDNN time its algorithms, with
            # a bounded workspace (`CUDNN_WORKSPACE_MIB`).
            os.environ.setdefault(CUDNN_WORKSPACE_ENV, str(CUDNN_WORKSPACE_MIB))
            torch.backends.cudnn.benchmark = autotune
        if self.precision == "fp32" and self.device.type == "cuda":
            # TF32 matrix units would make "fp32" 1e-3-accurate, not fp32-accurate.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        _check_entry(engine_dir)
        self.encoder_input_names = _graph_inputs(engine_dir / "encoder.onnx")
        self.multi_speaker = "sid" in self.encoder_input_names
        pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" and use_graphs else None
        # The encoder's fixed-shape part as torch modules, graphed per (batch, phonemes); the
        # node-by-node port stays for graphs without the Piper weight names (multi-speaker).
        self.encoder_core: EncoderCore | None = None
        self.encoder_stage: GraphedStage | None = None
        self.encoder: OnnxModule | None = None
        if encoder_precision not in acoustic.TEXT_PRECISIONS:
            raise TorchCudaError(
                f"the encoder's text part runs {', '.join(acoustic.TEXT_PRECISIONS)}, "
                f"not {encoder_precision!r}"
            )
        # What the encoder runs: its text part at `encoder_precision` where the encoder is
        # the Piper VITS core (acoustic.TEXT_PRECISIONS), FP32 where it runs node by node.
        self.encoder_precision = "fp32"
        try:
            self.encoder_core = acoustic.from_onnx(
                engine_dir / "encoder.onnx", self.device, text_precision=encoder_precision
            )
            self.encoder_precision = encoder_precision
        except acoustic.NotPiperVits:
            self.encoder = OnnxModule(engine_dir / "encoder.onnx", self.device, torch.float32)
        launched = encoder_launch
        if self.encoder_core is None or self.device.type != "cuda":
            launched = "inline"  # only a graphed encoder on a GPU is launched
        beside = launched == "beside"
        self._queued_launches = launched == "queued"
        if self.encoder_core is not None:
            core = self.encoder_core

            def encoder_function(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
                return list(core(inputs["ids"], inputs["lengths"], inputs["noise"]))

            # Beside the windows, the encoder's graphs have a memory pool of their own: they
            # replay on their own stream (`encode_launch`) while the flow's and vocoder's
            # replay on another, and graphs that share a pool must never run at the same time.
            self.encoder_stage = GraphedStage(
                None,
                encoder_batch_buckets,
                use_graphs,
                pool=torch.cuda.graph_pool_handle() if beside and pool is not None else pool,
                function=encoder_function,
                device=self.device,
            )
        self._encoder_stream: torch.cuda.Stream | None = None
        if beside:
            # High priority: an encoder call is a long chain of small kernels, each waiting
            # for the one before; given the multiprocessors first as each becomes ready, it
            # keeps its own pace while the vocoder's wide kernels fill the rest of the GPU.
            self._encoder_stream = torch.cuda.Stream(device=self.device, priority=-1)
        self.flow_module = OnnxModule(engine_dir / "flow.onnx", self.device, dtype)
        self.vocoder_module = OnnxModule(engine_dir / "vocoder.onnx", self.device, dtype)
        self.flow_stage = GraphedStage(
            self.flow_module,
            batch_buckets,
            use_graphs,
            pool=pool,
            frame_multiple=flow_frame_multiple,
        )
        self.vocoder_stage = GraphedStage(
            self.vocoder_module,
            batch_buckets,
            use_graphs,
            pool=pool,
            frame_multiple=vocoder_frame_multiple,
        )
        for name, graphed in (
            ("encoder", self.encoder_stage),
            ("flow", self.flow_stage),
            ("vocoder", self.vocoder_stage),
        ):
            if graphed is not None:
                graphed.autotune = autotune and name in AUTOTUNED_STAGES
                graphed.autotune_min_rows = autotune_min_rows
        # What the warmup took and chose, by stage (`warmup_report`).
        self._warmup_seconds: dict[str, float] = {}
        # Every stage's weights move into a bound buffer the modules read from now on; the
        # default voice's own buffers are those bound ones until another voice is loaded.
        self._structures = {
            "flow": self.flow_module.structure(),
            "vocoder": self.vocoder_module.structure(),
        }
        if self.encoder is not None:
            self._structures["encoder"] = self.encoder.structure()
        self._bindings: dict[str, WeightBinding] = {}
        graphed_stages = {
            "encoder": self.encoder_stage,
            "flow": self.flow_stage,
            "vocoder": self.vocoder_stage,
        }
        # Further streams for the vocoder's and the encoder's calls only on a GPU (lanes 1 and
        # up of their weights), the encoder's only where its calls are queued (launched).
        if self.device.type != "cuda":
            vocoder_streams = 1
        if not self._queued_launches:
            encoder_streams = 1
        self._grouped: tuple[str, ...] = ()
        for stage, holder in self._weight_holders().items():
            grouped = stage in grouped_stages and graphed_stages[stage] is not None
            lanes = voice_lanes if grouped else 1
            # (Further streams take lanes of their stage's weights too, but no grouped calls:
            # the two are refused together above.)
            streams = {"vocoder": vocoder_streams, "encoder": encoder_streams}.get(stage, 1)
            weight_lanes = max(lanes, streams)
            binding = WeightBinding(stage, holder.weight_tensors(), self.device, weight_lanes)
            holder.use_weights(binding.tensors)
            self._bindings[stage] = binding
            if lanes > 1:
                self._grouped += (stage,)
                graphed = graphed_stages[stage]
                assert graphed is not None
                graphed.lane_function = _lane_function(holder, graphed.function, binding)
                graphed.lane_buckets = tuple(b for b in LANE_BUCKETS if b <= lanes)
                if stage == "encoder":
                    graphed.max_lane_rows = MAX_ENCODER_LANE_ROWS
        self._vocoder_slots = [
            self._stream_slot("vocoder", lane, pool is not None)
            for lane in range(1, vocoder_streams)
        ]
        self._slot_turn = 0
        self._encoder_slots = [
            self._stream_slot("encoder", lane, pool is not None)
            for lane in range(1, encoder_streams)
        ]
        self._encoder_turn = 0
        # The encoder calls launched since the last call of another stage (`encode_launch`).
        self._encoder_group: _EncoderGroup | None = None
        self._on_slot = threading.local()  # the slot a thread's vocoder calls run on
        self._slots_to_join: set[_StreamSlot] = set()
        self.default_voice = VoiceWeights(
            engine_dir.name, {stage: b.bound for stage, b in self._bindings.items()}
        )
        self._default_shares_bound = True
        self._load_lock = threading.Lock()
        # What reading a further voice needs (`read_voice`), and the process that reads it.
        self._reading = VoiceReading(
            structures=dict(self._structures),
            layouts={stage: binding.layout for stage, binding in self._bindings.items()},
            encoder_core=self.encoder_core is not None,
        )
        self._reader = _voice_reader()
        if self.device.type == "cuda":
            self._reader.start()  # a serving process: ready before its next voice's load

    def _stream_slot(self, stage: str, lane: int, graphs: bool) -> _StreamSlot:
        """A further stream for a stage's calls (the vocoder's or the encoder's): graphs of
        its own for the buckets up to SPREAD_MAX_ROWS (ENCODER_SPREAD_MAX_ROWS), in a memory
        pool of their own, reading the weights of `lane`."""
        if stage == "vocoder":
            main, most, module = self.vocoder_stage, SPREAD_MAX_ROWS, self.vocoder_module
        else:
            assert self.encoder_stage is not None
            main, most, module = self.encoder_stage, ENCODER_SPREAD_MAX_ROWS, None
        holder, binding = self._weight_holders()[stage], self._bindings[stage]
        graphed = GraphedStage(
            module,
            [b for b in main.buckets if b <= most],
            main.use_graphs,
            pool=torch.cuda.graph_pool_handle() if graphs else None,
            frame_multiple=main.frame_multiple,
            function=_weights_function(
                holder,
                main.function,
                binding.layout.views(binding.lanes[lane]),
                binding.tensors,
            ),
            device=self.device,
        )
        graphed.autotune, graphed.autotune_min_rows = main.autotune, main.autotune_min_rows
        graphed._lock = main._lock  # one module: its weights are swapped for eager calls
        return _StreamSlot(torch.cuda.Stream(device=self.device), graphed, lane, stage)

    def _weight_holders(self) -> dict[str, Any]:
        encoder = self.encoder_core if self.encoder_core is not None else self.encoder
        return {"encoder": encoder, "flow": self.flow_module, "vocoder": self.vocoder_module}

    # -- voices ------------------------------------------------------------------------------

    def weights_bytes(self) -> int:
        """One voice's weights on the device (each loaded voice takes this much)."""
        return sum(binding.layout.nbytes for binding in self._bindings.values())

    def load_voice(self, engine_dir: Path, name: str = "") -> VoiceWeights:
        """Another voice of this architecture, from its engine entry: its weights are read and
        laid out on the host, in a worker process (`ProcessReader`), and only their packed
        buffers go to the device. ArchitectureMismatch (a ValueError) where its graphs or
        weights differ from the architecture's; nothing of it stays on the device then."""
        engine_dir = Path(engine_dir)
        _check_entry(engine_dir)
        flats_read = self._reader.run(read_voice, engine_dir, self._reading)
        with self._load_lock:
            if self._default_shares_bound:
                # The default voice keeps its weights once the bound buffers take others'.
                self.default_voice.flats = {
                    stage: binding.bound.clone() for stage, binding in self._bindings.items()
                }
                self._default_shares_bound = False
                for binding in self._bindings.values():
                    binding.forget(self.default_voice)
            flats = {
                stage: self._bindings[stage].upload(data) for stage, data in flats_read.items()
            }
        return VoiceWeights(name or engine_dir.name, flats)

    def unload_voice(self, voice: VoiceWeights) -> None:
        """Free `voice`'s buffers (its calls already queued have read them: the device frees
        them only after the work queued on the current stream)."""
        for binding in self._bindings.values():
            binding.forget(voice)
        voice.flats = {}

    def _bind(self, stage: str, voice: VoiceWeights | None, lane: int = 0) -> None:
        voice = voice or self.default_voice
        if not voice.flats:
            raise TorchCudaError(f"voice {voice.name!r} is not loaded")
        self._bindings[stage].bind(voice, voice.flats[stage], lane)

    @property
    def groups_voices(self) -> bool:
        """Whether encoder, flow and vocoder calls may carry several voices' rows (`voice` a
        sequence, one voice a row; they always may here): the stages with lanes
        (`grouped_stages`, `voice_lanes`) run them as one grouped call, each voice's rows
        against its own weights, the others one call a voice. True where any stage has
        lanes."""
        return bool(self._grouped)

    @property
    def grouped_stages(self) -> tuple[str, ...]:
        """The stages whose calls over several voices run as one grouped call."""
        return self._grouped

    # -- further streams for the vocoder's calls ---------------------------------------------

    @property
    def vocoder_streams(self) -> int:
        """The CUDA streams the vocoder's calls are spread over, the windows' own included."""
        return 1 + len(self._vocoder_slots)

    @property
    def vocoder_calls_by_stream(self) -> tuple[int, ...]:
        """The vocoder calls each stream has run, the windows' own first."""
        return _calls_by_stream(self.vocoder_stage, self._vocoder_slots)

    @contextlib.contextmanager
    def vocoder_stream(self, rows: int) -> Iterator[None]:
        """Where the vocoder calls queued inside run: calls of at most SPREAD_MAX_ROWS windows
        take the streams in turn, the windows' own among them, so that a busy step's calls of
        several voices run side by side on the GPU; a larger call stays on the windows'
        stream. On a further stream, everything queued inside (the window's gather, the
        call, its PCM's copy to the host, events) runs there, after what was queued on the
        windows' stream before; `join_vocoder_streams` orders what comes after it."""
        slot = None
        if self._vocoder_slots and rows <= SPREAD_MAX_ROWS:
            self._slot_turn = (self._slot_turn + 1) % self.vocoder_streams
            if self._slot_turn:
                slot = self._vocoder_slots[self._slot_turn - 1]
        if slot is None:
            yield
            return
        slot.stream.wait_stream(torch.cuda.current_stream(self.device))
        self._slots_to_join.add(slot)
        with self._running_on(slot):
            yield

    @contextlib.contextmanager
    def _running_on(self, slot: _StreamSlot) -> Iterator[None]:
        with torch.cuda.stream(slot.stream):
            self._on_slot.slot = slot
            try:
                yield
            finally:
                self._on_slot.slot = None

    def join_vocoder_streams(self) -> None:
        """The windows' stream waits for the vocoder calls queued on the further streams
        (`vocoder_stream`) since the last join: work queued after this on it (a flow writing
        the latents those calls read, an encoder call) runs after them."""
        if not self._slots_to_join:
            return
        current = torch.cuda.current_stream(self.device)
        for slot in self._slots_to_join:
            current.wait_stream(slot.stream)
        self._slots_to_join.clear()

    def _call(
        self,
        stage: str,
        graphed: GraphedStage,
        feeds: dict[str, torch.Tensor],
        voice: VoiceWeights | Sequence[VoiceWeights | None] | None,
    ) -> torch.Tensor:
        """A stage call for one voice, or for rows of several (`voice` a sequence, a voice a
        row): the voices whose rows fit a grouped call (`GraphedStage.lane_shape`) share one
        per `lanes` of them, each in a lane of its own; any other voice's rows run in a call of
        their own. The rows come back in their order, each as its own voice's call makes it."""
        return self._call_outputs(stage, graphed, feeds, voice)[0]

    def _call_outputs(
        self,
        stage: str,
        graphed: GraphedStage,
        feeds: dict[str, torch.Tensor],
        voice: VoiceWeights | Sequence[VoiceWeights | None] | None,
    ) -> list[torch.Tensor]:
        """`_call` with every output of the stage."""
        lane = 0
        if stage != "encoder" and self._encoder_group is not None:
            self.join_encoder_streams()  # another stage's call ends a group of encoder calls
        slot = getattr(self._on_slot, "slot", None)
        if slot is not None and slot.stage == stage:
            # on a further stream (`vocoder_stream`, `encode_launch`): its graphs, its lane
            graphed, lane = slot.graphed, slot.lane
        if voice is None or isinstance(voice, VoiceWeights):
            self._bind(stage, voice, lane)
            return graphed.run(feeds)
        rows_of: dict[VoiceWeights, list[int]] = {}
        for row, each in enumerate(voice):
            rows_of.setdefault(each or self.default_voice, []).append(row)
        if len(rows_of) == 1:
            self._bind(stage, next(iter(rows_of)), lane)
            return graphed.run(feeds)
        lanes = self._bindings[stage].lane_count
        # Voices into grouped calls in turn, a call taking voices while its padded shape has
        # a graph (`lane_shape`) and a lane is free.
        chunks: list[list[tuple[VoiceWeights, list[int]]]] = [[]]
        alone: list[tuple[VoiceWeights, list[int]]] = []
        # (In a steady order, so that the same voices take the same lanes call after call,
        # and their weights are not copied again: `WeightBinding.bind`.)
        for each, rows in sorted(rows_of.items(), key=lambda item: id(item[0])):
            if graphed.lane_shape(2, len(rows)) is None:
                alone.append((each, rows))
                continue
            chunk = chunks[-1]
            most = max([len(rows)] + [len(r) for _, r in chunk])
            if len(chunk) >= lanes or graphed.lane_shape(len(chunk) + 1, most) is None:
                chunks.append(chunk := [])
            chunk.append((each, rows))
        parts: list[tuple[list[int], list[torch.Tensor]]] = []
        for chunk in chunks:
            if len(chunk) < 2:
                alone.extend(chunk)
                continue
            order = [row for _, rows in chunk for row in rows]
            lanes_of = np.concatenate([np.full(len(rows), i) for i, (_, rows) in enumerate(chunk)])
            position = np.concatenate([np.arange(len(rows)) for _, rows in chunk])
            for i, (each, _) in enumerate(chunk):
                self._bind(stage, each, lane=i)
            index = torch.as_tensor(order, device=self.device)
            out = graphed.run_lanes({k: t[index] for k, t in feeds.items()}, lanes_of, position)
            if out is None:  # no graph for this shape while serving: a call per voice
                alone.extend(chunk)
                continue
            parts.append((order, out))
        for each, rows in alone:
            self._bind(stage, each, lane)
            index = torch.as_tensor(rows, device=self.device)
            parts.append((rows, graphed.run({k: t[index] for k, t in feeds.items()})))
        results = [out.new_empty((len(voice), *out.shape[1:])) for out in parts[0][1]]
        for rows, outs in parts:
            index = torch.as_tensor(rows, device=self.device)
            for result, out in zip(results, outs, strict=True):
                result[index] = out
        return results

    # -- tensor API: stays on the device (pipelines and benchmarks) --------------------------

    def _speaker(
        self, inputs: Sequence[str], batch: int, speaker_ids: object
    ) -> dict[str, torch.Tensor]:
        if "sid" not in inputs:
            if speaker_ids is not None and np.any(np.asarray(speaker_ids) != 0):
                raise TorchCudaError("this voice has one speaker; speaker ids must be 0")
            return {}
        sid = (
            torch.as_tensor(np.asarray(speaker_ids), dtype=torch.int64)
            if speaker_ids is not None
            else torch.zeros(batch, dtype=torch.int64)
        )
        return {"sid": sid.to(self.device)}

    def _upload(self, tensor: torch.Tensor) -> torch.Tensor:
        """A host tensor onto the device without waiting for the work queued there (a plain
        copy from pageable memory waits for the stream: the encoder then started only after
        the vocoder calls queued before it had finished and the host had woken up)."""
        if tensor.device == self.device:
            return tensor
        if self.device.type == "cuda":
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _encode_core(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, speaker_ids, voice
    ) -> tuple[list[torch.Tensor], float, float]:
        """The graphed encoder: ([m_p, logs_p, x_mask, logw], length scale, noise scale)."""
        assert self.encoder_stage is not None
        # Padded phonemes: calls repeat shapes, and the uploads of shape-derived indices hit
        # their cache.
        padded = padded_phonemes(ids.shape[1])
        if padded != ids.shape[1]:
            ids = torch.nn.functional.pad(ids, (0, padded - ids.shape[1]))
        self._speaker(self.encoder_input_names, ids.shape[0], speaker_ids)  # refuses ids != 0
        noise_scale, length_scale, noise_w = (float(v) for v in scales.reshape(-1)[:3])
        noise = torch.randn(ids.shape[0], 2, ids.shape[1], device=self.device) * noise_w
        inputs = {
            "ids": self._upload(ids.to(torch.int64)),
            "lengths": self._upload(lengths.to(torch.int64)),
            "noise": noise,
        }
        # FP32, cuDNN timing its algorithms (a graph keeps its capture's kernels).
        with torch.backends.cudnn.flags(enabled=True, benchmark=self.autotune, allow_tf32=False):
            outputs = self._call_outputs("encoder", self.encoder_stage, inputs, voice)
        return outputs, length_scale, noise_scale

    def encode_tensor(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        scales: torch.Tensor,
        speaker_ids=None,
        voice: VoiceWeights | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.encoder_stage is not None:
            (m_p, logs_p, x_mask, logw), length_scale, noise_scale = self._encode_core(
                ids, lengths, scales, speaker_ids, voice
            )
            return acoustic.expand(m_p, logs_p, x_mask, logw, length_scale, noise_scale)
        assert self.encoder is not None
        feeds = {
            "input": ids.to(self.device, torch.int64),
            "input_lengths": lengths.to(self.device, torch.int64),
            "scales": scales.to(self.device, torch.float32),
            **self._speaker(self.encoder_input_names, ids.shape[0], speaker_ids),
        }
        self._bind("encoder", voice)
        prior, mask = self.encoder(**feeds)
        return prior, mask

    @property
    def encodes_beside(self) -> bool:
        """Whether the scheduler launches encoder calls (`encode_launch`) and takes their
        sentences up once their frame counts are on the host, instead of waiting for them: a
        graphed encoder on a GPU with encoder_launch "beside" (on a CUDA stream of its own) or
        "queued" (on the windows' stream)."""
        return self._encoder_stream is not None or self._queued_launches

    @property
    def padded_batch_buckets(self) -> tuple[int, ...]:
        """The batch sizes, ascending, the flow and vocoder calls are padded up to (their CUDA
        graphs' buckets, the same for both); empty where they run eagerly, as long as their
        batch."""
        return self.vocoder_stage.buckets if self.vocoder_stage.use_graphs else ()

    @property
    def encoder_queued(self) -> bool:
        """Whether launched encoder calls run on the windows' own stream, in order with them
        (encoder_launch "queued"): a call with windows queued behind it may be waited
        for without leaving the GPU idle."""
        return self._queued_launches

    @property
    def launches_encoder(self) -> bool:
        """Whether encoder calls can be launched on the windows' stream without waiting for
        their frame counts (a graphed encoder on a GPU): with encoder_launch inline, the
        scheduler launches a step's several encoder calls (one per voice) before it reads any
        of their frame counts, instead of waiting for each in turn."""
        return self.encoder_stage is not None and self.device.type == "cuda"

    @property
    def encoder_calls_in_flight(self) -> int:
        """How many launched encoder calls the scheduler may wait on at once (1 beside; so
        many a stream queued)."""
        if self._queued_launches:
            return QUEUED_ENCODER_CALLS_IN_FLIGHT * self.encoder_streams
        return 1

    @property
    def encoder_streams(self) -> int:
        """The CUDA streams launched encoder calls are spread over, the windows' own
        included (`encoder_streams`)."""
        return 1 + len(self._encoder_slots)

    @property
    def encoder_calls_by_stream(self) -> tuple[int, ...]:
        """The encoder calls each stream has run, the windows' own first."""
        assert self.encoder_stage is not None
        return _calls_by_stream(self.encoder_stage, self._encoder_slots)

    def join_encoder_streams(self) -> None:
        """The windows' stream waits for the encoder calls launched on further streams since
        the last join (a group, `_EncoderGroup`), and the next call launched starts a new
        group: a caller queues this before a call of another stage (the stage calls here do
        it themselves), before that call's timing starts."""
        group, self._encoder_group = self._encoder_group, None
        if group is None:
            return
        current = torch.cuda.current_stream(self.device)
        for turn in group.turns:
            if turn:
                current.wait_stream(self._encoder_slots[turn - 1].stream)

    def _encoder_slot(self, rows: int, current: torch.cuda.Stream) -> _StreamSlot | None:
        """The further stream an encoder call of `rows` sentences launched now takes, None
        for the windows' own: calls launched one after another (a group) take the streams
        in turn from the windows' own, a call of more than ENCODER_SPREAD_MAX_ROWS the
        windows' own; every call of a group on a further stream starts after the windows
        queued before the group (its `start`)."""
        if not self._encoder_slots:
            return None
        group = self._encoder_group
        if group is None:
            start = torch.cuda.Event()
            start.record(current)
            group = self._encoder_group = _EncoderGroup(start)
            self._encoder_turn = 0
        turn = 0
        if rows <= ENCODER_SPREAD_MAX_ROWS:
            turn = self._encoder_turn
            self._encoder_turn = (turn + 1) % self.encoder_streams
        group.turns.add(turn)
        if not turn:
            return None
        slot = self._encoder_slots[turn - 1]
        slot.stream.wait_event(group.start)
        return slot

    def encode_launch(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        scales: torch.Tensor,
        speaker_ids=None,
        voice: VoiceWeights | None = None,
    ) -> EncoderCall:
        """`encode_tensor` queued on the encoder's own CUDA stream, beside the flow and vocoder
        calls queued on the current one (or, queued, on the current one behind them): its frame
        counts reach the host without the host waiting for them, and `EncoderCall.finish()`
        queues the rest behind it (see `EncoderCall`)."""
        stream = self._encoder_stream
        slot = None
        if stream is None and self.launches_encoder:
            # Queued or inline: on the windows' own stream, behind what is queued there, or
            # on a further one beside it (`encoder_streams`).
            stream = torch.cuda.current_stream(self.device)
            slot = self._encoder_slot(ids.shape[0], stream)
        if stream is None:
            raise TorchCudaError("the scheduler launches encoder calls only for a CUDA graph")
        group = self._encoder_group
        if slot is not None:
            stream = slot.stream
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # (on a further stream, its graphs and its lane: `_call_outputs`)
        place = self._running_on(slot) if slot is not None else torch.cuda.stream(stream)
        with place:
            start.record(stream)
            (m_p, logs_p, x_mask, logw), length_scale, noise_scale = self._encode_core(
                ids, lengths, scales, speaker_ids, voice
            )
            w_ceil, y_lengths = acoustic.durations(logw, x_mask, length_scale)
            host = torch.empty(y_lengths.shape, dtype=y_lengths.dtype, pin_memory=True)
            host.copy_(y_lengths, non_blocking=True)
            end.record(stream)
        return EncoderCall(
            (m_p, logs_p, x_mask, w_ceil, y_lengths), host, noise_scale, start, end, group
        )

    def flow_tensor(
        self,
        prior: torch.Tensor,
        mask: torch.Tensor,
        speaker_ids=None,
        voice: VoiceWeights | Sequence[VoiceWeights | None] | None = None,
    ) -> torch.Tensor:
        dtype = self.flow_module.float_dtype
        feeds = {"prior": prior.to(self.device, dtype), "mask": mask.to(self.device, dtype)}
        feeds.update(self._speaker(self.flow_module.input_names, prior.shape[0], speaker_ids))
        return self._call("flow", self.flow_stage, feeds, voice)

    def vocode_tensor(
        self,
        latent: torch.Tensor,
        speaker_ids=None,
        voice: VoiceWeights | Sequence[VoiceWeights | None] | None = None,
    ) -> torch.Tensor:
        dtype = self.vocoder_module.float_dtype
        feeds = {"latent": latent.to(self.device, dtype)}
        feeds.update(self._speaker(self.vocoder_module.input_names, latent.shape[0], speaker_ids))
        audio = self._call("vocoder", self.vocoder_stage, feeds, voice)
        return audio.reshape(audio.shape[0], -1)

    # -- StageRuntime (numpy in, numpy out) ---------------------------------------------------

    def encode(self, ids, lengths, scales, speaker_ids=None, voice=None):
        prior, mask = self.encode_tensor(
            torch.from_numpy(np.ascontiguousarray(ids)),
            torch.from_numpy(np.ascontiguousarray(lengths)),
            torch.from_numpy(np.asarray(scales, dtype=np.float32)),
            speaker_ids,
            voice,
        )
        return _to_numpy(prior), _to_numpy(mask)

    def flow(self, prior, mask, speaker_ids=None, voice=None):
        latent = self.flow_tensor(
            torch.from_numpy(prior), torch.from_numpy(mask), speaker_ids, voice
        )
        return _to_numpy(latent)

    def vocode(self, latent, speaker_ids=None, voice=None):
        return _to_numpy(self.vocode_tensor(torch.from_numpy(latent), speaker_ids, voice))

    @property
    def flow_dtype(self) -> torch.dtype:
        return self.flow_module.float_dtype

    @property
    def vocoder_dtype(self) -> torch.dtype:
        return self.vocoder_module.float_dtype

    def stream_backend(self) -> Any:
        """Frame stores on this GPU for the stream model (engines/runtimes/device_frames.py)."""
        from engines.runtimes.device_frames import DeviceBackend

        return DeviceBackend(self)

    def warmup_report(self) -> dict[str, Any]:
        """By stage: graphs captured, the seconds the warmup spent on them, and whether cuDNN
        autotuned them (AUTOTUNED_STAGES) from how many rows (AUTOTUNE_MIN_ROWS); the
        encoder's also what its text part runs at (`encoder_precision`)."""
        stages = {"encoder": self.encoder_stage, "flow": self.flow_stage}
        stages["vocoder"] = self.vocoder_stage
        report: dict[str, dict[str, Any]] = {
            name: {
                "graphs": len(stage.graphs),
                "seconds": round(self._warmup_seconds.get(name, 0.0), 2),
                "autotuned": bool(stage.autotune),
                "autotuned_from_rows": stage.autotune_min_rows if stage.autotune else None,
            }
            for name, stage in stages.items()
            if stage is not None
        }
        if "encoder" in report:
            report["encoder"]["precision"] = self.encoder_precision
        for name, slots, most in (
            ("vocoder", self._vocoder_slots, SPREAD_MAX_ROWS),
            ("encoder", self._encoder_slots, ENCODER_SPREAD_MAX_ROWS),
        ):
            if slots:
                report[f"{name}-streams"] = {
                    "streams": 1 + len(slots),
                    "graphs": sum(len(slot.graphed.graphs) for slot in slots),
                    "seconds": round(self._warmup_seconds.get(f"{name}-streams", 0.0), 2),
                    "max_rows": most,
                }
        for name, stage in stages.items():
            if stage is None or not stage.lane_graphs:
                continue
            tuned = bool(stage.autotune if stage.lane_autotune is None else stage.lane_autotune)
            report[f"{name}-lanes"] = {
                "graphs": len(stage.lane_graphs),
                "seconds": round(self._warmup_seconds.get(f"{name}-lanes", 0.0), 2),
                "autotuned": tuned,
                # (lanes times rows a lane, as a plain graph's rows)
                "autotuned_from_rows": stage.autotune_min_rows if tuned else None,
            }
        return report

    def stop_capturing(self) -> None:
        """From now on a call of a shape without a graph runs eagerly rather than capturing
        one: a pod that serves must not stall every stream for a capture. Its warmup captured
        the shapes nearly every call has (`StreamScheduler.warmup`); the rare ones (the longest
        sentences) launch their kernels one by one."""
        for stage in self._graphed_stages():
            stage.capture_on_use = False

    def _graphed_stages(self) -> list[GraphedStage]:
        stages = [self.flow_stage, self.vocoder_stage, self.encoder_stage]
        stages += [slot.graphed for slot in self._vocoder_slots + self._encoder_slots]
        return [stage for stage in stages if stage is not None]

    def graph_count(self) -> int:
        return sum(len(stage.graphs) + len(stage.lane_graphs) for stage in self._graphed_stages())

    def static_buffer_bytes(self) -> int:
        return sum(stage.buffers.nbytes() for stage in self._graphed_stages())

    def warmup(
        self,
        flow_frames: Sequence[int] | Mapping[int, int],
        vocoder_frames: Sequence[int],
        batches: Sequence[int] | None = None,
        encoder_phonemes: Sequence[int] = (),
        max_batch: int | None = None,
        max_sentences: int | None = None,
    ) -> int:
        """Capture the graphs of these shapes now rather than on first use; returns how many
        graphs the runtime holds.

        Batches are every bucket up to the one holding `max_batch` windows (`max_sentences`
        sentences for the encoder), or `batches` when given; `flow_frames` may map a width to
        a batch limit of its own (the whole-sentence flow's, `max_sentences`). The vocoder,
        whose calls take the most memory, goes first, and every stage's shapes largest first:
        the graphs captured later reuse the memory the first ones left free in the pool."""
        buckets = self.flow_stage.buckets

        def up_to(limit: int | None) -> list[int]:
            if batches is not None:
                return sorted(batches, reverse=True)
            top = bucket_for(limit or buckets[-1], buckets)
            return sorted((b for b in buckets if b <= top), reverse=True)

        channels = 192
        clock = _StageClock(self.device, self._warmup_seconds)

        def warm_vocoder(most_rows: int | None) -> None:
            for frames in sorted(vocoder_frames, reverse=True):
                for batch in up_to(max_batch):
                    if most_rows is None or batch <= most_rows:
                        latent = torch.zeros(batch, channels, frames, device=self.device)
                        self.vocode_tensor(latent)

        warm_vocoder(None)
        clock.lap("vocoder")
        if self.vocoder_stage.lane_function is not None:
            self._warm_lanes(self.vocoder_stage, vocoder_frames, max_batch)
            clock.lap("vocoder-lanes")
        for slot in self._vocoder_slots:
            with self._running_on(slot):  # the slot's own graphs
                warm_vocoder(SPREAD_MAX_ROWS)
            torch.cuda.current_stream(self.device).wait_stream(slot.stream)
        if self._vocoder_slots:
            clock.lap("vocoder-streams")
        flow_limits = (
            dict(flow_frames)
            if isinstance(flow_frames, Mapping)
            else dict.fromkeys(flow_frames, max_batch)
        )
        for frames in sorted(flow_limits, reverse=True):
            for batch in up_to(flow_limits[frames]):
                prior = torch.zeros(batch, channels, frames, device=self.device)
                self.flow_tensor(prior, torch.ones(batch, 1, frames, device=self.device))
        clock.lap("flow")
        if self.encoder_stage is not None:
            encoder_buckets = self.encoder_stage.buckets
            top = bucket_for(max_sentences or encoder_buckets[-1], encoder_buckets)
            scales = torch.tensor([0.667, 1.0, 0.8])

            def warm_encoder(most_rows: int) -> None:
                rows = sorted((b for b in encoder_buckets if b <= most_rows), reverse=True)
                for phonemes in sorted(encoder_phonemes, reverse=True):
                    for batch in rows:
                        ids = torch.full((batch, phonemes), 20, dtype=torch.int64)
                        self.encode_tensor(ids, torch.full((batch,), phonemes), scales)

            warm_encoder(top)
            clock.lap("encoder")
            for slot in self._encoder_slots:
                with self._running_on(slot):  # the slot's own graphs
                    warm_encoder(min(top, ENCODER_SPREAD_MAX_ROWS))
                torch.cuda.current_stream(self.device).wait_stream(slot.stream)
            if self._encoder_slots:
                clock.lap("encoder-streams")
            if self.encoder_stage.lane_function is not None:
                self._warm_lanes(self.encoder_stage, list(encoder_phonemes), max_sentences)
                clock.lap("encoder-lanes")
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # cuDNN's autotuning and the eager parts' first calls leave blocks cached in the
            # allocator: hand them back, so that what the pod reports as used is what it uses.
            torch.cuda.empty_cache()
        return self.graph_count()

    def _warm_lanes(
        self, graphed: GraphedStage, frames: Sequence[int], max_batch: int | None
    ) -> None:
        """Capture a stage's grouped calls: every lane bucket, every row bucket up to
        `max_lane_rows` (and `max_batch`), for each of these widths."""
        rows = [
            b
            for b in graphed.buckets
            if b <= graphed.max_lane_rows and b <= bucket_for(max_batch or b, graphed.buckets)
        ]
        for width in sorted(frames, reverse=True):
            for lanes in sorted(graphed.lane_buckets, reverse=True):
                for count in sorted(rows, reverse=True):
                    graphed.run_lanes(
                        self._lane_feeds(graphed, lanes * count, width),
                        np.repeat(np.arange(lanes), count),
                        np.tile(np.arange(count), lanes),
                    )

    def _lane_feeds(self, graphed: GraphedStage, rows: int, width: int) -> dict[str, torch.Tensor]:
        """A grouped warmup call's inputs: `rows` sentences of `width` phonemes (the encoder),
        or `rows` latent windows of `width` frames (the vocoder)."""
        if graphed is self.encoder_stage:
            width = padded_phonemes(width)
            return {
                "ids": torch.full((rows, width), 20, device=self.device),
                "lengths": torch.full((rows,), width, device=self.device),
                "noise": torch.zeros(rows, 2, width, device=self.device),
            }
        feeds = {
            "latent": torch.zeros(rows, 192, width, device=self.device, dtype=self.vocoder_dtype)
        }
        feeds.update(self._speaker(self.vocoder_module.input_names, rows, None))
        return feeds


def _lane_function(holder: Any, function: StageFunction, binding: WeightBinding) -> StageFunction:
    """A stage's call over lanes: inputs [lanes, rows, ...], each lane's rows against the
    weights bound to that lane (`WeightBinding.lane_tensors`), as one call: `torch.func.vmap`
    over the voice axis makes each convolution a grouped one and each matrix product a
    batched one. The modules read the first lane's weights again afterwards.

    A module that runs its 1-D convolutions on channels-last rows (FP16 on a GPU) runs them
    as plain ones here: vmap cannot lay a batched tensor out channels-last. The weights'
    rows form is the same memory, read through its plain view."""

    def grouped(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        lanes = next(iter(inputs.values())).shape[0]
        weights = {name: tensor[:lanes] for name, tensor in binding.lane_tensors.items()}

        def one(own: dict[str, torch.Tensor], feeds: dict[str, torch.Tensor]) -> tuple:
            holder.use_weights(own)
            return tuple(function(feeds))

        rows_layout = bool(getattr(holder, "channels_last", False))
        if rows_layout:
            holder.channels_last = False
        try:
            return list(torch.func.vmap(one)(weights, inputs))
        finally:
            holder.use_weights(binding.tensors)
            if rows_layout:
                holder.channels_last = True

    return grouped


def _calls_by_stream(main: GraphedStage, slots: Sequence[_StreamSlot]) -> tuple[int, ...]:
    """The calls a stage ran on the windows' stream (`main`), then on each further one."""
    stages = [main] + [slot.graphed for slot in slots]
    return tuple(sum(stage.batch_histogram.values()) for stage in stages)


def _weights_function(
    holder: Any,
    function: StageFunction,
    tensors: Mapping[str, torch.Tensor],
    bound: Mapping[str, torch.Tensor],
) -> StageFunction:
    """A stage's call that reads `tensors` (a further lane's views) for its weights: what a
    graph captured from it reads whoever's weights are in that lane. The modules read `bound`
    again afterwards."""

    def run(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        holder.use_weights(tensors)
        try:
            return list(function(inputs))
        finally:
            holder.use_weights(bound)

    return run


class _StageClock:
    """Wall seconds between laps, the device's queued work included, into `seconds` by name."""

    def __init__(self, device: torch.device, seconds: dict[str, float]) -> None:
        self._device, self._seconds = device, seconds
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
        now = time.perf_counter()
        self._seconds[name] = self._seconds.get(name, 0.0) + now - self._last
        self._last = now


def _check_entry(engine_dir: Path) -> None:
    missing = [s for s in STAGES if not (engine_dir / f"{s}.onnx").is_file()]
    if missing:
        raise TorchCudaError(
            f"{engine_dir} has no {', '.join(f'{s}.onnx' for s in missing)}; build it with "
            "`voxfleet build-engines --runtime torch-cuda`"
        )


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy()


StageCall = Callable[[dict[str, torch.Tensor]], torch.Tensor]
