"""A pod admits what it holds from its first second: each architecture's scheduler predicts the
real-time streams it holds from what its calls cost (engines/streaming/capacity.py), and the
voice host refuses a stream past that at once (RESOURCE_EXHAUSTED), without waiting to be
busy. Driven here through the voice host with stages of known costs: each call sleeps a fixed
time plus a time per frame, as a GPU's calls cost."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest
from known_costs import HOP, KNOWN, LEAD_MS, RATE, TEXT, KnownCosts, Listener

from engines.contract.plan import ServingPlan, WindowConfig
from engines.pod.voice_host import host as host_module
from engines.pod.voice_host.host import StreamRefused, VoiceHost
from engines.streaming import StreamSink, SynthesisParams
from engines.streaming.capacity import (
    CUT_INTERVAL_S,
    CUT_SHARE,
    FULL_BUSY,
    LATE_WINDOW_S,
    RAISE_INTERVAL_S,
    RAISE_SHARE,
    Ceiling,
    Layout,
    StreamPace,
    host_costs,
    predicted_capacity,
    stream_demand,
)
from engines.streaming.costs import CostModel


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

    def capacity(max_step_ms: int, scale: float, step_ms: int | None = None) -> int:
        costs = CostModel(fixed_part=True)
        for stage, (per_call, per_frame) in KNOWN.items():
            costs.per_call[stage], costs.per_frame[stage] = per_call, per_frame * scale
        windows = WindowConfig(max_step_ms=max_step_ms)
        layout = Layout(windows, 2.0, True, True, True, step_ms=step_ms)
        demand = stream_demand(layout, StreamPace(), RATE / HOP)
        return predicted_capacity(demand, costs, host_costs(), layout)

    assert capacity(120, 1.0) > capacity(60, 1.0) > capacity(30, 1.0)
    # Paced steps 30 ms apart pay their calls' fixed costs as often as 30 ms steps do.
    assert capacity(60, 1.0, step_ms=30) == capacity(30, 1.0)
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


def test_streams_of_many_voices_hold_fewer_where_each_voice_makes_calls_of_its_own() -> None:
    """Each voice runs with its own weights, so a step makes a call per voice where one voice's
    streams would share one: the prediction counts each live voice's calls by its share of the
    streams. Ten voices evenly hold far fewer than one; a mix that is nearly all one voice
    nearly as many; where calls cost nothing fixed (a CPU), the voices change nothing. (On an
    H200 a packed pod that counted one voice's calls predicted 3,130 streams of ten voices,
    whose streams ran late at 145.)"""

    def capacity(shares: tuple[float, ...], fixed: bool = True) -> int:
        costs = CostModel(fixed_part=fixed)
        for stage, (per_call, per_frame) in KNOWN.items():
            costs.per_call[stage], costs.per_frame[stage] = per_call if fixed else 0.0, per_frame
        layout = Layout(WindowConfig(), 2.0, True, True, True, voice_shares=shares)
        demand = stream_demand(layout, StreamPace(), RATE / HOP)
        return predicted_capacity(demand, costs, host_costs(), layout)

    one, ten = capacity((1.0,)), capacity((0.1,) * 10)
    assert ten < 0.7 * one, (ten, one)
    assert capacity((0.5, 0.5)) < one
    assert capacity((0.98, 0.02)) >= 0.85 * one
    assert capacity((0.1,) * 10, fixed=False) == capacity((1.0,), fixed=False)


def test_sentences_of_mixed_lengths_hold_fewer_streams_where_encoder_calls_are_padded() -> None:
    """Every row of a GPU's encoder call is as wide as its longest sentence: sentences of mixed
    lengths cost a call of many rows about what sentences all as long as the longest cost, not
    what sentences of their mean length cost, and the pod predicts that many fewer streams.
    On the CPU, whose encoder calls are split by length, the mix changes nothing."""
    costs = CostModel(fixed_part=True)
    for stage, (per_call, per_frame) in KNOWN.items():
        costs.per_call[stage], costs.per_frame[stage] = per_call, per_frame

    def pace(*lengths: int) -> StreamPace:
        learnt = StreamPace()
        for i in range(64):
            learnt.observe(lengths[i % len(lengths)], 282)
        return learnt

    def capacity(learnt: StreamPace, gpu: bool) -> int:
        layout = Layout(WindowConfig(max_step_ms=120), 2.0, gpu, gpu, gpu)
        demand = stream_demand(layout, learnt, RATE / HOP)
        return predicted_capacity(demand, costs, host_costs(), layout)

    even, mixed, long = pace(128), pace(32, 224), pace(224)
    assert capacity(long, True) <= capacity(mixed, True) < capacity(even, True)
    assert capacity(mixed, True) < 0.9 * capacity(even, True)
    # (The learnt mean weighs the last sentences most: within a stream of the same.)
    assert abs(capacity(mixed, False) - capacity(even, False)) <= 1


def test_streams_still_being_phonemised_count_against_what_a_pod_holds(
    voice_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's text is phonemised before the scheduler sees it: admission counts it from
    the moment it is admitted, so a burst cannot slip past the capacity meanwhile."""
    host, handle = voice_host
    scheduler = next(iter(host._architectures.values())).scheduler
    monkeypatch.setattr(scheduler, "capacity", lambda now=None: 6)
    held: list[tuple[str, object]] = []

    class Waiting:
        """Phonemisers that have not answered yet."""

        def submit(self, config: str, text: str, done) -> None:
            held.append((text, done))

    monkeypatch.setattr(host, "_frontend_pool", lambda warm_config=None: Waiting())
    listeners = [start(host, handle) for _ in range(8)]
    assert sum(listener is not None for listener in listeners) == 6
    assert scheduler.live_streams() == 0 and len(held) == 6
    # A stream that ends (here: its text has nothing to speak) makes room for one more.
    held[0][1]([], None)
    assert start(host, handle) is not None


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


