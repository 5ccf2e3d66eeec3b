from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from host_device import play_queued

from engines.streaming import (
    StreamScheduler,
    StreamSink,
    SynthesisParams,
    WindowConfig,
)
from engines.streaming.costs import CostModel
from engines.streaming.frames import to_pcm16
from engines.streaming.types import VoiceSlot
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice

TEXT = (
    "The quick brown fox jumps over the lazy dog, while the streaming speech service answers "
    "thousands of listeners at once without a pause."
)
QUIET = SynthesisParams(noise_scale=0.0, noise_w=0.0)


class CollectingSink(StreamSink):
    def __init__(self, cancel_after_chunks: int | None = None) -> None:
        self.chunks: list[np.ndarray] = []
        self.error: Exception | None = None
        self.done = threading.Event()
        self._cancel_after = cancel_after_chunks

    def audio(self, pcm: np.ndarray) -> None:
        self.chunks.append(pcm)

    def finish(self, error: Exception | None = None) -> None:
        self.error = error
        self.done.set()

    def cancelled(self) -> bool:
        return self._cancel_after is not None and len(self.chunks) >= self._cancel_after


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    # One whole sentence: the audio is compared with a one-shot decode of it.
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def snr_db(signal: np.ndarray, reference: np.ndarray) -> float:
    signal, reference = signal.astype(np.float64), reference.astype(np.float64)
    noise = np.sum((signal - reference) ** 2)
    return float(10 * np.log10(np.sum(reference**2) / max(noise, 1e-9)))


def run_streams(scheduler: StreamScheduler, sinks: list[CollectingSink], sentences) -> None:
    # All listeners arrive together: the scheduler's first step already sees every stream,
    # however busy the machine is when the thread starts.
    for sink in sinks:
        scheduler.submit(list(sentences), QUIET, sink)
    play_queued(scheduler, sinks)


