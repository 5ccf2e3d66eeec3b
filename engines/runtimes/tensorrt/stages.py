"""`TensorRTStages`: the stage runtime that executes a tensorrt entry's serialized plans.

Written against the TensorRT 10 Python API and never executed in this project: TensorRT is
not installable on its machines (see docs/gpu.md). Everything that does not need TensorRT
(profile checks, batch splitting, the error messages) is tested everywhere
(tests/unit/engine_cache/test_tensorrt_runtime.py); the plans themselves only where `tensorrt`
imports (tests/gpu/test_tensorrt_runtime_gpu.py).

- PyTorch manages device memory: the engines read and write torch tensors on the current
  torch stream, so callers mix TensorRT stages with torch code without synchronising.
- The encoder's output length is data-dependent (frames = sum of the predicted durations).
  Such outputs get an `IOutputAllocator` that hands TensorRT a fresh torch buffer once the
  size is known and records the shape TensorRT reports. TensorRT calls both before
  `execute_async_v3` returns (it waits for the size itself), so the runtime reads nothing
  back from the device; every other output is allocated from the shape the context infers.
- A call is checked against the plan's optimisation profiles before it reaches TensorRT, so
  a window the plan was not built for is refused with the shape and the range. Batches
  above the largest profile's maximum batch are split into calls of that maximum.

`tensorrt` and `torch` are imported when a runtime is created, so this module imports where
neither exists.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.artifacts.engine_cache import MANIFEST, EngineKey, normalize_gpu_product
from engines.contract.plan import RUNTIME_NAMES, WindowConfig
from engines.runtimes.tensorrt.build import TensorRTBuildError, check_target

if TYPE_CHECKING:
    import torch

STAGES = ("encoder", "flow", "vocoder")
# Inputs without a batch dimension: passed whole to every part of a split batch.
UNBATCHED_INPUTS = frozenset({"scales"})
OTHER_RUNTIMES = tuple(name for name in RUNTIME_NAMES if name != "tensorrt")
BUILD_COMMAND = "voxfleet build-engines --runtime tensorrt"


class TensorRTRuntimeError(RuntimeError):
    """The tensorrt runtime cannot run here or was asked for a shape its plans do not take."""


# -- pure helpers (no TensorRT, no GPU) --------------------------------------------------------


def import_tensorrt() -> Any:
    try:
        import tensorrt
    except ImportError as error:
        raise TensorRTRuntimeError(
            "the tensorrt runtime needs NVIDIA's TensorRT Python package (`tensorrt`), which "
            "ships in the Triton and TensorRT images and is not installed here "
            f"({error}); use the runtime "
            + " or ".join(f'"{name}"' for name in OTHER_RUNTIMES)
            + " here instead"
        ) from None
    return tensorrt


def plan_paths(engine_dir: Path) -> dict[str, Path]:
    """stage -> `<stage>.plan` in `engine_dir`, or an error naming every missing file."""
    paths = {stage: Path(engine_dir) / f"{stage}.plan" for stage in STAGES}
    missing = [path.name for path in paths.values() if not path.is_file()]
    if missing:
        raise TensorRTRuntimeError(
            f"{engine_dir} has no {', '.join(missing)}: the tensorrt runtime executes the "
            f"plans of a tensorrt engine-cache entry; build them with `{BUILD_COMMAND}` on a "
            "node of the target GPU type, in the Triton image that will serve them"
        )
    return paths


def read_entry_key(engine_dir: Path) -> EngineKey | None:
    """The key in the entry's manifest, or None where there is no readable one."""
    try:
        fields = json.loads((Path(engine_dir) / MANIFEST).read_text())["key"]
        return EngineKey.from_fields(fields)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return None


def plan_mismatch_error(
    stage: str,
    path: Path,
    key: EngineKey | None,
    runtime_version: str,
    gpu_product: str,
    compute_capability: str,
) -> TensorRTRuntimeError:
    """The error for a plan TensorRT refused to deserialize, saying why where the key can."""
    if key is not None:
        try:
            check_target(key, runtime_version, gpu_product, compute_capability)
        except TensorRTBuildError as error:
            return TensorRTRuntimeError(f"TensorRT refused {path} ({stage}): {error}")
    return TensorRTRuntimeError(
        f"TensorRT refused {path} ({stage}): a plan runs only with the TensorRT version and "
        f"GPU type it was built for (here: {runtime_version}, {gpu_product}, compute "
        f"capability {compute_capability}), and the file may be damaged. Rebuild it with "
        f"`{BUILD_COMMAND}` on a node of this GPU type, in this image."
    )