def test_a_ceiling_falls_where_streams_run_late_and_rises_back_while_they_keep_up() -> None:
    """What a scheduler holds by what its streams measured (capacity.Ceiling)."""
    ceiling = Ceiling()
    assert ceiling.held(0.0, 100) == 100  # no late chunk: the prediction stands
    # One late stream of 1,000 live is noise, not a pod past what it holds.
    assert not ceiling.late(0.0, 1, 1000)
    assert ceiling.held(0.1, 1200) == 1200
    # Late streams past LATE_SHARE of the live ones within LATE_WINDOW_S: it holds a little
    # under what was live, below the prediction.
    for stream in range(2, 6):
        cut = ceiling.late(0.2, stream, 1000)
    assert cut
    assert ceiling.held(0.2, 1200) == math.floor(CUT_SHARE * 1000)
    # Late chunks go on while the streams admitted before the cut play: no second cut within
    # CUT_INTERVAL_S; a second past it, a cut to what is live then.
    for stream in range(10, 20):
        assert not ceiling.late(0.5, stream, 990)
    for stream in range(20, 30):
        ceiling.late(0.2 + CUT_INTERVAL_S, stream, 920)
    assert ceiling.held(1.2, 1200) == math.floor(CUT_SHARE * 920)
    # While the streams keep up it rises by RAISE_SHARE every RAISE_INTERVAL_S...
    held = ceiling.held(1.2 + RAISE_INTERVAL_S, 1200)
    assert held == math.floor(CUT_SHARE * 920 * (1 + RAISE_SHARE))
    # A prediction that dips below it meanwhile wins while it lasts, and does not end it.
    assert ceiling.held(1.2 + RAISE_INTERVAL_S + 0.1, 500) == 500
    assert ceiling.held(1.2 + RAISE_INTERVAL_S + 0.2, 1200) == held
    # ... and it gives way to the prediction once raised past it.
    assert ceiling.held(1.2 + 10 * RAISE_INTERVAL_S, 500) == 500
    assert ceiling.held(1.2 + 100 * RAISE_INTERVAL_S, 1200) == 1200
    assert ceiling.value is None
    # At a handful of live streams one late stream is enough.
    small = Ceiling()
    assert small.late(0.0, 1, 6) and small.held(0.0, 20) == 5
    # Turned off (VOXFLEET_LATE_CEILING=0): the prediction alone.
    off = Ceiling(enabled=False)
    assert not any(off.late(0.0, stream, 6) for stream in range(6))
    assert off.held(0.0, 20) == 20


def test_a_ceiling_cut_under_a_costly_mix_rises_with_a_cheaper_mixs_prediction() -> None:
    """Many voices' streams ran late at 200 live where the pod predicted 300 to 400; then the
    mix turns to one voice, which it predicts 2,000 of: it holds five times the cut, not the
    cut (which would refuse most of one voice's listeners), and the cut again once the mix
    turns back. A prediction that only comes back from a dip does not lift it, nor does one
    of an idle pod (no mix: one voice's figure) or of a few first streams."""
    ceiling = Ceiling()
    assert ceiling.held(0.5, 2000, live=0) == 2000  # idle
    assert ceiling.held(1.0, 1500, live=20) == 1500  # the first streams of the mix
    for second in range(2, 10):  # a noisy prediction: 400 at its highest, 300 at the cut
        assert ceiling.held(second, 400 if second % 3 else 350, live=200) in (350, 400)
    assert ceiling.held(10.0, 300, live=200) == 300
    assert any(ceiling.late(10.1, stream, 200) for stream in range(5))
    cut = math.floor(CUT_SHARE * 200)
    assert ceiling.held(10.2, 300) == cut
    assert ceiling.held(10.3, 400) == cut  # back from the dip: no higher
    assert ceiling.held(10.4, 2000) == 5 * cut  # one voice's mix
    assert ceiling.held(10.5, 400) == cut  # many voices' again
    assert ceiling.held(10.6, 100) == 100  # a lower prediction still wins while it lasts
    assert ceiling.held(10.7, 400) == cut
    # Raised while the streams keep up, it ends at the prediction of the mix it was cut in.
    assert ceiling.held(10.1 + 200 * RAISE_INTERVAL_S, 2000) == 2000
    assert ceiling.value is None


