"""`VoiceHost`: the voices of a pod, their architectures, their streams and the pod's memory.

An *architecture* is a stage runtime plus the scheduler that steps its streams: voices that
share a runtime, precision, windows and batching share one (on a GPU: one set of captured
graphs; a voice is then a weight set, engines/runtimes/torch_cuda/weights.py). The first voice of an
architecture creates it (and waits for its warmup: graph capture on a GPU); every later voice
only loads its weights. A voice whose graphs differ from its architecture's is refused
(`ArchitectureMismatch`): it belongs in a pool of its own.

Every load is checked against the pod's memory first, and refused with the numbers where it
would not fit with `margin_bytes` to spare: on a GPU against the device's free memory (under
MPS, the client's limit) and the pool's declared memory, whichever is less; on the CPU
against the process's memory limit. A voice's footprint is what its load took: its weight
buffers on a GPU, the growth of what this process's allocator has handed out on the CPU
(`MemoryMeter.allocated`).

No I/O here: engines/pod/voice_host/server.py puts it on a socket, and the tests drive it
directly.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from engines.contract.plan import ServingPlan, WindowConfig
from engines.runtimes import load_stages
from engines.runtimes.onnx import onnx_bytes
from engines.streaming import (
    FirstAudioPaths,
    SchedulerStats,
    StreamScheduler,
    StreamSink,
    SynthesisParams,
)
from engines.streaming.scheduler import SCHEDULER_THREAD
from engines.streaming.threads import NamedThread, StackSampler, threads_named
from engines.streaming.types import VoiceSlot
from engines.text.frontend import Sentence
from engines.text.frontend_pool import FrontendPool
from engines.text.voice import VoiceConfig, read_voice_config

LOGGER = logging.getLogger("voxfleet.host")
MIB = 1 << 20
# What a new architecture is taken to need before it exists (its runtime, frame stores and,
# on a GPU, its captured graphs at the default plan), for the check before it is created;
# once it exists, what it took is measured. From `voxfleet bench gpu-memory` (docs/gpu.md).
ARCHITECTURE_ESTIMATE_BYTES = {"torch-cuda": 2560 * MIB, "tensorrt": 2560 * MIB}
CPU_ARCHITECTURE_ESTIMATE_BYTES = 256 * MIB
# A CPU voice's weights are its three ONNX stages; onnxruntime's sessions take about this
# many times their files' size (measured on the joe voice: docs/gpu.md).
CPU_VOICE_BYTES_PER_FILE_BYTE = 1.5
# Profiling runs: every this many seconds each architecture writes its scheduler's call totals,
# cost model and step times to stderr, as `voxfleet-costs <first voice> <json>` lines (read by
# engines/bench/profile.py).
COSTS_LOG_ENV = "VOXFLEET_COSTS_LOG_S"
# Profiling runs: the schedulers' threads' stacks, sampled in the process (`StackSampler`),
# written to this file every STACKS_WRITE_S in py-spy's raw format (wall microseconds).
STACKS_FILE_ENV = "VOXFLEET_STACKS_FILE"
STACKS_WRITE_S = 2.0
# What a pod holds is predicted by each architecture's scheduler from its calls' costs
# (`StreamScheduler.capacity`, engines/streaming/capacity.py). A pod that has its capacity of
# live streams refuses a new one (RESOURCE_EXHAUSTED) at once rather than make every playing
# stream late; its load ratio (live streams / capacity) is what the HPAs scale on. The
# figures are published every LOAD_SAMPLE_S.
LOAD_SAMPLE_S = 0.25
# A pod is never full below this many live streams, whatever it predicts: on a 2-core CPU
# shared with other work the prediction fell to 3 (the stages then ran 3 times slower than
# alone), and a pod that turns away its fourth listener is of little use. The HPAs still
# read the load against the prediction.
MIN_ADMITTED_STREAMS = 4
# Phonemiser worker processes where a GPU does the rest (the CPU data plane phonemises on
# the thread that has the request: its cores are the stages').
GPU_FRONTEND_WORKERS = 4
# The kernel name of the threads a runtime starts (`threads_named`): in the bench's per-thread
# figures their busy time is the stages' compute on the CPU.
STAGE_THREADS = "voxfleet-stages"


class LoadRefused(Exception):
    """A voice cannot be loaded here; `code` is the gRPC status name it maps to."""

    def __init__(self, message: str, code: str = "FAILED_PRECONDITION") -> None:
        super().__init__(message)
        self.code = code


class StreamRefused(Exception):
    """A stream cannot start (its voice is gone or going); `code` as for LoadRefused."""

    def __init__(self, message: str, code: str = "UNAVAILABLE") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class MemoryReport:
    """The pod's memory as its voice host sees it (bytes). `total` is what may be used: the
    device's (or this process's limit) and the pool's declared memory, whichever is less;
    `fixed` is `used` less the voices' own footprints."""

    device: str
    total: int
    used: int
    voices: dict[str, int] = field(default_factory=dict)
    margin: int = 0

    @property
    def fixed(self) -> int:
        return max(0, self.used - sum(self.voices.values()))

    @property
    def free(self) -> int:
        return max(0, self.total - self.used)

    def to_dict(self) -> dict[str, Any]:
        def mib(value: int) -> float:
            return round(value / MIB, 1)

        return {
            "device": self.device,
            "total_mib": mib(self.total),
            "used_mib": mib(self.used),
            "free_mib": mib(self.free),
            "fixed_mib": mib(self.fixed),
            "margin_mib": mib(self.margin),
            "voices": {name: {"mib": mib(size)} for name, size in sorted(self.voices.items())},
        }


