"""A pool pod's scheduler over a modelled GPU: how a planning rule changes the audio a
device-bound pod makes, for one voice, ten voices and 100 voices by Zipf(1.1), on the CPU.

    python -m lab.modelled_device [--listeners 250] [--seconds 8] [--patterns one,ten,zipf]
        [--scale 1.0] [--launch-us 700] [--lead-ms 0]

At 250 unpaced listeners a packed pod on an H200 is bound by its device: the stages' device
times add up to its steps' wall time (docs/gpu-runs.md, 2026-12-02). What ten voices make
against one then follows from what each sentence and window costs the device in the calls
the planner makes, and that is what this probe runs: the real scheduler thread, planner and
delivery thread (`StreamScheduler` over a `DeviceBackend` with the GPU's features: launched
encoder calls queued on the windows' stream, asynchronous vocoder calls, calls padded to
batch buckets), whose calls queue on one modelled CUDA stream. Each call starts when the one
before it ends (or at its launch, if later) and takes the modelled time (`DEVICE_COSTS`);
whatever waits for a call (its frame counts, its audio, the step before last) sleeps until
that end. The host's launches are modelled too (`--launch-us` of the thread's time a vocoder
or encoder launch, as an H200 pod's thread spent about 0.6 to 0.9 ms on one): the planner
holds a busy step's launches to a share of it. The frame stores move no bytes (the pod's
gathers and scatters are device work, in the calls' costs).

The costs are the H200 pool pod's, from its call log (`VOXFLEET_COSTS_LOG_S`, build
`b4e4680`, 2026-12-02; `results/gpu-packing-unpaced-turns-h200-2026-12-02-1.log.gz`): an
encoder call, with its sentences' flow and take-up, 4.0 ms and 1.45 us a row and padded
phoneme id (the pod's fit: 11.0 ms for ten voices' calls of 16 sentences, 14.9 for one
voice's of 26); a vocoder call as its CUDA graph's time at the row bucket
(`VOCODER_MS_144`, 144-frame windows, `STAGE=warmup`, 2026-11-29), by its width. What it
prints are ratios to compare planning rules with, side by side in one run: a model, not a
measurement of any GPU (its host is this machine's, and the costs do not vary).

Each listener asks for one corpus sentence at a time, unpaced (paced with `--lead-ms`, the
lead limit), and its voice is drawn as the packing benchmark draws it
(`engines.bench.systems.popularity_weights`). Settings are read from the environment as the
scheduler reads them (`VOXFLEET_ENCODE_SHARE`, `VOXFLEET_ENCODER_CALLS`, ...), so
`env VOXFLEET_...=... python -m lab.modelled_device` compares a rule.

Needs PyTorch; the CPU build is enough (see lab/scheduler_host.py).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import threading
import time
from typing import Any

import numpy as np

from engines.bench.systems import popularity_weights
from engines.contract.plan import WindowConfig
from engines.runtimes.device_frames import DeviceBackend
from engines.streaming import StreamScheduler, StreamSink, SynthesisParams
from engines.streaming.costs import CostModel
from engines.streaming.types import VoiceSlot
from engines.text.frontend import Sentence
from lab.scheduler_host import CORPUS_IDS, FRAMES_PER_ID, HOP, SAMPLE_RATE, NoArithmetic

# A vocoder call's CUDA graph on the H200 by its padded rows, 144-frame windows, in ms
# (docs/gpu-runs.md, "Autotuning only where it pays": 1, 4, 8, 16 and 64 rows measured, the
# others between them; cuDNN's heuristics below 16 rows, its autotuning from 16, as a pod's).
VOCODER_MS_144 = {1: 0.43, 2: 0.62, 4: 0.85, 8: 1.56, 16: 1.92, 32: 3.6, 64: 6.73, 128: 13.1}
# An encoder call with its sentences' whole-sentence flow: fixed seconds, and seconds a row
# and padded phoneme id (a GPU pads a call's ids to a multiple of 32).
ENCODER_COSTS = (4.0e-3, 1.45e-6)
ENCODER_ID_MULTIPLE = 32
PATTERNS = {"one": (1, "even"), "ten": (10, "even"), "zipf": (100, "zipf:1.1")}


def vocoder_bucket(rows: int) -> int:
    return next((b for b in sorted(VOCODER_MS_144) if b >= rows), max(VOCODER_MS_144))


def vocoder_seconds(rows: int, width: int) -> float:
    """A vocoder call's modelled device time: its row bucket's graph, by width."""
    return VOCODER_MS_144[vocoder_bucket(rows)] * max(0.25, width / 144) / 1000


def encoder_seconds(rows: int, ids: int) -> float:
    padded = math.ceil(ids / ENCODER_ID_MULTIPLE) * ENCODER_ID_MULTIPLE
    return ENCODER_COSTS[0] + ENCODER_COSTS[1] * rows * padded


class ModelledStream:
    """One CUDA stream's queue: each call starts when the one before ends, or at its launch."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.free_at = 0.0
        self.busy = 0.0  # device seconds queued so far
        self.by_stage: dict[str, float] = {"encoder": 0.0, "vocoder": 0.0}
        # The vocoder's frames (rows x width) computed so far, and those of padding rows.
        self.frames = self.padding = 0
        self._lock = threading.Lock()

    def queue(self, stage: str, seconds: float) -> tuple[float, float]:
        """(its end on time.monotonic's clock, its seconds)."""
        seconds *= self.scale
        with self._lock:
            self.free_at = max(time.monotonic(), self.free_at) + seconds
            self.busy += seconds
            self.by_stage[stage] += seconds
            return self.free_at, seconds