@dataclass(frozen=True)
class InputRange:
    """One input's (min, opt, max) shapes in one optimisation profile."""

    low: tuple[int, ...]
    opt: tuple[int, ...]
    high: tuple[int, ...]

    def contains(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.low) and all(
            a <= s <= b for a, s, b in zip(self.low, shape, self.high, strict=True)
        )

    def __str__(self) -> str:
        return f"{self.low} to {self.high}"


@dataclass(frozen=True)
class StageProfile:
    """The ranges of one optimisation profile of a plan, by input name."""

    index: int
    inputs: Mapping[str, InputRange]

    @classmethod
    def from_ranges(cls, index: int, ranges: Mapping[str, Sequence[Sequence[int]]]) -> StageProfile:
        """From `EngineKey.profiles[stage]` (name -> (min, opt, max)), as the builder sets it."""
        return cls(
            index,
            {
                name: InputRange(*(tuple(int(d) for d in shape) for shape in shapes))
                for name, shapes in ranges.items()
            },
        )

    @property
    def max_batch(self) -> int:
        """Rows one call can take (unbounded where no input has a dynamic batch)."""
        batched = [r.high[0] for name, r in self.inputs.items() if name not in UNBATCHED_INPUTS]
        return min(batched) if batched else sys.maxsize

    def contains(self, shapes: Mapping[str, Sequence[int]]) -> bool:
        return all(
            name in shapes and ranges.contains(shapes[name]) for name, ranges in self.inputs.items()
        )


def choose_profile(
    stage: str, profiles: Sequence[StageProfile], shapes: Mapping[str, Sequence[int]]
) -> StageProfile:
    """The first profile that takes these input shapes, or an error naming shapes and ranges."""
    for profile in profiles:
        if profile.contains(shapes):
            return profile
    described = []
    for profile in profiles:
        outside = [
            f"{name} {tuple(shapes[name]) if name in shapes else 'missing'} is outside {ranges}"
            for name, ranges in profile.inputs.items()
            if name not in shapes or not ranges.contains(shapes[name])
        ]
        described.append(f"profile {profile.index}: {'; '.join(outside)}")
    raise TensorRTRuntimeError(
        f"the {stage} plan does not take these shapes: {' / '.join(described)}. A plan only "
        "takes the shapes of the optimisation profiles it was built with: rebuild it with "
        f"`{BUILD_COMMAND}` and serving shapes (engines/runtimes/tensorrt/profiles.py) "
        "that cover them"
    )