class MemoryMeter:
    """Where a device's memory stands: `total()` and `used()` in bytes."""

    device = "cpu"

    def total(self) -> int:
        limit = _cgroup_memory_limit()
        machine = int(psutil.virtual_memory().total)
        return min(limit, machine) if limit else machine

    def used(self) -> int:
        return int(psutil.Process().memory_info().rss)

    def allocated(self) -> int:
        """What this process's C allocator has handed out and not taken back (glibc's
        `mallinfo2`), to measure what a load took; resident memory where that is not known.
        Resident memory alone misses a load that reuses pages an earlier one freed: a voice
        loaded after another was unloaded (a rolling update, a heal) grew it by under 1 MiB."""
        info = _mallinfo2()
        return info if info is not None else self.used()


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
        ).split()
    ]


@functools.cache
def _mallinfo2_function() -> Any:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (AttributeError, OSError):
        return None
    function.restype = _MallInfo2
    return function


def _mallinfo2() -> int | None:
    """Bytes in use from glibc's heap and its mmapped blocks; None without glibc 2.33+."""
    function = _mallinfo2_function()
    if function is None:
        return None
    info = function()
    return int(info.uordblks + info.hblkhd)


class GpuMemoryMeter(MemoryMeter):
    """The CUDA device's memory as this process sees it. Under an MPS per-client limit
    (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) the device reports what is free within the limit but
    the whole device's total: the limit is then the total.

    `used` is what the device charges the pod, not only what this process's allocations took
    (`ChargedMemory`: the CUDA context and the pod's MPS server besides), where that is more
    than the free memory says. Under a 16 GiB budget the free memory said 7,430 MiB while
    nvidia-smi counted 8,817 to 8,883 MiB on the GPU (docs/gpu.md); the operator places voices
    by this figure."""

    device = "gpu"

    def __init__(self, charged: Callable[[], int | None] | None = None) -> None:
        import torch

        self._torch = torch
        self._limit = mps_limit_bytes(os.environ.get(MPS_LIMIT_ENV, ""))
        self._charged = charged if charged is not None else ChargedMemory()

    def total(self) -> int:
        return self._limit or int(self._torch.cuda.mem_get_info()[1])

    def used(self) -> int:
        return max(self.allocated(), self._charged() or 0)

    def allocated(self) -> int:
        free, _ = self._torch.cuda.mem_get_info()
        return max(0, self.total() - int(free))


# How long a reading of the driver's per-process memory stands (it takes a process start).
CHARGED_READ_S = 2.0
MPS_SERVER = "nvidia-cuda-mps-server"


