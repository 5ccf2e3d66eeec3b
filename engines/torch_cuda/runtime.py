"""`TorchCudaStages`: the `StageRuntime` of the torch-cuda engines.

- encoder (text encoder + stochastic duration predictor): FP32, its fixed-shape core
  replayed from CUDA graphs. Its output length depends on the predicted durations (a device
  read per call), and FP16 or TF32 there moves frame boundaries (``ceil`` of durations).
  VOXFLEET_ENCODER_TF32=1 and VOXFLEET_ENCODER_COMPILE=1 (off by default) capture the core
  with TF32 allowed and compiled by torch.compile: on the H100 2.2 times faster alone, but
  through Triton the encoder call's time is mostly the host's (docs/history.md). With the
  plan's `encoder_launch` "beside" (`batching.encoderLaunch` of a TTSVoice; "inline" by
  default) `encode_launch` runs it on a CUDA stream of its own (its graphs in a memory pool
  of their own), and with "queued" on the windows' stream behind them, so that the stream
  model can go on launching windows while it runs; otherwise its graphs share the flow's and
  vocoder's pool. VOXFLEET_ENCODER_BESIDE=0, 1 or queued overrides the plan (A/B runs).
- flow and vocoder: the entry's precision (FP16 by default). Their calls come from the
  stream model as batches of fixed-size windows, so each call is padded up to a batch bucket
  (1, 2, 4, ..., 256) and replayed from a CUDA graph captured once per (bucket, frames):
  hundreds of small kernel launches become one graph launch. In FP16 their 1-D convolutions
  run as channels-last 2-D ones (engines.torch_cuda.convert, VOXFLEET_CONV_CHANNELS_LAST).
  VOXFLEET_VOCODER_COMPILE=1 (off by default) runs the vocoder as
  engines.torch_cuda.vocoder.VocoderCore compiled by torch.compile, its element-wise work fused.

Weights are the stage ONNX files' initializers (engines.torch_cuda.convert).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engines.torch_cuda import acoustic, encoder_launch_mode, vocoder
from engines.torch_cuda.acoustic import EncoderCore
from engines.torch_cuda.convert import OnnxModule

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
# VOXFLEET_ENCODER_BANDED=0: the encoder's relative attention over all 2L - 1 relative
# positions, as the ONNX graph computes it (the earlier form, for A/B measurements).
BANDED_ENV = "VOXFLEET_ENCODER_BANDED"
# VOXFLEET_ENCODER_COMPILE=1: the encoder core compiled by torch.compile (inductor, dynamic
# shapes: one compile for every batch bucket and phoneme count) before its CUDA graphs are
# captured. VOXFLEET_ENCODER_TF32=1: the core's graphs captured with TF32 convolutions and
# matrix products allowed (some frame boundaries move: durations are ceil()ed).
COMPILE_ENV = "VOXFLEET_ENCODER_COMPILE"
TF32_ENV = "VOXFLEET_ENCODER_TF32"
# VOXFLEET_VOCODER_COMPILE=1 (off by default): on a GPU, the vocoder runs as
# engines.torch_cuda.vocoder.VocoderCore compiled by torch.compile (inductor, dynamic shapes:
# one compile for every batch bucket and window width) before its CUDA graphs are captured,
# instead of the node-by-node port. Voices whose vocoder it does not reproduce keep the port
# (logged).
VOCODER_COMPILE_ENV = "VOXFLEET_VOCODER_COMPILE"
LOGGER = logging.getLogger(__name__)


class TorchCudaError(RuntimeError):
    """The torch-cuda runtime cannot run here or was asked for something it cannot do."""


@contextlib.contextmanager
def encoder_arithmetic(tf32: bool) -> Iterator[None]:
    """The encoder core's arithmetic for the calls (and graph captures) inside: cuDNN timing
    its algorithms, and TF32 convolutions and matrix products only with `tf32` (durations
    are ceil()ed, so TF32 moves some frame boundaries; a graph keeps its capture's kernels)."""
    with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=tf32):
        if not tf32:
            yield
            return
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before


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


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: list[torch.Tensor]