def batch_slices(batch: int, max_batch: int) -> list[slice]:
    """Consecutive slices of at most `max_batch` rows covering `batch` rows."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be at least 1, got {max_batch}")
    return [slice(start, min(batch, start + max_batch)) for start in range(0, batch, max_batch)]


def run_in_batches(
    run: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]],
    feeds: Mapping[str, torch.Tensor],
    max_batch: int,
) -> dict[str, torch.Tensor]:
    """`run` on parts of at most `max_batch` rows; outputs joined along the batch.

    Parts of a data-dependent output (the encoder's frames) can differ in length: shorter
    ones are zero-padded on the right, as one call over the whole batch pads them (the mask
    is zero there).
    """
    import torch

    batch = _batch_size(feeds)
    if batch <= max_batch:
        return run(dict(feeds))
    parts = [
        run({name: t if name in UNBATCHED_INPUTS else t[rows] for name, t in feeds.items()})
        for rows in batch_slices(batch, max_batch)
    ]
    joined: dict[str, torch.Tensor] = {}
    for name in parts[0]:
        pieces = [part[name] for part in parts]
        length = max(piece.shape[-1] for piece in pieces)
        joined[name] = torch.cat(
            [torch.nn.functional.pad(p, (0, length - p.shape[-1])) for p in pieces]
        )
    return joined


def _batch_size(feeds: Mapping[str, Any]) -> int:
    for name, tensor in feeds.items():
        if name not in UNBATCHED_INPUTS:
            return int(tensor.shape[0])
    raise TensorRTRuntimeError("a call needs at least one batched input")


def torch_dtype(trt: Any, trt_dtype: Any) -> torch.dtype:
    import torch

    names = {
        "FLOAT": torch.float32,
        "HALF": torch.float16,
        "BF16": torch.bfloat16,
        "INT8": torch.int8,
        "UINT8": torch.uint8,
        "INT32": torch.int32,
        "INT64": torch.int64,
        "BOOL": torch.bool,
    }
    for name, dtype in names.items():
        if getattr(trt.DataType, name, None) == trt_dtype:
            return dtype
    raise TensorRTRuntimeError(f"no torch dtype for the TensorRT binding type {trt_dtype}")


# -- one plan ----------------------------------------------------------------------------------


def _output_allocator(trt: Any, torch_module: Any, device: torch.device) -> Any:
    """An `IOutputAllocator` that gives TensorRT torch memory for a data-dependent output."""

    class TorchOutputAllocator(trt.IOutputAllocator):
        def __init__(self) -> None:
            trt.IOutputAllocator.__init__(self)
            self.buffer: Any = None
            self.shape: tuple[int, ...] | None = None
            self.error: BaseException | None = None

        def reallocate_output(self, tensor_name: str, memory: int, size: int, alignment: int):
            try:
                align = max(1, int(alignment))
                raw = torch_module.empty(
                    max(1, int(size)) + align, dtype=torch_module.uint8, device=device
                )
                offset = (-raw.data_ptr()) % align
                self.buffer = raw[offset : offset + max(1, int(size))]
                return self.buffer.data_ptr()
            except Exception as error:  # TensorRT would only see a null pointer
                self.error = error
                return 0

        # TensorRT 10 calls this one; the synchronous one above is its deprecated form.
        def reallocate_output_async(
            self, tensor_name: str, memory: int, size: int, alignment: int, stream: Any
        ):
            return self.reallocate_output(tensor_name, memory, size, alignment)

        def notify_shape(self, tensor_name: str, shape: Any) -> None:
            self.shape = tuple(int(d) for d in shape)

        def tensor(self, name: str, dtype: torch.dtype) -> torch.Tensor:
            if self.error is not None:
                raise TensorRTRuntimeError(
                    f"allocating the output {name} failed: {self.error}"
                ) from self.error
            if self.shape is None or self.buffer is None:
                raise TensorRTRuntimeError(f"TensorRT reported no shape for the output {name}")
            count = int(np.prod(self.shape, dtype=np.int64))
            itemsize = torch_module.empty((), dtype=dtype).element_size()
            return self.buffer[: count * itemsize].view(dtype).reshape(self.shape)

    return TorchOutputAllocator()


class PlanStage:
    """One deserialized plan with its execution context, run on torch tensors."""

    def __init__(
        self,
        trt: Any,
        runtime: Any,
        stage: str,
        path: Path,
        device: torch.device,
        mismatch: Callable[[str, Path], TensorRTRuntimeError],
    ) -> None:
        self._trt = trt
        self.stage = stage
        self.device = device
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise mismatch(stage, path)
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise TensorRTRuntimeError(
                f"TensorRT could not create an execution context for {path} "
                "(not enough GPU memory for its activations?)"
            )
        self.inputs: dict[str, torch.dtype] = {}
        self.outputs: dict[str, torch.dtype] = {}
        for index in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(index)
            dtype = torch_dtype(trt, self.engine.get_tensor_dtype(name))
            if self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
                self.inputs[name] = dtype
            else:
                self.outputs[name] = dtype
        self.profiles = [
            StageProfile(
                index=profile,
                inputs={
                    name: InputRange(
                        *(
                            tuple(int(d) for d in shape)
                            for shape in self.engine.get_tensor_profile_shape(name, profile)
                        )
                    )
                    for name in self.inputs
                    if _is_dynamic(self.engine.get_tensor_shape(name))
                },
            )
            for profile in range(self.engine.num_optimization_profiles)
        ]
        self.max_batch = max((p.max_batch for p in self.profiles), default=1)
        self.active_profile = 0
        self._allocators: dict[str, Any] = {}
        self._lock = threading.Lock()  # one context: one call at a time

    def __call__(self, feeds: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        unknown = set(feeds) - set(self.inputs)
        missing = set(self.inputs) - set(feeds)
        if unknown or missing:
            raise TensorRTRuntimeError(
                f"the {self.stage} plan takes inputs {sorted(self.inputs)}; got {sorted(feeds)}"
            )
        cast = {
            name: tensor.to(self.device, self.inputs[name]).contiguous()
            for name, tensor in feeds.items()
        }
        return run_in_batches(self._run_once, cast, self.max_batch)

    def _run_once(self, feeds: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        import torch

        profile = choose_profile(
            self.stage, self.profiles, {name: tuple(t.shape) for name, t in feeds.items()}
        )
        with self._lock, torch.cuda.device(self.device):
            stream = torch.cuda.current_stream(self.device)
            if profile.index != self.active_profile:
                if not self.context.set_optimization_profile_async(
                    profile.index, stream.cuda_stream
                ):
                    raise TensorRTRuntimeError(
                        f"TensorRT refused optimisation profile {profile.index} of the "
                        f"{self.stage} plan"
                    )
                self.active_profile = profile.index
            for name, tensor in feeds.items():
                if not self.context.set_input_shape(name, tuple(tensor.shape)):
                    raise TensorRTRuntimeError(
                        f"TensorRT refused the {self.stage} input {name} of shape "
                        f"{tuple(tensor.shape)}"
                    )
                self.context.set_tensor_address(name, tensor.data_ptr())
            outputs: dict[str, torch.Tensor] = {}
            allocators: dict[str, Any] = {}
            for name, dtype in self.outputs.items():
                shape = tuple(int(d) for d in self.context.get_tensor_shape(name))
                if any(d < 0 for d in shape):  # known only once the plan has run
                    allocators[name] = _output_allocator(self._trt, torch, self.device)
                    self.context.set_output_allocator(name, allocators[name])
                else:
                    outputs[name] = torch.empty(shape, dtype=dtype, device=self.device)
                    self.context.set_tensor_address(name, outputs[name].data_ptr())
            if not self.context.execute_async_v3(stream.cuda_stream):
                raise TensorRTRuntimeError(
                    f"TensorRT failed to run the {self.stage} plan (see its log)"
                )
            # The context keeps a raw pointer to each allocator: hold them until replaced.
            self._allocators = allocators
            for name, allocator in allocators.items():
                outputs[name] = allocator.tensor(name, self.outputs[name])
        return outputs


def _is_dynamic(shape: Any) -> bool:
    return any(int(d) < 0 for d in shape)


# -- the runtime -------------------------------------------------------------------------------


class TensorRTStages:
    """Encoder, flow and vocoder plans on one CUDA device (see the module docstring)."""

    name = "tensorrt"

    def __init__(self, engine_dir: Path, device: str | torch.device = "cuda") -> None:
        engine_dir = Path(engine_dir)
        paths = plan_paths(engine_dir)
        trt = import_tensorrt()
        try:
            import torch
        except ImportError:
            raise TensorRTRuntimeError(
                "the tensorrt runtime uses PyTorch with CUDA for its device memory; "
                "PyTorch is not installed here"
            ) from None
        self.device = torch.device(device)
        if self.device.type != "cuda" or not torch.cuda.is_available():
            raise TensorRTRuntimeError(
                f"TensorRT plans run on a CUDA GPU; device {self.device} is not one "
                f"(PyTorch {torch.__version__} sees {torch.cuda.device_count()} GPUs)"
            )
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        key = read_entry_key(engine_dir)

        def mismatch(stage: str, path: Path) -> TensorRTRuntimeError:
            major, minor = torch.cuda.get_device_capability(self.device)
            return plan_mismatch_error(
                stage,
                path,
                key,
                f"tensorrt-{trt.__version__}",
                normalize_gpu_product(torch.cuda.get_device_name(self.device)),
                f"{major}.{minor}",
            )

        # The runtime must outlive the engines it deserialized: both stay referenced here.
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        with torch.cuda.device(self.device):
            self.stages = {
                stage: PlanStage(trt, self._runtime, stage, path, self.device, mismatch)
                for stage, path in paths.items()
            }
        self.precision = key.precision if key is not None else None
        self.multi_speaker = "sid" in self.stages["encoder"].inputs
        self.flow_dtype = self.stages["flow"].inputs["prior"]
        self.vocoder_dtype = self.stages["vocoder"].inputs["latent"]

    def _speaker(self, stage: str, batch: int, speaker_ids: object) -> dict[str, torch.Tensor]:
        import torch

        if "sid" not in self.stages[stage].inputs:
            if speaker_ids is not None and np.any(_as_numpy(speaker_ids) != 0):
                raise TensorRTRuntimeError("this voice has one speaker; speaker ids must be 0")
            return {}
        if speaker_ids is None:
            return {"sid": torch.zeros(batch, dtype=torch.int64)}
        return {"sid": torch.as_tensor(_as_numpy(speaker_ids), dtype=torch.int64)}

    # -- tensor API: stays on the device (the GPU stream path) --------------------------------

    def encode_tensor(
        self,
        ids: torch.Tensor,
        lengths: torch.Tensor,
        scales: torch.Tensor,
        speaker_ids: object = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        outputs = self.stages["encoder"](
            {
                "input": ids,
                "input_lengths": lengths,
                "scales": scales.reshape(-1)[:3],
                **self._speaker("encoder", int(ids.shape[0]), speaker_ids),
            }
        )
        return outputs["prior"], outputs["mask"]

    def flow_tensor(
        self, prior: torch.Tensor, mask: torch.Tensor, speaker_ids: object = None
    ) -> torch.Tensor:
        feeds = {
            "prior": prior,
            "mask": mask,
            **self._speaker("flow", int(prior.shape[0]), speaker_ids),
        }
        return self.stages["flow"](feeds)["latent"]

    def vocode_tensor(self, latent: torch.Tensor, speaker_ids: object = None) -> torch.Tensor:
        feeds = {"latent": latent, **self._speaker("vocoder", int(latent.shape[0]), speaker_ids)}
        audio = self.stages["vocoder"](feeds)["audio"]
        return audio.reshape(audio.shape[0], -1)

    def stream_backend(self) -> Any:
        """The GPU stream path's backend over these stages (device tensors end to end)."""
        from engines.runtimes.device_frames import DeviceBackend

        return DeviceBackend(self)

    # -- StageRuntime (numpy in, numpy out) ----------------------------------------------------

    def encode(self, ids, lengths, scales, speaker_ids=None):
        import torch

        prior, mask = self.encode_tensor(
            torch.from_numpy(np.ascontiguousarray(ids, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(lengths, dtype=np.int64)),
            torch.from_numpy(np.ascontiguousarray(scales, dtype=np.float32)),
            speaker_ids,
        )
        return _to_numpy(prior), _to_numpy(mask)

    def flow(self, prior, mask, speaker_ids=None):
        import torch

        latent = self.flow_tensor(
            torch.from_numpy(np.ascontiguousarray(prior)),
            torch.from_numpy(np.ascontiguousarray(mask)),
            speaker_ids,
        )
        return _to_numpy(latent)

    def vocode(self, latent, speaker_ids=None):
        import torch

        audio = self.vocode_tensor(torch.from_numpy(np.ascontiguousarray(latent)), speaker_ids)
        return _to_numpy(audio)


def _as_numpy(values: object) -> np.ndarray:
    if hasattr(values, "detach"):
        return values.detach().cpu().numpy()
    return np.asarray(values)


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    import torch

    return tensor.detach().to(torch.float32).cpu().numpy()


def load(engine_dir: Path, windows: WindowConfig, cpu_threads: int | None = None) -> TensorRTStages:
    """The runtime registry's loader; the plans' profiles already fix the call shapes."""
    return TensorRTStages(engine_dir)
