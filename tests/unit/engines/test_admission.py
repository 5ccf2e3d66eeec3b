"""A pod admits what it holds from its first second: each architecture's scheduler predicts the
real-time streams it holds from what its calls cost (engines/streaming/capacity.py), and the
voice host refuses a stream past that at once (RESOURCE_EXHAUSTED), without waiting to be
busy. Driven here through the voice host with stages of known costs: each call sleeps a fixed
time plus a time per frame, as a GPU's calls cost."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engines.contract.plan import ServingPlan, WindowConfig
from engines.pod.voice_host import host as host_module
from engines.pod.voice_host.host import StreamRefused, VoiceHost
from engines.streaming import StreamSink, SynthesisParams
from engines.streaming.capacity import (
    FULL_BUSY,
    Layout,
    StreamPace,
    host_costs,
    predicted_capacity,
    stream_demand,
)
from engines.streaming.costs import CostModel
from engines.streaming.frames import BackendFeatures, HostBackend

HOP, RATE = 256, 22050
# (per call, per frame) seconds of each stage: a GPU's shape (a call's cost mostly fixed),
# slowed down so that the capacity is tens of streams, which one test thread can drive.
KNOWN = {"encoder": (6e-3, 25e-6), "flow": (1.5e-3, 3e-6), "vocoder": (7e-3, 12e-6)}
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

    def __init__(self) -> None:
        self.calls: dict[str, int] = dict.fromkeys(KNOWN, 0)

    def _spend(self, stage: str, frames: int) -> None:
        per_call, per_frame = KNOWN[stage]
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


@pytest.fixture
def voice_host(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, joe_plan: ServingPlan):
    runtime = KnownCosts()
    monkeypatch.setattr(host_module, "load_stages", lambda *args, **kwargs: runtime)
    host = VoiceHost(frontend_workers=0)
    plan = ServingPlan(
        "paced",
        joe_plan.engine_dir,
        voice_config_path=joe_plan.voice_config_path,
        windows=WindowConfig(max_lead_ms=LEAD_MS),
    )
    handle = host.load(plan)
    yield host, handle
    host.close()


def start(host: VoiceHost, handle: int) -> Listener | None:
    listener = Listener()
    try:
        host.start_stream(handle, TEXT, SynthesisParams(), listener)
    except StreamRefused as refusal:
        assert refusal.code == "RESOURCE_EXHAUSTED"
        assert "this server is full" in str(refusal)
        return None
    return listener


def test_a_new_pod_admits_its_predicted_capacity_of_paced_listeners_and_refuses_the_rest(
    voice_host,
) -> None:
    host, handle = voice_host
    scheduler = next(iter(host._architectures.values())).scheduler
    predicted = scheduler.capacity()
    assert 10 <= predicted <= 200, predicted  # stages that cost what they do hold tens
    admitted: list[Listener] = []
    refused = 0
    started = time.monotonic()
    # Listeners arrive at a steady rate, faster than one in the predicted capacity per 50 ms.
    while time.monotonic() - started < 5.0:
        listener = start(host, handle)
        if listener is None:
            refused += 1
        else:
            admitted.append(listener)
        time.sleep(0.05)
    # Its first prediction comes from its warmup's calls; each call since has refined it.
    capacity = scheduler.capacity()
    assert len(admitted) >= 0.95 * capacity, (len(admitted), predicted, capacity)
    assert refused > 0  # it did refuse: more came than it holds
    # A burst of twice what it holds, at once: every one of them is refused.
    burst = [start(host, handle) for _ in range(2 * capacity)]
    assert sum(listener is not None for listener in burst) <= max(2, capacity // 20)
    admitted.extend(listener for listener in burst if listener is not None)
    time.sleep(3.0)
    played = [listener for listener in admitted if listener.first is not None]
    assert len(played) >= 0.9 * len(admitted)
    assert sum(listener.underruns for listener in admitted) == 0
    assert all(listener.error is None for listener in admitted if listener.done.is_set())


def test_capacity_grows_with_the_step_and_shrinks_with_what_a_call_costs() -> None:
    """The prediction follows the plan and the costs: a longer step amortises the fixed cost
    of each call over more audio, and costlier frames hold fewer streams."""

    def capacity(max_step_ms: int, scale: float) -> int:
        costs = CostModel(fixed_part=True)
        for stage, (per_call, per_frame) in KNOWN.items():
            costs.per_call[stage], costs.per_frame[stage] = per_call, per_frame * scale
        layout = Layout(WindowConfig(max_step_ms=max_step_ms), 2.0, True, True, True)
        demand = stream_demand(layout, StreamPace(), RATE / HOP)
        return predicted_capacity(demand, costs, host_costs(), layout)

    assert capacity(120, 1.0) > capacity(60, 1.0) > capacity(30, 1.0)
    assert capacity(60, 2.0) < capacity(60, 1.0)
    # Proportional costs alone (no fixed part): what one stream's second costs, FULL_BUSY of
    # the device, less the thread's share.
    costs = CostModel(fixed_part=False)
    for stage, (_, per_frame) in KNOWN.items():
        costs.per_call[stage], costs.per_frame[stage] = 0.0, per_frame
    layout = Layout(WindowConfig(), 1.5, False, False, False)
    demand = stream_demand(layout, StreamPace(), RATE / HOP)
    per_stream = sum(demand.frames[s] * costs.per_frame[s] for s in KNOWN)
    idle_host = CostModel(fixed_part=True, stages=("step",))
    idle_host.per_frame["step"] = 0.0
    assert predicted_capacity(demand, costs, idle_host, layout) == math.floor(
        FULL_BUSY / per_stream
    )


def test_a_full_pod_refuses_a_new_stream_with_resource_exhausted(
    joe_plan, monkeypatch: pytest.MonkeyPatch
) -> None:
    host = VoiceHost()
    try:
        handle = host.load(joe_plan)
        (architecture,) = host._architectures.values()
        scheduler = architecture.scheduler
        predicted = scheduler.capacity()
        held = max(predicted, host_module.MIN_ADMITTED_STREAMS)
        monkeypatch.setattr(scheduler, "live_streams", lambda: held)  # that many live streams
        with pytest.raises(StreamRefused) as refused:
            host.start_stream(handle, "Hello.", SynthesisParams(), StreamSink())
        assert refused.value.code == "RESOURCE_EXHAUSTED"
        assert f"this server is full: {held} live streams of the {predicted} it holds" in str(
            refused.value
        )
        assert host.stats(handle).refused_streams == 1
        # The load the HPAs read: live streams over what the pod holds.
        time.sleep(3 * host_module.LOAD_SAMPLE_S)
        stats = host.stats(handle)
        assert stats.capacity_streams >= 1
        assert stats.load_ratio == pytest.approx(held / stats.capacity_streams)
    finally:
        host.close()


def test_a_pod_takes_a_few_streams_whatever_it_predicts(joe_plan, monkeypatch) -> None:
    """On a machine too busy to hold even a few streams in real time a pod still takes
    MIN_ADMITTED_STREAMS: below that, it is never full."""
    host = VoiceHost()
    try:
        handle = host.load(joe_plan)
        (architecture,) = host._architectures.values()
        scheduler = architecture.scheduler
        monkeypatch.setattr(scheduler, "capacity", lambda now=None: 1)
        live = host_module.MIN_ADMITTED_STREAMS - 1
        monkeypatch.setattr(scheduler, "live_streams", lambda: live)
        sink = Listener()
        host.start_stream(handle, "Hello.", SynthesisParams(), sink)  # not refused
        live = host_module.MIN_ADMITTED_STREAMS
        with pytest.raises(StreamRefused):
            host.start_stream(handle, "Hello.", SynthesisParams(), Listener())
        assert sink.done.wait(30) and sink.error is None
    finally:
        host.close()