def _sleep_until(at: float) -> None:
    left = at - time.monotonic()
    if left > 0:
        time.sleep(left)


def _spin(seconds: float) -> None:
    """The host's time to launch a call (a CUDA launch is the thread's own work)."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


class ModelledCall:
    """A launched call's end on the modelled stream: the interface of a CUDA call's events
    (`EncoderCall`, `PendingAudio`, `DeviceTiming`) as the scheduler uses them."""

    def __init__(self, end: float, seconds: float, result: Any = None) -> None:
        self._end, self._seconds, self._result = end, seconds, result

    def done(self) -> bool:
        return time.monotonic() >= self._end

    def wait(self) -> None:
        _sleep_until(self._end)

    def seconds(self) -> float:
        self.wait()
        return self._seconds

    def finish(self) -> Any:  # an encoder call's (prior, frames)
        self.wait()
        return self._result

    def result(self) -> tuple[np.ndarray, float]:  # a vocoder call's (PCM, seconds)
        self.wait()
        return self._result, self._seconds

    def stop(self) -> ModelledCall:
        return self


class ModelledTiming(ModelledCall):
    """The device time queued between its start and `stop()`."""

    def __init__(self, stream: ModelledStream) -> None:
        super().__init__(0.0, 0.0)
        self._stream, self._started = stream, stream.busy

    def stop(self) -> ModelledTiming:
        self._end, self._seconds = self._stream.free_at, self._stream.busy - self._started
        return self


class ModelledStages(NoArithmetic):
    """`NoArithmetic` with a GPU runtime's launch features (encoder calls launched and queued
    on the windows' stream, as `TorchCudaStages` with its default `encoder_launch`)."""

    encodes_beside = True
    encoder_queued = True
    launches_encoder = True
    encoder_calls_in_flight = 3  # torch_cuda.stages.QUEUED_ENCODER_CALLS_IN_FLIGHT

    def __init__(self, pages: int, scale: float, launch_s: float) -> None:
        super().__init__(pages)
        self.stream = ModelledStream(scale)
        self.launch_s = launch_s

    def stream_backend(self) -> DeviceBackend:
        return ModelledBackend(self, initial_pages=self.pages, async_calls=True)