def test_streamed_audio_matches_a_one_shot_decode(stages, sentences) -> None:
    ids = np.array([sentences[0].ids], dtype=np.int64)
    prior, mask = stages.encode(
        ids, np.array([ids.shape[1]]), np.array(QUIET.scales(), dtype=np.float32)
    )
    reference = to_pcm16(stages.vocode(stages.flow(prior, mask))[0])

    sink = CollectingSink()
    run_streams(StreamScheduler(stages, 22050), [sink], sentences)
    streamed = np.concatenate(sink.chunks)

    assert sink.error is None
    assert len(sink.chunks) > 2, "the sentence should arrive in several chunks"
    assert len(sink.chunks[0]) == WindowConfig().first_window_frames * 256
    # On onnxruntime a stream's chunks grow by half, not double: 16, 24, 36, 54, ... frames.
    frames = [len(chunk) // 256 for chunk in sink.chunks]
    assert frames[:4] == [16, 24, 36, 54]
    assert streamed.shape == reference.shape
    assert snr_db(streamed, reference) >= 40.0
    # The first chunk, what a listener hears first, starts where the sentence starts: its calls
    # take no context before it, so it is the one-shot decode's (63 dB here; with zero frames
    # before the sentence, as fixed-shape engines decode it, 34 dB).
    first = len(sink.chunks[0])
    assert snr_db(streamed[:first], reference[:first]) >= 50.0


def test_windows_of_concurrent_streams_share_vocoder_calls(stages, sentences) -> None:
    # Steps are sized by measured cost; with room in the step (a GPU's cheap batched calls,
    # here a generous step budget) windows of several live streams go in one call. (Which
    # streams share a call depends on their deadlines: a stream already playing is served
    # first, a new one may start a step later, so the exact grouping is not fixed.)
    batched = StreamScheduler(stages, 22050, windows=WindowConfig(max_step_ms=60_000))
    sinks = [CollectingSink() for _ in range(4)]
    run_streams(batched, sinks, sentences)
    assert max(batched.stats.vocoder_batches) >= 2
    assert all(s.error is None and s.chunks for s in sinks)

    unbatched = StreamScheduler(stages, 22050, cross_stream_batching=False)
    sinks = [CollectingSink() for _ in range(2)]
    run_streams(unbatched, sinks, sentences)
    assert set(unbatched.stats.vocoder_batches) == {1}
    assert all(s.error is None and s.chunks for s in sinks)


def test_a_cancelled_stream_is_freed_and_others_finish(stages, sentences) -> None:
    scheduler = StreamScheduler(stages, 22050)
    quitter, stayer = CollectingSink(cancel_after_chunks=1), CollectingSink()
    scheduler.start()
    try:
        # Long enough that the quitter still has audio to come when the scheduler next looks
        # for cancelled streams (every CANCEL_CHECK_S), however fast the machine.
        scheduler.submit(list(sentences) * 6, QUIET, quitter)
        scheduler.submit(list(sentences) * 6, QUIET, stayer)
        assert stayer.done.wait(120)
        deadline = time.monotonic() + 10
        while scheduler.live_streams() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert scheduler.live_streams() == 0
        pool = scheduler.backend.pool
        assert pool.free_pages() == pool.pages - 1, "a finished or cancelled stream kept frames"
    finally:
        scheduler.stop()
    assert stayer.error is None
    assert len(stayer.chunks) > len(quitter.chunks) >= 1


def test_a_failing_runtime_fails_streams_but_not_the_scheduler(stages, sentences) -> None:
    class Flaky:
        name = "flaky"
        broken = True

        def encode(self, *args, **kwargs):
            if Flaky.broken:
                raise RuntimeError("engine exploded")
            return stages.encode(*args, **kwargs)

        def flow(self, *args, **kwargs):
            return stages.flow(*args, **kwargs)

        def vocode(self, *args, **kwargs):
            return stages.vocode(*args, **kwargs)

    scheduler = StreamScheduler(Flaky(), 22050)
    scheduler.start()
    try:
        first = CollectingSink()
        scheduler.submit(list(sentences), QUIET, first)
        assert first.done.wait(30)
        assert first.error is not None and "engine exploded" in str(first.error)
        Flaky.broken = False
        second = CollectingSink()
        scheduler.submit(list(sentences), QUIET, second)
        assert second.done.wait(120)
        assert second.error is None and second.chunks
    finally:
        scheduler.stop()


def test_a_stream_no_longer_counts_as_live_when_its_last_audio_goes_out(stages, sentences) -> None:
    # The end travels with the last chunk: a client that asks again the moment it arrives must
    # not be refused at the stream limit on account of the stream that just ended.
    scheduler = StreamScheduler(stages, 22050)
    live_at_last: list[int] = []

    class Probe(CollectingSink):
        def last_audio(self, pcm) -> None:
            live_at_last.append(scheduler.live_streams())
            super().last_audio(pcm)

    sink = Probe()
    run_streams(scheduler, [sink], sentences)
    assert sink.error is None and len(sink.chunks) > 2
    assert live_at_last == [0]


def test_stream_seconds_count_each_stream_for_as_long_as_it_is_live(stages, sentences) -> None:
    # Their rate is the pool HPA's live streams (the adapter's load rule): every moment a
    # stream is live counts, for the scheduler and for the stream's voice, and an idle
    # scheduler between listeners counts nothing.
    class TimedSink(CollectingSink):
        def finish(self, error: Exception | None = None) -> None:
            self.finished_at = time.monotonic()
            super().finish(error)

    voice = VoiceSlot("joe")
    scheduler = StreamScheduler(stages, 22050)
    scheduler.start()
    lived = 0.0
    try:
        for _ in range(2):
            sinks = [TimedSink() for _ in range(2)]
            started = time.monotonic()
            for sink in sinks:
                scheduler.submit(list(sentences), QUIET, sink, voice=voice)
            for sink in sinks:
                assert sink.done.wait(120) and sink.error is None
                lived += sink.finished_at - started
            time.sleep(0.5)
    finally:
        scheduler.stop()
    assert lived > 0.5
    assert scheduler.stats.stream_seconds == pytest.approx(lived, rel=0.15)
    assert voice.stats.stream_seconds == pytest.approx(lived, rel=0.15)


def test_a_failing_stats_publisher_ends_no_stream(stages, sentences, caplog) -> None:
    # on_step publishes the voice's metrics (a round trip to tritonserver on the CPU): when it
    # fails, the streams go on, and the failure is logged once, not once per step.
    calls = []

    def broken(stats) -> None:
        calls.append(stats.live_streams)
        raise RuntimeError("metrics server gone")

    sinks = [CollectingSink(), CollectingSink()]
    with caplog.at_level("ERROR", logger="engines.streaming.scheduler"):
        run_streams(StreamScheduler(stages, 22050, on_step=broken), sinks, sentences)
    assert all(sink.error is None and len(sink.chunks) > 2 for sink in sinks)
    assert len(calls) > 2, "the scheduler stopped publishing after the first failure"
    logged = [r for r in caplog.records if "metrics server gone" in r.getMessage()]
    assert len(logged) == 1


def test_a_cpu_scheduler_warms_every_stage_up_before_its_first_listener(stages, sentences) -> None:
    # onnxruntime's first calls are slow and the cost model starts from guesses: the first
    # listeners after a start got late chunks. The warmup runs a stream through every stage
    # and leaves no trace a listener or a metric could see.
    published = []
    scheduler = StreamScheduler(stages, 22050, on_step=published.append)
    free = scheduler.backend.pool.free_pages()
    assert scheduler.warmup() == 0  # no shapes to prepare
    calls = {stage: total[0] for stage, total in scheduler.costs.totals.items()}
    assert calls["encoder"] == 1 and calls["flow"] >= 2 and calls["vocoder"] >= 3
    assert scheduler.live_streams() == 0 and scheduler.stats.streams_total == 0
    assert scheduler.stats.first_audio_count == 0 and not published
    assert scheduler.backend.pool.free_pages() == free
    sink = CollectingSink()
    run_streams(scheduler, [sink], sentences)
    assert sink.error is None and scheduler.stats.streams_total == 1


class TimedSink(CollectingSink):
    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[float] = []

    def audio(self, pcm: np.ndarray) -> None:
        super().audio(pcm)
        self.arrived.append(time.monotonic())


def test_a_lead_limit_sends_a_streams_audio_as_its_listener_plays_it(stages, sentences) -> None:
    """With `max_lead_ms` a playing stream waits while it has that much audio ahead of its
    listener (counted from its first chunk): its chunks come about as fast as they play, never
    late, and the audio is the same."""
    lead_s, rate = 0.3, 22050
    paced = StreamScheduler(stages, rate, windows=WindowConfig(max_lead_ms=int(lead_s * 1000)))
    # The warmup stream still runs every stage (it is not held to the limit).
    paced.warmup()
    calls = {stage: total[0] for stage, total in paced.costs.totals.items()}
    assert calls["encoder"] == 1 and calls["flow"] >= 2 and calls["vocoder"] >= 3
    sink, free = TimedSink(), TimedSink()
    run_streams(paced, [sink], sentences)
    run_streams(StreamScheduler(stages, rate), [free], sentences)

    assert sink.error is None
    assert np.array_equal(np.concatenate(sink.chunks), np.concatenate(free.chunks))
    # Audio sent ahead of its playback when each chunk came.
    sent = np.cumsum([len(c) / rate for c in sink.chunks])
    played = np.array(sink.arrived) - sink.arrived[0]
    ahead = sent - played
    assert ahead[:-1].min() > 0.0, "a chunk came after its listener had run dry"
    # At most the limit and the longest chunk (a CPU stream with a lead takes two steady
    # windows) ahead, and so the stream lasts about as long as its audio less that.
    longest = max(len(c) for c in sink.chunks) / rate
    assert ahead.max() < lead_s + longest + 0.2
    assert sent[-1] > 2 * (lead_s + longest)  # long enough to tell
    assert played[-1] > sent[-1] - (lead_s + longest) - 0.2
    # Without the limit the same audio is all there well before it has played.
    free_played = free.arrived[-1] - free.arrived[0]
    assert free_played < played[-1] - 1.0


def test_window_config_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="window_frames must be at least 1"):
        WindowConfig(window_frames=0)


