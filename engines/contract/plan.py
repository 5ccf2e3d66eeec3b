"""The serving plan: everything that decides how one voice is served, as one typed value.

The operator builds it with one pure function from (TTSVoice spec, pool, engine key)
(`voxfleet_operator.serving_plan`); the engine-build Job receives it, so TensorRT profiles
follow the voice's own windows and batch sizes; the stream model reads it when Triton loads
the voice. JSON (`to_json`/`from_json`) is the only form it travels in. `voxfleet serve`
builds the same plan for local voices.

The runtime registry lives here too: what each stage runtime is called, which precisions it
builds (the first is its default), whether it needs a GPU, and where its loader and builder
are. The CLI, `build-engines`, `serve`, the operator and the chart all read it.

This module imports nothing of the project and no numpy, torch or kopf: the operator and the
chart's generator import it without the data plane's dependencies.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from functools import cached_property
from typing import Any

# -- runtimes ---------------------------------------------------------------------------

PRECISIONS = ("fp32", "fp16", "int8")
CPU, GPU = "cpu", "gpu"

# What the encoder's text part runs at (`WindowConfig.encoder_precision`): "fp32", the voice's
# own audio, by default; "fp16" or "bf16" on the torch-cuda runtime's graphed encoder, about
# 1.5 times as fast on an H200 but not the same audio: a phoneme in about a thousand (FP16) is
# a frame longer or shorter, and the rest of the audio is about 31 dB (FP16) or 15 dB (BF16)
# from FP32's (docs/gpu.md). The duration predictor always runs in FP32.
ENCODER_PRECISIONS = ("fp32", "fp16", "bf16")


@dataclass(frozen=True)
class RuntimeInfo:
    """One stage runtime: who executes the encoder, flow and vocoder graphs."""

    name: str
    precisions: tuple[str, ...]  # the first is the default
    device: str  # CPU or GPU
    loader: str  # "module:attribute" of the factory(engine_dir, windows) -> StageRuntime
    builder: str  # "module:attribute" of the engine build, see engines/build/engine_build.py
    description: str
    # Whether the built artifacts depend on the call shapes (TensorRT's profiles).
    shaped: bool = False
    # What the encoder's text part may run at (`WindowConfig.encoder_precision`); the first is
    # the default, the voice's own audio.
    encoder_precisions: tuple[str, ...] = ("fp32",)

    @property
    def default_precision(self) -> str:
        return self.precisions[0]

    @property
    def needs_gpu(self) -> bool:
        return self.device == GPU


RUNTIMES: dict[str, RuntimeInfo] = {
    info.name: info
    for info in (
        RuntimeInfo(
            name="onnxruntime",
            precisions=("fp32",),
            device=CPU,
            loader="engines.runtimes.onnx:load_onnx",
            builder="engines.build.engine_build:split_stages",
            description="onnxruntime on the CPU; every machine",
        ),
        RuntimeInfo(
            name="torch-cuda",
            precisions=("fp16", "fp32"),
            device=GPU,
            loader="engines.runtimes.torch_cuda:load",
            builder="engines.build.engine_build:split_stages_for_torch",
            description="PyTorch on a CUDA GPU (FP16, CUDA graphs)",
            encoder_precisions=ENCODER_PRECISIONS,
        ),
        RuntimeInfo(
            name="tensorrt",
            precisions=("fp16", "fp32", "int8"),
            device=GPU,
            loader="engines.runtimes.tensorrt.stages:load",
            builder="engines.runtimes.tensorrt.build:build_entry",
            description="TensorRT plans, in NVIDIA's TensorRT and Triton images",
            shaped=True,
        ),
    )
}
RUNTIME_NAMES = tuple(RUNTIMES)


def runtime_info(name: str) -> RuntimeInfo:
    """The registered runtime `name`; ValueError naming the choices otherwise."""
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(
            f"unknown runtime {name!r}; choose one of {', '.join(RUNTIME_NAMES)}"
        ) from None


def check_mps(runtime: str, setting: str) -> None:
    """ValueError where MPS (`setting`: `voxfleet serve --mps`, a pool's `mps`) is asked of a
    runtime that runs on the CPU (engines/pod/mps.py shares a GPU between backend processes)."""
    if not runtime_info(runtime).needs_gpu:
        raise ValueError(
            f"{setting} shares a GPU between backend processes; the {runtime} runtime runs on "
            "the CPU"
        )


def check_precision(runtime: str, precision: str) -> None:
    """ValueError unless `runtime` builds `precision` engines, naming what it builds."""
    info = runtime_info(runtime)
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if precision not in info.precisions:
        raise ValueError(
            f"runtime {runtime} does not build {precision} engines; it builds "
            f"{', '.join(info.precisions)}"
        )


# -- windows ----------------------------------------------------------------------------

# The vocoder's call is at most this many frames (batch x widest window with its context):
# TensorRT sizes a plan's activation memory for its profile's largest call, and the CRD
# refuses a voice whose windows and batch would need more.
MAX_VOCODER_BATCH_FRAMES = 8192
# How a GPU runtime runs a step's encoder call (`WindowConfig.encoder_launch`): in the step,
# before its windows; beside them on a CUDA stream of its own, one call at a time; or queued
# on the windows' own stream, up to three calls at a time. Only the torch-cuda runtime's
# graphed encoder is launched; every other runtime runs it in the step.
ENCODER_LAUNCHES = ("inline", "beside", "queued")


def _check_one_of(name: str, value: str, choices: tuple[str, ...]) -> None:
    """ValueError unless `value` is one of `choices`, naming them."""
    if value not in choices:
        raise ValueError(f"{name} is one of {', '.join(choices)}, not {value!r}")


def check_encoder_launch(value: str) -> None:
    """ValueError unless `value` is one of ENCODER_LAUNCHES, naming them."""
    _check_one_of("encoder_launch", value, ENCODER_LAUNCHES)


@dataclass(frozen=True)
class WindowConfig:
    """Streaming windows in latent frames (one frame = hop samples, 256 at 22,050 Hz ≈ 11.6 ms).

    Defaults come from measurements on the joe voice (docs/streaming.md, `python -m
    lab.window_quality`): a 16-frame first window for first-audio latency, windows
    growing up to 128 frames so the context overhead stays small (doubling on fixed-shape
    engines, by half on the CPU: `engines.streaming.planner.WindowRules.ramp`), and enough
    context for > 50 dB SNR against a one-shot decode (8 vocoder and 24 flow frames; fewer
    flow frames fall below 40 dB).
    """

    first_window_frames: int = 16
    window_frames: int = 128
    vocoder_context_frames: int = 8
    flow_context_frames: int = 24
    max_batch_windows: int = 128
    max_encoder_batch: int = 32
    # A step's estimated length; new streams wait at most about this long for the next step.
    max_step_ms: int = 60
    # On a busy scheduler with a costly encoder call (a GPU), a new stream waits at most this
    # long for others to share its encoder call (`batching.maxQueueDelayMs` of a TTSVoice);
    # not where steps already take that long (engines/streaming/planner.py).
    max_encoder_wait_ms: int = 25
    # A playing stream with at least this much audio sent and not yet played gets no more
    # work until it has less (`TTSVoice streaming.maxLeadMs`); 0: no limit, a stream's audio
    # is made as fast as the steps allow (engines/streaming/planner.py).
    max_lead_ms: int = 0
    # Where streams rest on their lead (`max_lead_ms`) and the runtime's calls are
    # asynchronous (a GPU), a step that leaves no work waiting is followed by the next no
    # sooner than this (nor than a quarter of the least lead limit): the streams that fall
    # under their lead meanwhile share its calls, where each used to make small calls of its
    # own; new streams wait for it too (docs/gpu.md). 0: a step as soon as one is due.
    paced_step_ms: int = 30
    # How the torch-cuda runtime runs encoder calls (ENCODER_LAUNCHES; `TTSVoice
    # batching.encoderLaunch`): "queued" behind the windows on their stream, so the scheduler
    # goes on while they run (on an H200 it held 2,000 paced listeners with no stream
    # underrunning where "inline" let a few underrun, and past the pod's capacity let as few
    # underrun; docs/gpu.md); "inline" in the step, the scheduler waiting for it; "beside"
    # on a CUDA stream of its own, what several instances sharing a GPU with a lead limit
    # needed on an H100.
    encoder_launch: str = "queued"
    # What the encoder's text part runs at (ENCODER_PRECISIONS; `TTSVoice encoderPrecision`):
    # "fp32" keeps the voice's own audio; "fp16" makes the encoder faster where the runtime
    # offers it (`RuntimeInfo.encoder_precisions`), at a small change to the audio.
    encoder_precision: str = "fp32"
    # Where calls take any width (onnxruntime), a playing stream with half a second of audio
    # buffered may take windows twice the steady size and flow chunks of four (fewer context
    # frames, about 2 % more audio on 2 cores); off, since a call that long delayed other
    # streams' first audio by 20 to 200 ms at p95 with 2 to 10 streams (docs/streaming.md).
    lead_windows: bool = False

    def __post_init__(self) -> None:
        for name in (
            "first_window_frames",
            "window_frames",
            "max_batch_windows",
            "max_encoder_batch",
            "max_step_ms",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        for name in (
            "vocoder_context_frames",
            "flow_context_frames",
            "max_encoder_wait_ms",
            "max_lead_ms",
            "paced_step_ms",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        check_encoder_launch(self.encoder_launch)
        _check_one_of("encoder_precision", self.encoder_precision, ENCODER_PRECISIONS)
        if self.first_window_frames > self.window_frames:
            raise ValueError(
                f"first_window_frames ({self.first_window_frames}) must not exceed "
                f"window_frames ({self.window_frames})"
            )

    @cached_property
    def _sizes(self) -> tuple[int, ...]:
        # Worked out once per config: the planner asks for a size class about a thousand
        # times a step at 2,000 streams.
        sizes, size = [], self.first_window_frames
        while size < self.window_frames:
            sizes.append(size)
            size *= 2
        return (*sizes, self.window_frames)

    def window_sizes(self) -> list[int]:
        """The window sizes of fixed-shape engines: first, doubled, ..., steady."""
        return list(self._sizes)

    def size_class(self, frames: int, flow: bool = False) -> int:
        """The smallest window (or flow chunk) size holding `frames`: calls batch per size.

        The flow runs two windows ahead, in chunks twice the window's size: half the calls,
        half the context overhead of running it window by window.
        """
        scale = 2 if flow else 1
        for size in self._sizes:
            if frames <= size * scale:
                return size * scale
        return self.window_frames * scale

    def vocoder_call_frames(self) -> list[int]:
        """Every width of a vocoder call the stream model sends, narrowest first."""
        return [size + 2 * self.vocoder_context_frames for size in self.window_sizes()]

    def flow_call_frames(self) -> list[int]:
        """Every width of a flow call (two windows' frames per chunk), narrowest first."""
        return [2 * size + 2 * self.flow_context_frames for size in self.window_sizes()]

    def vocoder_batch_frames(self) -> int:
        """Frames of the largest vocoder call: a full batch of the widest windows."""
        return self.max_batch_windows * max(self.vocoder_call_frames())


# -- the plan ---------------------------------------------------------------------------

DEFAULT_MAX_TEXT_BYTES = 5000
# Stream-model instances per voice and pod: on the H100 two gave 1.26 to 1.28 times the audio
# of one, three no more than two (docs/gpu.md); each holds a copy of the voice's GPU state.
MAX_INSTANCES = 4
VOICE_CONFIG_NAME = "voice.onnx.json"


@dataclass(frozen=True)
class ServingPlan:
    """How one voice is served: its engines, runtime, windows, batching, limits and rate."""

    name: str
    engine_dir: str
    voice_config_path: str = ""  # default: the engine entry's voice.onnx.json
    runtime: str = "onnxruntime"
    precision: str = ""  # default: the runtime's
    windows: WindowConfig = field(default_factory=WindowConfig)
    cross_stream_batching: bool = True
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES
    # Live streams one pod serves of this voice before refusing with RESOURCE_EXHAUSTED
    # (split between its instances there); 0: no limit.
    max_streams_per_pod: int = 0
    # 1.0 is the voice's own pace; 1.25 speaks 25 % faster (Piper's length scale / 1.25).
    speaking_rate: float = 1.0
    # Stream-model instances a pod runs for this voice: processes that decode its requests and
    # send its audio, each with its share of max_streams_per_pod. They share the pod's voice
    # host (one scheduler, one set of graphs) and the voice's one copy of its weights, so
    # their streams share stage calls as one voice's.
    instances: int = 1

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("a serving plan needs a voice name")
        runtime = runtime_info(self.runtime)
        if not self.precision:
            object.__setattr__(self, "precision", runtime.default_precision)
        check_precision(self.runtime, self.precision)
        if self.windows.encoder_precision not in runtime.encoder_precisions:
            raise ValueError(
                f"the {self.runtime} runtime runs the encoder at "
                f"{', '.join(runtime.encoder_precisions)}, not "
                f"{self.windows.encoder_precision!r} (encoder_precision)"
            )
        if not self.voice_config_path and self.engine_dir:
            object.__setattr__(
                self, "voice_config_path", f"{self.engine_dir.rstrip('/')}/{VOICE_CONFIG_NAME}"
            )
        if self.max_text_bytes < 1:
            raise ValueError(f"max_text_bytes must be at least 1, got {self.max_text_bytes}")
        if self.max_streams_per_pod < 0:
            raise ValueError(
                f"max_streams_per_pod must not be negative, got {self.max_streams_per_pod}"
            )
        if not 0.1 <= self.speaking_rate <= 10:
            raise ValueError(f"speaking_rate must be within 0.1..10, got {self.speaking_rate}")
        if not 1 <= self.instances <= MAX_INSTANCES:
            raise ValueError(f"instances must be within 1..{MAX_INSTANCES}, got {self.instances}")

    @property
    def runtime_info(self) -> RuntimeInfo:
        return runtime_info(self.runtime)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServingPlan:
        if not isinstance(data, dict):
            raise ValueError(f"a serving plan is a JSON object, got {type(data).__name__}")
        _check_fields(cls, data, "serving plan")
        windows = data.get("windows", {})
        if not isinstance(windows, dict):
            raise ValueError("serving plan field windows must be an object")
        _check_fields(WindowConfig, windows, "serving plan windows")
        try:
            return cls(**{**data, "windows": WindowConfig(**windows)})
        except TypeError as error:  # a required field is missing
            raise ValueError(f"serving plan: {error}") from None

    @classmethod
    def from_json(cls, raw: str) -> ServingPlan:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"serving plan is not valid JSON: {error}") from None
        return cls.from_dict(data)


def _check_fields(kind: Any, data: dict[str, Any], what: str) -> None:
    unknown = set(data) - {f.name for f in fields(kind)}
    if unknown:
        raise ValueError(f"unknown {what} field(s): {', '.join(sorted(unknown))}")


# -- engine key -------------------------------------------------------------------------

ENGINE_KEY_LENGTH = 20


def engine_key(
    source: str,
    runtime: str,
    precision: str,
    windows: WindowConfig,
    image: str,
    gpu_product: str,
) -> str:
    """The name a voice's engines are published under: same key, same engines, no rebuild.

    It covers what changes the built artifacts: the voice's content (`source`, a stable
    identity such as its sha256), runtime and precision, the call shapes where the runtime
    is shaped by them (TensorRT), the runtime's version (the image) and the GPU product.
    Rate, limits and autoscaling are left out: they change nothing that is built.
    """
    material: dict[str, Any] = {
        "source": source,
        "runtime": runtime,
        "precision": precision,
        "image": image,
        "gpu_product": gpu_product,
    }
    if runtime_info(runtime).shaped:
        material["windows"] = {
            "first_window_frames": windows.first_window_frames,
            "window_frames": windows.window_frames,
            "vocoder_context_frames": windows.vocoder_context_frames,
            "flow_context_frames": windows.flow_context_frames,
            "max_batch_windows": windows.max_batch_windows,
            "max_encoder_batch": windows.max_encoder_batch,
        }
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()
    return digest[:ENGINE_KEY_LENGTH]