class ModelledBackend(DeviceBackend):
    """A `DeviceBackend` whose calls queue on the modelled stream and move no bytes."""

    runtime: ModelledStages

    def encode_launch(self, ids, lengths, scales, speakers, voice=None) -> ModelledCall:
        _spin(self.runtime.launch_s)
        frames = np.ceil(np.asarray(lengths) * FRAMES_PER_ID).astype(np.int64)
        end, seconds = self.runtime.stream.queue(
            "encoder", encoder_seconds(len(frames), ids.shape[1])
        )
        return ModelledCall(end, seconds, (None, frames))

    def flow_sentences(self, prior, tables, frames, speakers, voice=None) -> bool:
        return True  # (its device time is in the encoder call's)

    def vocode_async(self, tables, starts, limits, width, speakers, cut, voice=None):
        _spin(self.runtime.launch_s)
        stream, rows = self.runtime.stream, len(starts)
        end, seconds = stream.queue("vocoder", vocoder_seconds(rows, width))
        stream.frames += vocoder_bucket(rows) * width
        stream.padding += (vocoder_bucket(rows) - rows) * width
        pcm = np.zeros((len(starts), cut[1] - cut[0]), dtype=np.int16)
        return ModelledCall(end, seconds, pcm)

    def timer(self) -> ModelledTiming:  # type: ignore[override]  # (its interface, not its type)
        return ModelledTiming(self.runtime.stream)

    def sync(self) -> None:
        _sleep_until(self.runtime.stream.free_at)


class Listener(StreamSink):
    """A closed-loop, unpaced listener: its next sentence as soon as the last one has ended."""

    def __init__(self, probe: Probe) -> None:
        self.probe = probe
        self.asked = time.monotonic()
        self.first: float | None = None

    def audio(self, pcm: np.ndarray) -> None:
        if self.first is None:
            self.first = time.monotonic()
            self.probe.first_audio.append(self.first - self.asked)
        self.probe.samples += len(pcm)

    def finish(self, error: Exception | None = None) -> None:
        if error is not None:
            self.probe.errors += 1
        self.probe.submit()