def _nvidia_smi(query: str) -> str:
    return subprocess.run(
        ["nvidia-smi", query, "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=5,
        check=True,
    ).stdout


def charged_bytes(compute_apps_csv: str, pids: set[int]) -> int:
    """Bytes the driver charges `pids`, from `nvidia-smi --query-compute-apps=pid,used_memory
    --format=csv,noheader,nounits` (one `pid, MiB` line per process on the GPU)."""
    total = 0
    for line in compute_apps_csv.splitlines():
        fields = [field.strip() for field in line.split(",")]
        if len(fields) < 2 or not fields[0].isdigit():
            continue
        try:
            mib = float(fields[1])
        except ValueError:  # "[N/A]" where the driver does not say
            continue
        if int(fields[0]) in pids:
            total += int(mib * MIB)
    return total


def device_used_bytes(query_gpu_csv: str) -> int | None:
    """The GPU's used memory from `nvidia-smi --query-gpu=memory.used --format=csv,noheader,
    nounits`, where it shows one GPU (a pod's own); None where it shows several or none."""
    lines = [line.strip() for line in query_gpu_csv.splitlines() if line.strip()]
    if len(lines) != 1:
        return None
    try:
        return int(float(lines[0]) * MIB)
    except ValueError:
        return None


class ChargedMemory:
    """What the driver charges the pod (`nvidia-smi`, read at most every CHARGED_READ_S): its
    processes' memory (this one and the MPS server it is a client of) and, where nvidia-smi
    sees one GPU, the GPU's used memory as a whole. A pool pod has its GPU to itself (the
    chart asks for one `nvidia.com/gpu` per pod), so all of it is the pod's; under MPS the
    driver may list the server alone, not its clients. None where nvidia-smi cannot say."""

    def __init__(self) -> None:
        self._read: tuple[float, int | None] | None = None

    def _pids(self) -> set[int]:
        pids = {os.getpid()}
        if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
            # The pod's own daemon (engines/pod/mps.py) started its server; in a pod's PID
            # namespace it is the only one.
            for process in psutil.process_iter(["name"]):
                if process.info.get("name") == MPS_SERVER:
                    pids.add(process.pid)
        return pids

    def __call__(self) -> int | None:
        now = time.monotonic()
        if self._read is not None and now - self._read[0] < CHARGED_READ_S:
            return self._read[1]
        value: int | None = None
        try:
            apps = _nvidia_smi("--query-compute-apps=pid,used_memory")
            device = device_used_bytes(_nvidia_smi("--query-gpu=memory.used"))
            value = max(charged_bytes(apps, self._pids()), device or 0)
        except (OSError, subprocess.SubprocessError):
            value = None
        self._read = (now, value)
        return value


MPS_LIMIT_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"


def mps_limit_bytes(value: str, device: int = 0) -> int:
    """The MPS per-client limit of `device` in bytes, from the variable's `0=16G,1=8G` (or a
    bare `16G` for every device); 0 where none is set."""
    for part in value.split(","):
        index, _, size = part.strip().rpartition("=")
        if index and index != str(device):
            continue
        size = size.strip().upper()
        units = {"G": 1 << 30, "M": 1 << 20, "K": 1 << 10}
        try:
            if size and size[-1] in units:
                return int(float(size[:-1]) * units[size[-1]])
            return int(size) if size else 0
        except ValueError:
            return 0
    return 0


def _cgroup_memory_limit() -> int:
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return 0


@dataclass(eq=False)
class _Architecture:
    key: tuple[Any, ...]
    runtime: Any
    scheduler: StreamScheduler
    meter: MemoryMeter
    first_voice: str
    fixed_bytes: int = 0
    voices: set[int] = field(default_factory=set)
    # Streams admitted and not ended, those still being phonemised included: what admission
    # counts (the scheduler sees a stream only once its text is phonemised).
    admitted: int = 0
    # Prepared before any voice (`VoiceHost.prepare`): the engine directory whose voice's
    # weights the runtime loaded with it, until that voice's load takes them.
    unclaimed: str | None = None


@dataclass(eq=False)
class _Voice:
    handle: int
    plan: ServingPlan
    config: VoiceConfig
    architecture: _Architecture
    slot: VoiceSlot
    nbytes: int
    streams: int = 0
    unloading: bool = False

    @property
    def name(self) -> str:
        return self.plan.name


def _live(architecture: _Architecture) -> int:
    """An architecture's live streams as admission counts them: those admitted, still being
    phonemised included, or the scheduler's own count where that is more."""
    return max(architecture.scheduler.live_streams(), architecture.admitted)


def _first_weights(architecture: _Architecture) -> tuple[Any, int]:
    """The weights an architecture's runtime loaded with it (its first voice's), and their
    bytes; (None, 0) where its runtime holds no weight sets (a voice there is a session)."""
    weights = getattr(architecture.runtime, "default_voice", None)
    return weights, architecture.runtime.weights_bytes() if weights is not None else 0


def architecture_key(plan: ServingPlan) -> tuple[Any, ...]:
    """What voices must share to share an architecture: runtime, precision, windows and
    batching (their graphs are captured for these shapes); a runtime that cannot load a
    second voice into itself (no `load_voice`, TensorRT) gets one per engine entry."""
    windows = replace(plan.windows, max_lead_ms=0)  # a lead limit is per voice
    return (plan.runtime, plan.precision, windows, plan.cross_stream_batching)


class VoiceHost:
    """Loads and unloads voices, starts their streams, and reports memory."""

    def __init__(
        self,
        budget_bytes: int = 0,
        margin_bytes: int = 512 * MIB,
        frontend_workers: int | None = None,
        cpu_threads: int | None = None,
        gpu_meter: Callable[[], MemoryMeter] = GpuMemoryMeter,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.margin_bytes = margin_bytes
        self.cpu_threads = cpu_threads
        self._frontend_workers = frontend_workers
        self._gpu_meter_factory = gpu_meter
        self._meters: dict[str, MemoryMeter] = {"cpu": MemoryMeter()}
        self._architectures: dict[tuple[Any, ...], _Architecture] = {}
        self._voices: dict[int, _Voice] = {}
        self._handles = itertools.count(1)
        self._frontend: FrontendPool | None = None
        self._sampler: StackSampler | None = None  # STACKS_FILE_ENV
        # Starting the phonemiser workers takes about a second: not under `_lock`.
        self._frontend_lock = threading.Lock()
        # Loads one at a time: each measures what it took.
        self._load_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        NamedThread(target=self._watch_load, name="voxfleet-load", daemon=True).start()

    def _watch_load(self) -> None:
        """Every LOAD_SAMPLE_S: each architecture's load, into its voices' stats."""
        while not self._closed.wait(LOAD_SAMPLE_S):
            with self._lock:
                voices = list(self._voices.values())
            for architecture in list(self._architectures.values()):
                scheduler = architecture.scheduler
                capacity = scheduler.capacity()
                ratio = _live(architecture) / capacity
                for voice in voices:
                    if voice.architecture is architecture:
                        voice.slot.stats.load_ratio = ratio
                        voice.slot.stats.capacity_streams = capacity

    # -- memory ------------------------------------------------------------------------------
    def _meter(self, device: str) -> MemoryMeter:
        meter = self._meters.get(device)
        if meter is None:
            meter = self._meters[device] = self._gpu_meter_factory()
        return meter

    def _total(self, meter: MemoryMeter) -> int:
        total = meter.total()
        return min(total, self.budget_bytes) if self.budget_bytes else total

    def memory(self) -> MemoryReport:
        """The GPU's report where the host runs a GPU architecture, else the CPU's."""
        device = "gpu" if "gpu" in self._meters else "cpu"
        meter = self._meters[device]
        with self._lock:
            voices: dict[str, int] = {}
            for voice in self._voices.values():
                if voice.architecture.meter is meter:
                    voices[voice.name] = voices.get(voice.name, 0) + voice.nbytes
        return MemoryReport(device, self._total(meter), meter.used(), voices, self.margin_bytes)

    def _check_fits(self, meter: MemoryMeter, need: int, what: str) -> None:
        total, used = self._total(meter), meter.used()
        free = total - used
        if need + self.margin_bytes > free:
            raise LoadRefused(
                f"{what} needs {need / MIB:.0f} MiB of {meter.device.upper()} memory and this "
                f"pod has {free / MIB:.0f} MiB free of {total / MIB:.0f} MiB, keeping "
                f"{self.margin_bytes / MIB:.0f} MiB spare",
                "RESOURCE_EXHAUSTED",
            )

    # -- voices ------------------------------------------------------------------------------
    def load(self, plan: ServingPlan) -> int:
        """Load `plan`'s voice; returns its handle. LoadRefused where it does not fit, its
        architecture differs, or its engines cannot be read; nothing stays allocated then."""
        try:
            config = read_voice_config(plan.voice_config_path)
        except (OSError, ValueError) as error:
            raise LoadRefused(f"voice {plan.name}: {error}", "INVALID_ARGUMENT") from None
        started = time.monotonic()
        with self._load_lock:
            voice = self._load_locked(plan, config)
        LOGGER.info(
            "voice %s loaded (%s, %.1f MiB) in %.2f s",
            plan.name,
            plan.runtime,
            voice.nbytes / MIB,
            time.monotonic() - started,
        )
        return voice.handle

    def _load_locked(self, plan: ServingPlan, config: VoiceConfig) -> _Voice:
        """`load`'s work, with the pod's loads its own (`_load_lock`)."""
        key = architecture_key(plan)
        architecture = self._architectures.get(key)
        if architecture is not None and architecture.unclaimed == plan.engine_dir:
            # Prepared for this voice before it was asked for: its weights are loaded.
            architecture.unclaimed = None
            return self._add_voice(plan, config, architecture, *_first_weights(architecture))
        twin = self._loaded_twin(plan, key)
        if twin is not None:
            # Another instance of a loaded voice (`voxfleet serve --instances`): it shares
            # that voice's weights, and so its stage calls, and costs no memory more.
            return self._add_voice(plan, config, twin.architecture, twin.slot.weights, 0)
        if architecture is not None and not hasattr(architecture.runtime, "load_voice"):
            key = (*key, plan.engine_dir)
            architecture = self._architectures.get(key)
        if architecture is None:
            architecture = self._create(key, plan, config)
            weights, nbytes = _first_weights(architecture)
        else:
            weights, nbytes = self._load_weights(architecture, plan, config)
        return self._add_voice(plan, config, architecture, weights, nbytes)

    def _loaded_twin(self, plan: ServingPlan, key: tuple[Any, ...]) -> _Voice | None:
        """A loaded voice (not unloading) of `plan`'s name and engines on its architecture, whose
        weights a further instance of it shares."""
        with self._lock:
            for voice in self._voices.values():
                if (
                    voice.name == plan.name
                    and voice.plan.engine_dir == plan.engine_dir
                    and voice.architecture.key[: len(key)] == key
                    and voice.slot.weights is not None
                    and not voice.unloading
                ):
                    return voice
        return None

    def _add_voice(
        self,
        plan: ServingPlan,
        config: VoiceConfig,
        architecture: _Architecture,
        weights: Any,
        nbytes: int,
    ) -> _Voice:
        slot = VoiceSlot(plan.name, weights, max_lead_ms=plan.windows.max_lead_ms)
        voice = _Voice(next(self._handles), plan, config, architecture, slot, nbytes)
        with self._lock:
            self._voices[voice.handle] = voice
            architecture.voices.add(voice.handle)
        return voice

    def prepare(self, plan: ServingPlan) -> None:
        """Start `plan`'s architecture, its warmup included, before any voice asks for it: a
        pod that knows its first voice (`voxfleet serve`) starts it while tritonserver and its
        backend start, and that voice's load then finds it ready (loads wait for it). Where it
        cannot start, the error is logged and the voice's own load reports it."""
        try:
            config = read_voice_config(plan.voice_config_path)
            with self._load_lock:
                key = architecture_key(plan)
                if key in self._architectures:
                    return
                started = time.monotonic()
                architecture = self._create(key, plan, config)
                architecture.unclaimed = plan.engine_dir
            LOGGER.info(
                "architecture of %s prepared before its load, in %.1f s",
                plan.name,
                time.monotonic() - started,
            )
        except (LoadRefused, OSError, ValueError) as error:
            LOGGER.error("preparing %s before its load failed: %s", plan.name, error)

    def _create(
        self, key: tuple[Any, ...], plan: ServingPlan, config: VoiceConfig
    ) -> _Architecture:
        device = "gpu" if plan.runtime_info.needs_gpu else "cpu"
        try:
            meter = self._meter(device)
        except Exception as error:  # no CUDA here
            raise LoadRefused(
                f"voice {plan.name}: {plan.runtime} cannot run here: {error}"
            ) from None
        need = ARCHITECTURE_ESTIMATE_BYTES.get(plan.runtime, CPU_ARCHITECTURE_ESTIMATE_BYTES)
        self._check_fits(meter, need, f"voice {plan.name} (the first of its architecture)")
        before = meter.allocated()
        if device == "gpu" and self._frontend_workers is None:
            self._frontend_workers = GPU_FRONTEND_WORKERS
        if self._frontend_workers:
            # The workers start beside the warmup, each reading espeak-ng's data and this
            # voice's config as it starts: a worker's first sentence took 120 ms longer than
            # its next, and a new pod's first listeners met that as cold voices' slow tail.
            NamedThread(
                target=self._frontend_pool,
                args=(plan.voice_config_path,),
                name="voxfleet-phonemisers",
                daemon=True,
            ).start()
        try:
            # The threads libraries start meanwhile (onnxruntime's pool, CUDA's, and those some
            # start at the warmup's first calls) take the name STAGE_THREADS; ours name
            # themselves.
            with threads_named(STAGE_THREADS):
                runtime = load_stages(
                    plan.runtime, Path(plan.engine_dir), plan.windows, cpu_threads=self.cpu_threads
                )
                scheduler = StreamScheduler(
                    runtime,
                    sample_rate=config.sample_rate,
                    hop_length=config.hop_length,
                    windows=plan.windows,
                    cross_stream_batching=plan.cross_stream_batching,
                )
                started = time.monotonic()
                shapes = scheduler.warmup()
                scheduler.start()
        except Exception as error:
            _free_device_cache(device)
            raise LoadRefused(f"voice {plan.name}: its stages cannot run: {error}") from None
        architecture = _Architecture(key, runtime, scheduler, meter, plan.name)
        architecture.fixed_bytes = max(0, meter.allocated() - before)
        LOGGER.info(
            "architecture of %s ready: %s, %d shapes prepared in %.1f s, %.0f MiB",
            plan.name,
            plan.runtime,
            shapes,
            time.monotonic() - started,
            architecture.fixed_bytes / MIB,
        )
        report = getattr(runtime, "warmup_report", None)
        if report is not None:
            LOGGER.info("warmup of %s by stage: %s", plan.name, json.dumps(report()))
        self._architectures[key] = architecture
        report_s = float(os.environ.get(COSTS_LOG_ENV, "0") or 0)
        if report_s > 0:
            scheduler.first_audio_paths = FirstAudioPaths()
            NamedThread(
                target=_report_costs,
                args=(architecture, report_s),
                name="voxfleet-costs",
                daemon=True,
            ).start()
        stacks = os.environ.get(STACKS_FILE_ENV, "")
        if stacks and self._sampler is None:
            self._sampler = StackSampler(SCHEDULER_THREAD).start()
            NamedThread(
                target=_write_stacks,
                args=(self._sampler, Path(stacks), self._closed),
                name="voxfleet-stacks",
                daemon=True,
            ).start()
        return architecture

    def _load_weights(
        self, architecture: _Architecture, plan: ServingPlan, config: VoiceConfig
    ) -> tuple[Any, int]:
        runtime, meter = architecture.runtime, architecture.meter
        if meter.device == "gpu":
            need = int(runtime.weights_bytes())
        else:
            need = int(onnx_bytes(Path(plan.engine_dir)) * CPU_VOICE_BYTES_PER_FILE_BYTE)
        self._check_fits(meter, need, f"voice {plan.name}")
        before = meter.allocated()
        try:
            # (A voice's session starts its own pool; late chunks meanwhile do not cut what
            # the scheduler holds.)
            with threads_named(STAGE_THREADS), architecture.scheduler.ceiling.loading():
                weights = runtime.load_voice(Path(plan.engine_dir), plan.name)
        except ValueError as error:  # ArchitectureMismatch and unreadable graphs
            raise LoadRefused(
                f"voice {plan.name} does not fit the architecture this pod serves (that of "
                f"voice {architecture.first_voice}): {error}",
                "INVALID_ARGUMENT",
            ) from None
        except Exception as error:
            _free_device_cache(meter.device)
            raise LoadRefused(f"voice {plan.name}: its weights cannot be loaded: {error}") from None
        nbytes = getattr(weights, "nbytes", None)
        if nbytes is None:
            nbytes = max(0, meter.allocated() - before)
        return weights, int(nbytes)

    def unload(self, handle: int) -> None:
        """Stop taking streams for the voice; its weights go once its last stream ends."""
        with self._lock:
            voice = self._voices.get(handle)
            if voice is None:
                return
            voice.unloading = True
            done = voice.streams == 0
        if done:
            self._free(voice)

    def _free(self, voice: _Voice) -> None:
        with self._lock:
            if self._voices.pop(voice.handle, None) is None:
                return
            voice.architecture.voices.discard(voice.handle)
            # Instances of one voice share its weights: they go with the last of them, and a
            # remaining instance counts their memory.
            heirs = [o for o in self._voices.values() if o.slot.weights is voice.slot.weights]
            shared = voice.slot.weights is not None and bool(heirs)
            if shared:
                heirs[0].nbytes += voice.nbytes
        runtime = voice.architecture.runtime
        unload = getattr(runtime, "unload_voice", None)
        if unload is not None and not shared and voice.slot.weights is not None:
            unload(voice.slot.weights)
        _free_device_cache(voice.architecture.meter.device)
        LOGGER.info("voice %s unloaded", voice.name)

    def voice_names(self) -> list[str]:
        with self._lock:
            return sorted({voice.name for voice in self._voices.values()})

    def stats(self, handle: int) -> SchedulerStats:
        with self._lock:
            voice = self._voices.get(handle)
        if voice is None:
            return SchedulerStats()
        return voice.slot.stats

    # -- streams -----------------------------------------------------------------------------
    def start_stream(
        self,
        handle: int,
        text: str,
        params: SynthesisParams,
        sink: StreamSink,
        received: float | None = None,
    ) -> None:
        """Phonemise `text` (in the pool's workers, where there are any) and start its stream
        on the voice's architecture; StreamRefused where the voice is not (or no longer)
        served. Errors after this go to `sink.finish`."""
        with self._lock:
            voice = self._voices.get(handle)
            if voice is None or voice.unloading:
                raise StreamRefused("this voice is being unloaded from this server; retry")
            architecture = voice.architecture
            scheduler = architecture.scheduler
            live, capacity = _live(architecture), scheduler.capacity()
            if live >= max(capacity, MIN_ADMITTED_STREAMS):
                voice.slot.stats.refused_streams += 1
                raise StreamRefused(
                    f"this server is full: {live} live streams of the {capacity} it holds in "
                    f"real time ({scheduler.capacity_source()}); try another server",
                    "RESOURCE_EXHAUSTED",
                )
            voice.streams += 1
            architecture.admitted += 1
        counted = _CountedSink(sink, lambda: self._stream_ended(voice))

        def done(sentences: list[Sentence] | None, error: Exception | None) -> None:
            if error is not None:
                LOGGER.error("phonemising a request failed: %s", error)
                counted.finish(RuntimeError(f"could not prepare the text: {error}"))
            elif not sentences:
                counted.finish(
                    StreamRefused(
                        "TEXT has nothing to speak once control characters are removed",
                        "INVALID_ARGUMENT",
                    )
                )
            else:
                voice.architecture.scheduler.submit(
                    sentences, params, counted, received, voice=voice.slot
                )

        self._frontend_pool().submit(voice.plan.voice_config_path, text, done)

    def _frontend_pool(self, warm_config: str | None = None) -> FrontendPool:
        """The pod's phonemisers, started on first use (`warm_config`: a voice config each
        worker reads as it starts)."""
        with self._frontend_lock:
            if self._frontend is None:
                # Closed meanwhile (a start beside a warmup that came too late): no workers.
                workers = 0 if self._closed.is_set() else self._frontend_workers or 0
                self._frontend = FrontendPool(workers, warm_config, thread=NamedThread)
                LOGGER.info("phonemiser workers: %d", workers)
            return self._frontend

    def _stream_ended(self, voice: _Voice) -> None:
        with self._lock:
            voice.streams -= 1
            voice.architecture.admitted -= 1
            done = voice.unloading and voice.streams == 0
        if done:
            self._free(voice)

    def close(self) -> None:
        self._closed.set()
        for architecture in list(self._architectures.values()):
            architecture.scheduler.stop()
        self._architectures.clear()
        if self._sampler is not None:
            self._sampler.stop()
        with self._frontend_lock:  # after a start in progress
            frontend, self._frontend = self._frontend, None
        if frontend is not None:
            frontend.close()


def _report_costs(architecture: _Architecture, interval_s: float) -> None:
    """A line per interval on stderr (the server's log) with the scheduler's call totals and
    cost model per stage, where its thread's time went, what it holds (live streams, the
    streams it holds and the voices whose calls it counts) and where new streams' first audio
    spent its time, for profiling runs (COSTS_LOG_ENV)."""
    scheduler = architecture.scheduler
    while True:
        time.sleep(interval_s)
        costs = scheduler.costs
        line: dict[str, Any] = {
            stage: {
                "calls": calls,
                "seconds": round(seconds, 3),
                "rows": rows,
                "frames": frames,
                "per_call_ms": round(costs.per_call[stage] * 1000, 3),
                "per_frame_us": round(costs.per_frame[stage] * 1e6, 4),
            }
            for stage, (calls, seconds, rows, frames) in costs.totals.items()
        }
        line["scheduler"] = scheduler.step_times.report()
        line["capacity"] = {
            "live": _live(architecture),
            "held": scheduler.capacity(),
            "voices": len(scheduler.layout().voice_shares),
        }
        if scheduler.first_audio_paths is not None:
            line["first_audio_ms"] = scheduler.first_audio_paths.take()
        name = architecture.first_voice
        print(f"voxfleet-costs {name} {json.dumps(line)}", file=sys.stderr, flush=True)


def _write_stacks(sampler: StackSampler, path: Path, closed: threading.Event) -> None:
    """The sampler's stacks into `path` every STACKS_WRITE_S, replaced whole each time."""
    while not closed.wait(STACKS_WRITE_S):
        partial = path.with_name(path.name + ".partial")
        try:
            partial.write_text(sampler.collapsed())
            partial.replace(path)
        except OSError as error:
            LOGGER.error("cannot write the sampled stacks to %s: %s", path, error)
            return


class _CountedSink(StreamSink):
    """A stream's sink that says once when the stream has ended, whichever way."""

    def __init__(self, sink: StreamSink, ended: Callable[[], None]) -> None:
        self._sink = sink
        self._ended: Callable[[], None] | None = ended
        self._lock = threading.Lock()

    def audio(self, pcm: Any) -> None:
        self._sink.audio(pcm)

    def last_audio(self, pcm: Any) -> None:
        self._sink.last_audio(pcm)

    def finish(self, error: Exception | None = None) -> None:
        try:
            self._sink.finish(error)
        finally:
            with self._lock:
                ended, self._ended = self._ended, None
            if ended is not None:
                ended()

    def cancelled(self) -> bool:
        return self._sink.cancelled()

    def chunk_route(self) -> tuple[Any, Any] | None:
        return self._sink.chunk_route()


def _free_device_cache(device: str) -> None:
    if device != "gpu":
        return
    try:
        import torch

        torch.cuda.empty_cache()
    except Exception:  # nothing to give back
        LOGGER.debug("emptying the CUDA cache failed", exc_info=True)


__all__ = [
    "LoadRefused",
    "MemoryReport",
    "StreamRefused",
    "VoiceHost",
    "WindowConfig",
    "architecture_key",
]