def test_the_cost_model_learns_what_a_call_costs_besides_its_frames() -> None:
    # A GPU: 2 ms per call whatever its size, 1 µs per frame. Judged per frame of small calls,
    # a 128-window batch would look 60x dearer than it is, and steps would stay tiny.
    costs = CostModel()
    for _ in range(3):
        for rows in (1, 8, 32, 128, 2, 64):
            costs.observe("vocoder", 0.002 + 1e-6 * rows * 144, rows, 144)
    assert costs.per_call["vocoder"] == pytest.approx(0.002, rel=0.05)
    assert costs.estimate("vocoder", 144, new_call=False) == pytest.approx(144e-6, rel=0.05)
    assert costs.estimate("vocoder", 144) == pytest.approx(0.002 + 144e-6, rel=0.05)
    # A CPU: time proportional to frames; no per-call part is invented.
    for _ in range(3):
        for rows in (1, 3, 2, 4):
            costs.observe("flow", 5e-5 * rows * 100, rows, 100)
    assert costs.per_call["flow"] == pytest.approx(0.0, abs=1e-6)
    assert costs.per_frame["flow"] == pytest.approx(5e-5, rel=0.01)


def test_cpu_streams_take_longer_windows_with_a_lead_only_when_asked(stages, sentences) -> None:
    """A lead window (twice the steady one) saves context frames but is a call long enough to
    hold up a new listener's first audio: off unless the plan's windows ask for it
    (`WindowConfig.lead_windows`)."""
    steady = WindowConfig().window_frames * 256
    longest = {}
    for lead in (False, True):
        sink = CollectingSink()
        windows = WindowConfig(lead_windows=lead)
        run_streams(StreamScheduler(stages, 22050, windows=windows), [sink], sentences * 3)
        assert sink.error is None
        longest["1" if lead else "0"] = max(len(chunk) for chunk in sink.chunks)
    # A steady window, or one with a sentence's short tail merged (at most a first window).
    assert longest["0"] <= steady + WindowConfig().first_window_frames * 256
    # Alone, the stream races ahead of playback and takes lead windows.
    assert longest["1"] == 2 * steady