class Probe:
    def __init__(
        self,
        listeners: int,
        voices: int,
        popularity: str,
        scale: float,
        launch_s: float,
        lead_ms: int = 0,
    ) -> None:
        windows = WindowConfig(max_batch_windows=128, max_encoder_batch=32, max_lead_ms=lead_ms)
        self.stages = ModelledStages(listeners * 48, scale, launch_s)
        self.scheduler = StreamScheduler(self.stages, SAMPLE_RATE, HOP, windows=windows)
        costs = CostModel(fixed_part=True)  # seeded as a pod's warmup seeds it, then fitted
        costs.per_call["encoder"], costs.per_frame["encoder"] = ENCODER_COSTS
        costs.per_call["vocoder"], costs.per_frame["vocoder"] = 0.4e-3 * scale, 0.9e-6 * scale
        costs.per_call["encoder"] *= scale
        costs.per_frame["encoder"] *= scale
        self.scheduler.costs = costs
        self.corpus = [entry["ids"] for entry in json.loads(CORPUS_IDS.read_text())["sentences"]]
        self.voices = [VoiceSlot(f"voice-{index:03d}", weights=object()) for index in range(voices)]
        self.weights = popularity_weights(voices, popularity)
        self.random = random.Random(0)
        self.listeners = listeners
        self.samples = self.errors = self.submitted = 0
        self.first_audio: list[float] = []
        self.running = True

    def submit(self) -> None:
        if not self.running:
            return
        ids = self.corpus[self.submitted % len(self.corpus)]
        self.submitted += 1
        voice = self.random.choices(self.voices, self.weights)[0]
        self.scheduler.submit([Sentence("", ids)], SynthesisParams(), Listener(self), voice=voice)

    def run(self, seconds: float) -> dict[str, Any]:
        scheduler, stream = self.scheduler, self.stages.stream
        scheduler.start()
        for _ in range(self.listeners):
            self.submit()
        time.sleep(2.0)  # past the first burst
        burst = sorted(self.first_audio[: self.listeners]) or [0.0]
        samples, busy, first = self.samples, stream.busy, len(self.first_audio)
        late = scheduler.stats.late_chunks
        stages, frames, padding = dict(stream.by_stage), stream.frames, stream.padding
        totals = {stage: list(scheduler.costs.totals[stage]) for stage in ("encoder", "vocoder")}
        steps = scheduler.step_times.steps
        started = time.perf_counter()
        time.sleep(seconds)
        wall = time.perf_counter() - started
        audio = (self.samples - samples) / SAMPLE_RATE / wall
        calls = {
            stage: [
                now - then for now, then in zip(scheduler.costs.totals[stage], before, strict=True)
            ]
            for stage, before in totals.items()
        }
        waits = sorted(self.first_audio[first:]) or [0.0]
        errors = self.errors  # (before the stop, which ends every stream)
        self.running = False
        scheduler.stop()
        return {
            "audio_s_per_s": round(audio, 1),
            "device_busy": round((stream.busy - busy) / wall, 3),
            "device_share": {
                stage: round((stream.by_stage[stage] - then) / wall, 3)
                for stage, then in stages.items()
            },
            # The vocoder's frames computed that were padding rows, and all it computed for
            # each frame of audio sent (padding, context and overlap).
            "vocoder_padding": round(
                (stream.padding - padding) / max(1, stream.frames - frames), 3
            ),
            "vocoder_frames_per_audio_frame": round(
                (stream.frames - frames) / max(1, self.samples - samples) * HOP, 2
            ),
            "audio_per_device_s": round(audio * wall / max(1e-9, stream.busy - busy), 1),
            "steps_per_s": round((scheduler.step_times.steps - steps) / wall, 1),
            "encoder_rows_per_call": round(calls["encoder"][2] / max(1, calls["encoder"][0]), 1),
            "vocoder_rows_per_call": round(calls["vocoder"][2] / max(1, calls["vocoder"][0]), 1),
            "encoder_calls_per_s": round(calls["encoder"][0] / wall, 1),
            "first_audio_p50_ms": round(1000 * waits[len(waits) // 2], 1),
            "first_audio_p95_ms": round(1000 * waits[int(len(waits) * 0.95)], 1),
            # The first listeners', all asking at once (of those heard within 2 s).
            "burst_first_audio_p95_ms": round(1000 * burst[int(len(burst) * 0.95)], 1),
            "burst_heard": len(burst),
            "late_chunks": scheduler.stats.late_chunks - late,
            "errors": errors,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--listeners", type=int, default=250, help="closed-loop listeners")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds measured")
    parser.add_argument("--patterns", default="one,ten,zipf", help="of one, ten, zipf")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="the device's costs times this (a slow host)"
    )
    parser.add_argument(
        "--lead-ms", type=int, default=0, help="listeners' lead limit (0: unpaced; 300: paced)"
    )
    parser.add_argument(
        "--launch-us", type=float, default=700.0, help="the host's time to launch a call"
    )
    args = parser.parse_args(argv)
    patterns = args.patterns.split(",")
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown or args.listeners < 1 or args.seconds <= 0 or args.scale <= 0:
        parser.error(f"patterns are of {', '.join(PATTERNS)}; listeners, seconds, scale > 0")
    try:
        import torch
    except ImportError:
        parser.error("needs PyTorch (the CPU build is enough); see lab/scheduler_host.py")
    torch.set_num_threads(1)
    results = {}
    for pattern in patterns:
        voices, popularity = PATTERNS[pattern]
        probe = Probe(
            args.listeners, voices, popularity, args.scale, args.launch_us / 1e6, args.lead_ms
        )
        results[pattern] = probe.run(args.seconds)
    one = results.get("one", {}).get("audio_s_per_s")
    for pattern, result in results.items():
        if one and pattern != "one":
            result["against_one"] = round(result["audio_s_per_s"] / one, 3)
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