StageFunction = Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]


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
        self.pool = pool
        self.graphs: dict[tuple[int, tuple[tuple[int, ...], ...]], _Captured] = {}
        self.batch_histogram: dict[int, int] = {}
        self._lock = threading.Lock()

    def _transfers(self) -> int:
        return self.module.transfers if self.module is not None else 0

    def _capture(self, bucket: int, inputs: dict[str, torch.Tensor]) -> _Captured:
        static = {
            name: torch.zeros((bucket, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
            for name, tensor in inputs.items()
        }
        side = torch.cuda.Stream(device=self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # cuDNN picks its algorithms here, outside the capture
                self.function(static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        transfers = self._transfers()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = self.function(static)
        if self._transfers() != transfers:
            raise TorchCudaError("the stage moved values between host and device while captured")
        return _Captured(graph=graph, inputs=static, outputs=list(outputs))

    def __call__(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.run(inputs)[0]

    def run(self, inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        frames = next(iter(inputs.values())).shape[-1]
        padded = -(-frames // self.frame_multiple) * self.frame_multiple
        if padded == frames:
            return self._run(inputs)
        outputs = self._run(
            {
                name: torch.nn.functional.pad(t, (0, padded - frames)) if t.dim() == 3 else t
                for name, t in inputs.items()
            }
        )
        cut = []
        for output in outputs:
            per_frame = output.shape[-1] // padded
            cut.append(output[..., : frames * per_frame])
        return cut

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
                if len(self.graphs) >= self.max_graphs:
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
    ) -> None:
        self._tensors = tensors  # m_p, logs_p, x_mask, w_ceil, y_lengths (device)
        self._lengths = lengths  # y_lengths in pinned host memory, once `end` is reached
        self._noise_scale = noise_scale
        self._events = (start, end)

    def done(self) -> bool:
        return bool(self._events[1].query())

    def seconds(self) -> float:
        start, end = self._events
        end.synchronize()
        return start.elapsed_time(end) / 1000.0

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


class TorchCudaStages:
    """Encoder, flow and vocoder on one CUDA device (see the module docstring)."""

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
    ) -> None:
        engine_dir = Path(engine_dir)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise TorchCudaError(
                "the torch-cuda runtime needs a CUDA GPU and PyTorch built with CUDA; "
                f"this PyTorch ({torch.__version__}) sees none"
            )
        self.precision = precision or _read_precision(engine_dir)
        if self.precision not in DTYPES:
            raise TorchCudaError(
                f"the torch-cuda runtime runs fp16 or fp32, not {self.precision!r}"
            )
        dtype = DTYPES[self.precision]
        if self.device.type == "cuda":
            # Every graph is captured for one fixed shape: let cuDNN time its algorithms.
            torch.backends.cudnn.benchmark = True
        if self.precision == "fp32" and self.device.type == "cuda":
            # TF32 matrix units would make "fp32" 1e-3-accurate, not fp32-accurate.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        missing = [
            s for s in ("encoder", "flow", "vocoder") if not (engine_dir / f"{s}.onnx").is_file()
        ]
        if missing:
            raise TorchCudaError(
                f"{engine_dir} has no {', '.join(f'{s}.onnx' for s in missing)}; build it with "
                "`voxfleet build-engines --runtime torch-cuda`"
            )
        self.encoder = OnnxModule(engine_dir / "encoder.onnx", self.device, torch.float32)
        pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" and use_graphs else None
        # The encoder's fixed-shape part as torch modules, graphed per (batch, phonemes); the
        # node-by-node port stays for graphs without the Piper weight names (multi-speaker).
        self.encoder_core: EncoderCore | None = None
        self.encoder_stage: GraphedStage | None = None
        try:
            self.encoder_core = acoustic.from_onnx(
                engine_dir / "encoder.onnx",
                self.device,
                banded=os.environ.get(BANDED_ENV, "1") != "0",
            )
        except acoustic.NotPiperVits:
            pass
        try:
            launched = encoder_launch_mode(encoder_launch)
        except ValueError as error:
            raise TorchCudaError(str(error)) from None
        if self.encoder_core is None or self.device.type != "cuda":
            launched = "inline"  # only a graphed encoder on a GPU is launched
        beside = launched == "beside"
        self._queued_launches = launched == "queued"
        self._encoder_tf32 = os.environ.get(TF32_ENV, "0") == "1"
        self._compiled = False
        if self.encoder_core is not None:
            core: Callable[..., Any] = self.encoder_core
            if os.environ.get(COMPILE_ENV, "0") == "1" and self.device.type == "cuda":
                core = torch.compile(core, dynamic=True)
                self._compiled = True

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
        compiled_vocoder = self._compiled_vocoder(engine_dir / "vocoder.onnx")
        self.vocoder_compiled = compiled_vocoder is not None
        self._compiled |= self.vocoder_compiled
        self.vocoder_stage = GraphedStage(
            self.vocoder_module,
            batch_buckets,
            use_graphs,
            pool=pool,
            frame_multiple=vocoder_frame_multiple,
            function=compiled_vocoder,
        )
        self.multi_speaker = "sid" in self.encoder.input_names

    def _compiled_vocoder(self, path: Path) -> StageFunction | None:
        """The vocoder as a compiled `VocoderCore` with VOXFLEET_VOCODER_COMPILE=1 on a GPU
        (None: the node-by-node port), checked against the port before it is used."""
        if os.environ.get(VOCODER_COMPILE_ENV, "0") != "1" or self.device.type != "cuda":
            return None
        module = self.vocoder_module
        try:
            core = vocoder.from_onnx(path, self.device, module.float_dtype, module.channels_last)
            vocoder.check(core, module, self.device)
        except vocoder.NotPiperGenerator as error:
            LOGGER.warning(
                "%s=1: %s keeps the node-by-node vocoder: %s", VOCODER_COMPILE_ENV, path, error
            )
            return None
        compiled = torch.compile(core, dynamic=True)

        def function(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
            return [compiled(inputs["latent"])]

        return function

    # -- tensor API: stays on the device (pipelines and benchmarks) --------------------------

    def _speaker(
        self, module: OnnxModule, batch: int, speaker_ids: object
    ) -> dict[str, torch.Tensor]:
        if "sid" not in module.input_names:
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
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, speaker_ids
    ) -> tuple[list[torch.Tensor], float, float]:
        """The graphed encoder: ([m_p, logs_p, x_mask, logw], length scale, noise scale)."""
        assert self.encoder_stage is not None
        # Padded phonemes: calls repeat shapes, and the uploads of shape-derived indices hit
        # their cache.
        padded = padded_phonemes(ids.shape[1])
        if padded != ids.shape[1]:
            ids = torch.nn.functional.pad(ids, (0, padded - ids.shape[1]))
        self._speaker(self.encoder, ids.shape[0], speaker_ids)  # refuses speaker ids != 0
        noise_scale, length_scale, noise_w = (float(v) for v in scales.reshape(-1)[:3])
        noise = torch.randn(ids.shape[0], 2, ids.shape[1], device=self.device) * noise_w
        inputs = {
            "ids": self._upload(ids.to(torch.int64)),
            "lengths": self._upload(lengths.to(torch.int64)),
            "noise": noise,
        }
        with encoder_arithmetic(self._encoder_tf32):  # FP32 unless VOXFLEET_ENCODER_TF32=1
            outputs = self.encoder_stage.run(inputs)
        return outputs, length_scale, noise_scale

    def encode_tensor(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, speaker_ids=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.encoder_stage is not None:
            (m_p, logs_p, x_mask, logw), length_scale, noise_scale = self._encode_core(
                ids, lengths, scales, speaker_ids
            )
            return acoustic.expand(m_p, logs_p, x_mask, logw, length_scale, noise_scale)
        feeds = {
            "input": ids.to(self.device, torch.int64),
            "input_lengths": lengths.to(self.device, torch.int64),
            "scales": scales.to(self.device, torch.float32),
            **self._speaker(self.encoder, ids.shape[0], speaker_ids),
        }
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
    def encoder_calls_in_flight(self) -> int:
        """How many launched encoder calls the scheduler may wait on at once (1 beside)."""
        return QUEUED_ENCODER_CALLS_IN_FLIGHT if self._queued_launches else 1

    def encode_launch(
        self, ids: torch.Tensor, lengths: torch.Tensor, scales: torch.Tensor, speaker_ids=None
    ) -> EncoderCall:
        """`encode_tensor` queued on the encoder's own CUDA stream, beside the flow and vocoder
        calls queued on the current one (or, queued, on the current one behind them): its frame
        counts reach the host without the host waiting for them, and `EncoderCall.finish()`
        queues the rest behind it (see `EncoderCall`)."""
        stream = self._encoder_stream
        if stream is None and self._queued_launches:
            stream = torch.cuda.current_stream(self.device)
        if stream is None:
            raise TorchCudaError(
                "the scheduler launches encoder calls only for a CUDA graph, with "
                "encoder_launch beside or queued"
            )
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record(stream)
            (m_p, logs_p, x_mask, logw), length_scale, noise_scale = self._encode_core(
                ids, lengths, scales, speaker_ids
            )
            w_ceil, y_lengths = acoustic.durations(logw, x_mask, length_scale)
            host = torch.empty(y_lengths.shape, dtype=y_lengths.dtype, pin_memory=True)
            host.copy_(y_lengths, non_blocking=True)
            end.record(stream)
        return EncoderCall((m_p, logs_p, x_mask, w_ceil, y_lengths), host, noise_scale, start, end)

    def flow_tensor(
        self, prior: torch.Tensor, mask: torch.Tensor, speaker_ids=None
    ) -> torch.Tensor:
        dtype = self.flow_module.float_dtype
        feeds = {"prior": prior.to(self.device, dtype), "mask": mask.to(self.device, dtype)}
        feeds.update(self._speaker(self.flow_module, prior.shape[0], speaker_ids))
        return self.flow_stage(feeds)

    def vocode_tensor(self, latent: torch.Tensor, speaker_ids=None) -> torch.Tensor:
        dtype = self.vocoder_module.float_dtype
        feeds = {"latent": latent.to(self.device, dtype)}
        feeds.update(self._speaker(self.vocoder_module, latent.shape[0], speaker_ids))
        audio = self.vocoder_stage(feeds)
        return audio.reshape(audio.shape[0], -1)

    # -- StageRuntime (numpy in, numpy out) ---------------------------------------------------

    def encode(self, ids, lengths, scales, speaker_ids=None):
        prior, mask = self.encode_tensor(
            torch.from_numpy(np.ascontiguousarray(ids)),
            torch.from_numpy(np.ascontiguousarray(lengths)),
            torch.from_numpy(np.asarray(scales, dtype=np.float32)),
            speaker_ids,
        )
        return _to_numpy(prior), _to_numpy(mask)

    def flow(self, prior, mask, speaker_ids=None):
        latent = self.flow_tensor(torch.from_numpy(prior), torch.from_numpy(mask), speaker_ids)
        return _to_numpy(latent)

    def vocode(self, latent, speaker_ids=None):
        return _to_numpy(self.vocode_tensor(torch.from_numpy(latent), speaker_ids))

    @property
    def flow_dtype(self) -> torch.dtype:
        return self.flow_module.float_dtype

    @property
    def vocoder_dtype(self) -> torch.dtype:
        return self.vocoder_module.float_dtype

    def stream_backend(self) -> Any:
        """Frame stores on this GPU for the stream model (engines/torch_cuda/backend.py)."""
        from engines.torch_cuda.backend import DeviceBackend

        return DeviceBackend(self)

    def warmup(
        self,
        flow_frames: Sequence[int],
        vocoder_frames: Sequence[int],
        batches: Sequence[int] | None = None,
        encoder_phonemes: Sequence[int] = (),
        max_batch: int | None = None,
        max_sentences: int | None = None,
    ) -> int:
        """Capture the graphs of these shapes now rather than on first use; returns a count.

        Batches are every bucket up to the one holding `max_batch` windows (`max_sentences`
        sentences for the encoder), or `batches` when given.
        """
        if batches is None:
            top = bucket_for(max_batch or self.flow_stage.buckets[-1], self.flow_stage.buckets)
            batches = [b for b in self.flow_stage.buckets if b <= top]
        if self.encoder_stage is not None:
            encoder_buckets = self.encoder_stage.buckets
            top = bucket_for(max_sentences or encoder_buckets[-1], encoder_buckets)
            scales = torch.tensor([0.667, 1.0, 0.8])
            for phonemes in encoder_phonemes:
                for batch in (b for b in encoder_buckets if b <= top):
                    ids = torch.full((batch, phonemes), 20, dtype=torch.int64)
                    self.encode_tensor(ids, torch.full((batch,), phonemes), scales)
        channels = 192
        for frames in flow_frames:
            for batch in batches:
                prior = torch.zeros(batch, channels, frames, device=self.device)
                self.flow_tensor(prior, torch.ones(batch, 1, frames, device=self.device))
        for frames in vocoder_frames:
            for batch in batches:
                self.vocode_tensor(torch.zeros(batch, channels, frames, device=self.device))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            # cuDNN's autotuning tries algorithms with large workspaces; hand the cached
            # blocks back so that other processes on this GPU (another voice) can load.
            torch.cuda.empty_cache()
        if self._compiled and encoder_phonemes:
            # The stream model's shapes are captured: inductor's compile workers (a process
            # per core) are not needed again. (Its warmup of the sentence flow alone compiles
            # nothing.)
            from torch._inductor import async_compile

            async_compile.shutdown_compile_workers()
        encoder_graphs = len(self.encoder_stage.graphs) if self.encoder_stage else 0
        return len(self.flow_stage.graphs) + len(self.vocoder_stage.graphs) + encoder_graphs


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to(torch.float32).cpu().numpy()


StageCall = Callable[[dict[str, torch.Tensor]], torch.Tensor]
