"""Test doubles of known cost: stages that compute nothing and take a known time per call and
per frame (a GPU's shape, slowed down), and a real-time listener that counts its underruns."""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import numpy as np

from engines.streaming import StreamSink
from engines.streaming.frames import BackendFeatures, HostBackend

HOP, RATE = 256, 22050
# (per call, per frame) seconds of each stage: a GPU's shape (a call's cost mostly fixed),
# slowed down so that the capacity is tens of streams, which one test thread can drive.
KNOWN = {"encoder": (6e-3, 25e-6), "flow": (1.5e-3, 3e-6), "vocoder": (7e-3, 12e-6)}
# A GPU's shape, small enough that one test thread runs 40 streams with room to spare.
FAST_GPU = {"encoder": (2e-3, 2e-6), "flow": (0.5e-3, 1e-6), "vocoder": (1.5e-3, 1e-6)}
TEXT = (
    "The quick brown fox jumps over the lazy dog near the quiet river bank. "
    "A second sentence follows the first, so that the stream lasts a while longer. "
    "And a third one keeps the listener busy until the end of the test."
)
LEAD_MS = 300
# A chunk this much later than the audio before it ran out is not counted as an underrun: a
# shared 2-core test machine delays a thread by tens of milliseconds now and then. A stream
# the scheduler leaves without audio is late by far more (100 to 190 ms when the windows were
# cut by rules that did not fit these stages).
JITTER_S = 0.05


class KnownCosts:
    """Stages that compute nothing and take a known time: each call sleeps its stage's cost.
    They run synchronously, as a CPU's stages do, so the scheduler cuts its windows by the
    CPU's rules (the runtime's name says which)."""

    name = "onnxruntime"
    multi_speaker = False

    def __init__(self, known: dict[str, tuple[float, float]] = KNOWN) -> None:
        self.known = known
        self.calls: dict[str, int] = dict.fromkeys(KNOWN, 0)

    def _spend(self, stage: str, frames: int) -> None:
        per_call, per_frame = self.known[stage]
        self.calls[stage] += 1
        time.sleep(per_call + per_frame * frames)

    def encode(self, ids, lengths, scales, speaker_ids=None):
        frames = np.ceil(np.asarray(lengths) * 2.2).astype(np.int64)
        longest = int(frames.max())
        self._spend("encoder", ids.shape[0] * ids.shape[1])
        mask = (np.arange(longest)[None, :] < frames[:, None]).astype(np.float32)[:, None, :]
        return np.zeros((len(frames), 192, longest), np.float32), mask

    def flow(self, prior, mask, speaker_ids=None):
        self._spend("flow", prior.shape[0] * prior.shape[-1])
        return np.zeros_like(prior)

    def vocode(self, latent, speaker_ids=None):
        self._spend("vocoder", latent.shape[0] * latent.shape[-1])
        return np.zeros((latent.shape[0], latent.shape[-1] * HOP), np.float32)

    def stream_backend(self) -> HostBackend:
        backend = HostBackend(self)
        backend.features = BackendFeatures(fixed_call_costs=True)  # a call's cost is mostly fixed
        return backend


class Listener(StreamSink):
    """A real-time listener: plays from its first chunk on and counts every moment its audio
    ran out before the next chunk came (an underrun)."""

    def __init__(self) -> None:
        self.asked = time.monotonic()
        self.first: float | None = None
        self.received_s = 0.0
        self.underruns = 0
        self.done = threading.Event()
        self.error: Exception | None = None

    def audio(self, pcm: np.ndarray) -> None:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        elif now - self.first > self.received_s + JITTER_S:
            self.underruns += 1
        self.received_s += len(pcm) / RATE

    def finish(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()


class AsyncKnownCosts(KnownCosts):
    """Known costs behind a GPU backend's asynchronous calls (host_device.SlowDevice), each
    call's cost mostly fixed."""

    name = "known-costs"

    def stream_backend(self) -> HostBackend:
        from host_device import SlowDevice

        backend = SlowDevice(self)
        backend.features = replace(backend.features, fixed_call_costs=True)
        return backend