def test_late_chunks_while_a_voice_loads_do_not_cut_what_a_scheduler_holds() -> None:
    """A voice load stalls the streams for a moment: their late chunks then, and within
    LATE_WINDOW_S after, say nothing of what the pod holds; later ones cut as before."""
    ceiling = Ceiling()
    with ceiling.loading():
        now = time.monotonic()
        assert not any(ceiling.late(now, stream, 100) for stream in range(50))
    now = time.monotonic()
    assert not any(ceiling.late(now, stream, 100) for stream in range(50, 100))
    assert ceiling.held(now, 1000) == 1000
    later = now + LATE_WINDOW_S + 0.1
    assert any(ceiling.late(later, stream, 100) for stream in range(100, 110))
    assert ceiling.held(later, 1000) == math.floor(CUT_SHARE * 100)


def test_a_pod_loading_a_voice_keeps_admitting_up_to_its_prediction(joe_plan) -> None:
    """Streams that run late while the pod loads another voice of their architecture do not
    make it refuse listeners afterwards: on an H200 such cuts held a packed pod at 117
    streams where it predicted about 2,100, for minutes (docs/gpu-runs.md)."""
    host = VoiceHost(frontend_workers=0)
    try:
        host.load(joe_plan)  # the architecture
        architecture = next(iter(host._architectures.values()))
        scheduler, runtime = architecture.scheduler, architecture.runtime
        load = runtime.load_voice
        cuts: list[bool] = []

        def load_with_late_streams(*args, **kwargs):
            # Every live stream's chunk goes out late while the weights load.
            now = time.monotonic()
            cuts.extend(scheduler.ceiling.late(now, stream, 10) for stream in range(10))
            return load(*args, **kwargs)

        runtime.load_voice = load_with_late_streams
        host.load(ServingPlan("second", joe_plan.engine_dir, joe_plan.voice_config_path))
        assert cuts and not any(cuts)
        assert scheduler.ceiling.value is None
        assert scheduler.capacity_source() == "predicted from what its calls cost"
    finally:
        host.close()


def test_a_pod_that_predicts_too_much_stops_admitting_once_its_streams_run_late(
    voice_host, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the prediction is wrong (here: a cost model that believes every call costs a
    third of what it does, and learns nothing), the late chunks are measured and the pod holds
    a little under what was live then: it refuses the listeners that would have made every
    stream late, says why, and counts the late chunks."""
    host, handle = voice_host
    scheduler = next(iter(host._architectures.values())).scheduler
    for stage in scheduler.costs.per_call:
        scheduler.costs.per_call[stage] /= 3
        scheduler.costs.per_frame[stage] /= 3
    monkeypatch.setattr(scheduler.costs, "observe", lambda *args: None)
    scheduler._capacity = None
    predicted = scheduler.capacity()
    admitted: list[Listener] = []
    refusals: list[str] = []
    admitted_at_cut: int | None = None
    started = time.monotonic()
    # 40 listeners a second, each with about 10 s of audio: past what the stages hold within
    # a few seconds, and under what the model predicts for all 6.
    while time.monotonic() - started < 6.0:
        listener = Listener()
        try:
            host.start_stream(handle, TEXT, SynthesisParams(), listener)
            admitted.append(listener)
        except StreamRefused as refusal:
            assert refusal.code == "RESOURCE_EXHAUSTED"
            refusals.append(str(refusal))
            if admitted_at_cut is None and "its streams ran late with" in str(refusal):
                admitted_at_cut = len(admitted)
        time.sleep(0.025)
    held = scheduler.capacity()
    assert host.stats(handle).late_chunks > 0
    assert held < predicted, (held, predicted)
    assert admitted_at_cut is not None, refusals[-1:]  # refused, and said why
    # Without the cut it admits up to the prediction (all 135 or so). When the cut comes
    # depends on the machine: new streams waiting for their first audio are not late yet, and
    # a slow, shared machine (one-shot RTF 0.08 to 0.1 on 2026-11-30) delays it; 0.74 of the
    # prediction was seen there.
    assert len(admitted) < 0.85 * predicted, (len(admitted), predicted)
    # Once its streams ran late it took no more (the admitted ones are still playing).
    assert len(admitted) <= admitted_at_cut + 2, (len(admitted), admitted_at_cut)
