"""How much audio one stream-model scheduler thread can plan and launch when the device costs
nothing: the host's own ceiling on the GPU path, to compare host-side changes with each other.

    python -m lab.scheduler_host [--streams 2000] [--seconds 10] [--lead-ms 300]
        [--voices 10 [--grouped]]

The scheduler runs as on a GPU (`DeviceBackend`: asynchronous vocoder calls, fixed window
sizes, calls padded to batch buckets) over stages that do no arithmetic: the encoder gives
zero prior frames, 2.2 frames per phoneme id, the flow and the vocoder zeros of their shapes,
all on the CPU with PyTorch. N closed-loop listeners each ask for one corpus sentence at a
time (ids from tests/gpu/data/corpus_ids.json), as `voxfleet bench` does; with `--lead-ms`,
paced as real-time listeners are (the plan's `max_lead_ms`: a stream gets no work while it has
that much audio ahead of its listener, so it lasts as long as its audio). With `--voices`, the
listeners spread evenly over that many voices, whose calls split by voice as a pool pod's do,
or with `--grouped` share one call a stage (the backend's `groups_voices`). It prints, as
JSON, the host's work alone after the first second: steps, sentences finished and audio per second
of wall time, the scheduler thread's CPU time per step (there is no device to wait for), its
wall time per step by part (`StreamScheduler.step_times`, which a server's call log reports
with VOXFLEET_COSTS_LOG_S) and the vocoder rows per step. It runs the scheduler's Python and
PyTorch's CPU tensor calls (the frame stores' gathers and scatters move real bytes), not
CUDA's launches, Triton's response path or a GPU: compare its figures with each other, not
with a server's.

The scheduler's cost model is held at the H100's figures (`H100_COSTS`, from a server's call
log), so that the planner fills its steps by their estimated device time, as on that GPU,
not only up to the 128-window limit that calls costing nothing would always reach.

Needs PyTorch; the CPU build is enough (the project's environment has none: for example
`pip install --target /tmp/torch torch` and PYTHONPATH=/tmp/torch).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from engines.contract.plan import WindowConfig
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams
from engines.streaming.costs import CostModel
from engines.streaming.types import VoiceSlot
from engines.text.frontend import Sentence

if TYPE_CHECKING:
    from engines.runtimes.device_frames import DeviceBackend

HOP = 256
SAMPLE_RATE = 22050
CHANNELS = 192
FRAMES_PER_ID = 2.2  # about the joe voice's: 305 frames for a sentence of 136 ids
PAGES_PER_STREAM = 48  # of 32 frames: the longest corpus sentence (647 ids, 1,424 frames)
CORPUS_IDS = Path(__file__).resolve().parents[1] / "tests" / "gpu" / "data" / "corpus_ids.json"
# Seconds per call and per frame (phoneme id for the encoder) of each stage through Triton on
# the H100, the last line of a server's call log at 2,000 streams (VOXFLEET_COSTS_LOG_S,
# 2026-11-24, the encoder in the step).
H100_COSTS = {
    "encoder": (12.73e-3, 1.2482e-6),
    "flow": (1.292e-3, 0.1541e-6),
    "vocoder": (0.226e-3, 2.0288e-6),
}


class HeldCosts(CostModel):
    """A cost model held at `H100_COSTS`: calls are counted in its totals, never fitted."""

    def __init__(self) -> None:
        super().__init__(fixed_part=True)
        self._hold()

    def observe(self, stage: str, seconds: float, rows: int, width: int) -> None:
        super().observe(stage, seconds, rows, width)
        self._hold()

    def _hold(self) -> None:
        for stage, (per_call, per_frame) in H100_COSTS.items():
            self.per_call[stage], self.per_frame[stage] = per_call, per_frame


class NoArithmetic:
    """The device tensor API of `TorchCudaStages` (engines/runtimes/torch_cuda/stages.py) on the
    CPU, computing nothing: zeros of each stage's output shape."""

    name = "torch-cuda"

    def __init__(self, pages: int, groups_voices: bool = False) -> None:
        import torch

        from engines.runtimes.torch_cuda.stages import DEFAULT_BATCH_BUCKETS

        self.padded_batch_buckets = DEFAULT_BATCH_BUCKETS
        self.torch = torch
        self.device = torch.device("cpu")
        self.flow_dtype = self.vocoder_dtype = torch.float32
        self.pages = pages
        # Calls may carry several voices' rows (`BackendFeatures.groups_voices`).
        self.groups_voices = groups_voices

    def encode_tensor(
        self, ids: Any, lengths: Any, scales: Any, speaker_ids: Any = None, voice: Any = None
    ) -> tuple[Any, Any]:
        torch = self.torch
        frames = np.ceil(lengths.numpy() * FRAMES_PER_ID).astype(np.int64)
        longest = int(frames.max())
        mask = torch.from_numpy(np.arange(longest)[None, :] < frames[:, None]).float()
        return torch.zeros(len(frames), CHANNELS, longest), mask[:, None, :]

    def flow_tensor(self, prior: Any, mask: Any, speaker_ids: Any = None, voice: Any = None) -> Any:
        return self.torch.zeros_like(prior)

    def vocode_tensor(self, latent: Any, speaker_ids: Any = None, voice: Any = None) -> Any:
        return self.torch.zeros(latent.shape[0], latent.shape[-1] * HOP)

    def stream_backend(self) -> DeviceBackend:
        from engines.runtimes.device_frames import DeviceBackend

        return DeviceBackend(self, initial_pages=self.pages, async_calls=True)

    # The host (numpy) calls of a `StageRuntime`: a scheduler over `stream_backend()` never
    # makes them.
    def encode(
        self, ids: np.ndarray, lengths: np.ndarray, scales: np.ndarray, speaker_ids: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError("the device backend encodes through encode_tensor")

    def flow(self, prior: np.ndarray, mask: np.ndarray, speaker_ids: Any = None) -> np.ndarray:
        raise NotImplementedError("the device backend flows through flow_tensor")

    def vocode(self, latent: np.ndarray, speaker_ids: Any = None) -> np.ndarray:
        raise NotImplementedError("the device backend vocodes through vocode_tensor")


class Listener(StreamSink):
    """A closed-loop listener: its next sentence as soon as the last one has ended."""

    def __init__(self, probe: HostProbe) -> None:
        self.probe = probe

    def audio(self, pcm: np.ndarray) -> None:
        self.probe.samples += len(pcm)

    def finish(self, error: Exception | None = None) -> None:
        if error is not None:
            self.probe.errors += 1
        self.probe.finished += 1
        self.probe.submit(self)


class HostProbe:
    def __init__(
        self,
        streams: int,
        corpus: list[list[int]],
        lead_ms: int = 0,
        voices: int = 1,
        grouped: bool = False,
    ) -> None:
        windows = WindowConfig(max_batch_windows=128, max_encoder_batch=32, max_lead_ms=lead_ms)
        # Frame stores for every listener's sentence from the start: growing them copies the
        # stores, which costs the CPU far more than a GPU.
        stages = NoArithmetic(pages=streams * PAGES_PER_STREAM, groups_voices=grouped)
        self.scheduler = StreamScheduler(stages, SAMPLE_RATE, HOP, windows=windows)
        self.scheduler.costs = HeldCosts()
        self.corpus = corpus
        self.streams = streams
        # Several voices: each a weight set of its own (an identity here), the listeners
        # spread over them evenly, as a pool pod's voice host serves them.
        self.voices = (
            [VoiceSlot(f"voice-{index:03d}", weights=object()) for index in range(voices)]
            if voices > 1
            else [None]
        )
        self.samples = self.finished = self.errors = self.submitted = 0
        self.running = True

    def submit(self, listener: Listener) -> None:
        if not self.running:
            return
        ids = self.corpus[self.submitted % len(self.corpus)]
        self.submitted += 1
        voice = self.voices[self.submitted % len(self.voices)]
        self.scheduler.submit([Sentence("", ids)], SynthesisParams(), listener, voice=voice)

    def run(self, seconds: float) -> dict[str, Any]:
        times = self.scheduler.step_times  # the scheduler thread's own accounting
        self.scheduler.start()
        for _ in range(self.streams):
            self.submit(Listener(self))
        time.sleep(1.0)  # past the first burst
        samples, steps, cpu, finished = self.samples, times.steps, times.cpu, self.finished
        calls, rows = (
            self.scheduler.costs.totals["vocoder"][0],
            self.scheduler.costs.totals["vocoder"][2],
        )
        parts = dict(times.wall)
        started = time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - started
        count = max(1, times.steps - steps)
        result = {
            "streams": self.streams,
            "voices": len(self.voices),
            "grouped": self.scheduler.rules.grouped_voices,
            "lead_ms": self.scheduler.windows.max_lead_ms,
            "seconds": round(wall, 2),
            "steps_per_s": round((times.steps - steps) / wall, 1),
            "step_cpu_ms": round((times.cpu - cpu) / count * 1e3, 3),
            # Wall time per step by part (engines.streaming.types.StepTimes).
            "step_ms": {
                part: round((total - parts[part]) / count * 1e3, 3)
                for part, total in times.wall.items()
            },
            # Vocoder rows per step, padding rows filled with windows not yet due included.
            "windows_per_step": round(
                (self.scheduler.costs.totals["vocoder"][2] - rows) / count, 1
            ),
            "vocoder_calls_per_step": round(
                (self.scheduler.costs.totals["vocoder"][0] - calls) / count, 1
            ),
            # A vocoder call's launch on the host, the moving mean the planner holds a busy
            # step's launches to a share of its budget with (`VOCODER_LAUNCH_SHARE`).
            "launch_ms": round(self.scheduler._launch_s * 1e3, 3),
            "sentences_per_s": round((self.finished - finished) / wall, 1),
            "audio_s_per_s": round((self.samples - samples) / SAMPLE_RATE / wall, 1),
            "errors": self.errors,
        }
        self.running = False
        self.scheduler.stop()
        return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--streams", type=int, default=2000, help="closed-loop listeners")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds measured")
    parser.add_argument(
        "--lead-ms", type=int, default=0, help="the listeners' lead limit (0: not paced)"
    )
    parser.add_argument("--voices", type=int, default=1, help="voices the listeners spread over")
    parser.add_argument(
        "--grouped", action="store_true", help="calls carry several voices' rows (lanes)"
    )
    args = parser.parse_args(argv)
    if args.streams < 1 or args.seconds <= 0 or args.voices < 1:
        parser.error("--streams and --voices must be at least 1 and --seconds more than 0")
    try:
        import torch
    except ImportError:
        parser.error("needs PyTorch (the CPU build is enough); see this module's docstring")
    torch.set_num_threads(1)
    corpus = [entry["ids"] for entry in json.loads(CORPUS_IDS.read_text())["sentences"]]
    probe = HostProbe(args.streams, corpus, args.lead_ms, args.voices, args.grouped)
    print(json.dumps(probe.run(args.seconds)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
