"""The scheduler with an encoder that runs beside the windows (a GPU backend's
`encodes_beside`): it goes on stepping while an encoder call runs and takes the sentences up
once their frame counts are there. Host frame stores stand in for the GPU's, with encoder
calls that finish only when the test says so; the audio must be that of the inline encoder."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from host_device import QUIET, TEXT, HostStages, Sink, Timing, play_queued

from engines.contract.plan import WindowConfig
from engines.runtimes.onnx import OnnxStages
from engines.streaming import StreamScheduler, planner
from engines.streaming import scheduler as scheduler_module
from engines.streaming.frames import HostBackend
from engines.streaming.types import VoiceSlot
from engines.text.frontend import Sentence, text_to_sentences
from engines.text.voice import Voice


class _Call:
    """An encoder call that is done once its backend's gate is open."""

    def __init__(self, backend: BesideBackend, args: tuple[Any, ...]) -> None:
        self.backend, self.args = backend, args

    def done(self) -> bool:
        return self.backend.gate.is_set()

    def finish(self) -> tuple[Any, np.ndarray]:
        self.backend.finished += 1
        return HostBackend.encode(self.backend, *self.args)

    def seconds(self) -> float:
        return 0.001


class BesideBackend(HostBackend):
    def __init__(self, runtime: Any, beside: bool) -> None:
        super().__init__(runtime, initial_pages=512)
        self.features = replace(self.features, encodes_beside=beside)
        self.gate = threading.Event()
        self.gate.set()
        self.launched = self.finished = 0
        self.windows_while_encoding = 0
        self._vocode = HostBackend.vocode

    def encode_launch(self, ids, lengths, scales, speakers, voice=None) -> _Call:
        self.launched += 1
        return _Call(self, (ids, lengths, scales, speakers))

    def vocode(self, *args: Any) -> np.ndarray:
        if not self.gate.is_set():
            self.windows_while_encoding += 1
        return self._vocode(self, *args)

    def timer(self) -> Timing:
        return Timing()


def beside_stages(stages: OnnxStages, beside: bool) -> HostStages:
    return HostStages(stages, BesideBackend(stages, beside))


@pytest.fixture(scope="module")
def sentences(joe: Voice) -> list[Sentence]:
    return text_to_sentences(TEXT, joe.config, phrase_chars=None)


def run(scheduler: StreamScheduler, sinks: list[Sink], sentences: list[Sentence]) -> None:
    for sink in sinks:
        scheduler.submit(list(sentences), QUIET, sink)
    for sink in sinks:
        assert sink.done.wait(120), "a stream never finished"


def assert_same_audio(reference: list[Sink], heard: list[Sink]) -> None:
    """Every listener of `heard` got, without an error, the audio of its counterpart in
    `reference` (as long, and above 60 dB: calls batch other rows together, so the float sums
    differ in their last bits)."""
    for plain, other in zip(reference, heard, strict=True):
        assert other.error is None and plain.error is None
        expected = np.concatenate(plain.chunks).astype(np.float64)
        audio = np.concatenate(other.chunks).astype(np.float64)
        assert len(audio) == len(expected)
        noise = np.sum((audio - expected) ** 2)
        assert 10 * np.log10(np.sum(expected**2) / max(noise, 1e-9)) > 60.0


def test_sentences_encoded_beside_the_windows_give_the_inline_encoders_audio(
    stages, sentences
) -> None:
    assert len(sentences) == 2
    results = {}
    for beside in (False, True):
        runtime = beside_stages(stages, beside)
        scheduler = StreamScheduler(runtime, 22050)
        scheduler.start()
        try:
            sinks = [Sink() for _ in range(3)]
            run(scheduler, sinks, sentences)
        finally:
            scheduler.stop()
        results[beside] = sinks
        if beside:
            # Every sentence went through a launched call, each taken up once.
            assert runtime.backend.launched >= 2
            assert runtime.backend.finished == runtime.backend.launched
        else:
            assert runtime.backend.launched == 0
    for inline, beside in zip(results[False], results[True], strict=True):
        assert beside.error is None
        assert [len(c) for c in beside.chunks] == [len(c) for c in inline.chunks]
        # Calls batch other rows together, so the float sums differ in their last bits.
        reference = np.concatenate(inline.chunks).astype(np.float64)
        noise = np.sum((np.concatenate(beside.chunks) - reference) ** 2)
        assert 10 * np.log10(np.sum(reference**2) / max(noise, 1e-9)) > 60.0


def test_playing_streams_get_windows_while_an_encoder_call_runs(stages, sentences) -> None:
    runtime = beside_stages(stages, beside=True)
    backend = runtime.backend
    scheduler = StreamScheduler(runtime, 22050)
    scheduler.start()
    try:
        playing = Sink()
        scheduler.submit(list(sentences), QUIET, playing)
        deadline = time.monotonic() + 60
        while not playing.chunks and time.monotonic() < deadline:
            time.sleep(0.005)
        assert playing.chunks, "no first audio"
        backend.gate.clear()  # the next encoder call runs until the gate opens
        late = Sink()
        scheduler.submit(sentences[:1], QUIET, late)
        time.sleep(0.5)
        assert not late.chunks, "audio before its encoder call was done"
        assert backend.windows_while_encoding > 0, "the playing stream waited for the encoder"
        backend.gate.set()
        assert late.done.wait(60) and playing.done.wait(60)
        assert late.error is None and late.chunks
        assert playing.error is None
    finally:
        backend.gate.set()
        scheduler.stop()


def test_a_stream_cancelled_while_encoded_ends_and_gives_its_frames_back(stages, sentences) -> None:
    runtime = beside_stages(stages, beside=True)
    backend = runtime.backend
    free = backend.pool.free_pages()
    scheduler = StreamScheduler(runtime, 22050)
    scheduler.start()
    try:
        backend.gate.clear()
        gone = Sink()
        scheduler.submit(sentences[:1], QUIET, gone)
        deadline = time.monotonic() + 5
        while not backend.launched and time.monotonic() < deadline:
            time.sleep(0.005)
        assert backend.launched == 1
        gone.cancel = True  # the client hangs up while its sentence is being encoded
        assert gone.done.wait(5), "a cancelled stream waited for its encoder call"
        assert "cancel" in str(gone.error)
        other = Sink()
        scheduler.submit(sentences[:1], QUIET, other)
        backend.gate.set()
        assert other.done.wait(60) and other.error is None and other.chunks
        deadline = time.monotonic() + 5
        while backend.pool.free_pages() != free and time.monotonic() < deadline:
            time.sleep(0.01)
        assert backend.pool.free_pages() == free
        assert backend.finished == backend.launched == 2
    finally:
        backend.gate.set()
        scheduler.stop()


def test_a_backend_may_keep_more_encoder_calls_in_flight_and_no_more(stages, sentences) -> None:
    """New sentences get a call of their own while earlier calls run, up to the backend's
    `encoder_calls_in_flight` (an encoder queued on the windows' stream); then they wait."""
    runtime = beside_stages(stages, beside=True)
    backend = runtime.backend
    backend.features = replace(backend.features, encoder_calls_in_flight=2)
    scheduler = StreamScheduler(runtime, 22050)
    scheduler.start()
    sinks = [Sink() for _ in range(3)]
    try:
        backend.gate.clear()  # no call is done until the gate opens
        for count, sink in enumerate(sinks, start=1):
            scheduler.submit(sentences[:1], QUIET, sink)
            deadline = time.monotonic() + 5
            while backend.launched < min(count, 2) and time.monotonic() < deadline:
                time.sleep(0.005)
        time.sleep(0.3)
        assert backend.launched == 2, "a third call while two were in flight"
        backend.gate.set()
        for sink in sinks:
            assert sink.done.wait(60) and sink.error is None and sink.chunks
        assert backend.launched == backend.finished == 3
    finally:
        backend.gate.set()
        scheduler.stop()


def counted(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """What the planner's fill `name` returns, call by call (windows it added), from now on."""
    joined: list[int] = []
    fill = getattr(planner, name)

    def count(*args: Any) -> int:
        joined.append(fill(*args))
        return joined[-1]

    monkeypatch.setattr(planner, name, count)
    return joined


def test_windows_run_early_in_a_calls_padding_rows_give_the_same_audio(
    stages, sentences, monkeypatch
) -> None:
    """A backend whose calls are padded to batch buckets (CUDA graphs) gets windows that are
    not due yet in its padding rows (planner.fill_buckets): every stream's chunks and audio
    stay those of a backend without buckets."""
    joined = counted(monkeypatch, "fill_buckets")
    results, windows = {}, {}
    for buckets in ((), (4, 8)):
        runtime = beside_stages(stages, beside=False)
        runtime.backend.features = replace(runtime.backend.features, batch_buckets=buckets)
        scheduler = StreamScheduler(runtime, 22050)
        assert scheduler.rules.batch_buckets == buckets
        scheduler.start()
        try:
            sinks = [Sink() for _ in range(6)]
            run(scheduler, sinks, sentences * 2)
        finally:
            scheduler.stop()
        results[buckets] = sinks
        batches = scheduler.stats.vocoder_batches
        windows[buckets] = sum(size * count for size, count in batches.items())
    # Windows went early into rows that were padding (8 to 16 of the 60 here), and the audio
    # below is the same. The calls saved are not asserted: how many calls the plain run makes
    # depends on how its windows line up, which moves with the machine's speed (27 to 43 in
    # runs on one machine, against 24 to 27 with the fill); the GPU benchmarks measure the
    # saving (docs/history.md).
    assert windows[(4, 8)] == windows[()]
    assert sum(joined) > 0
    for plain, filled in zip(results[()], results[(4, 8)], strict=True):
        assert filled.error is None
        assert [len(c) for c in filled.chunks] == [len(c) for c in plain.chunks]
        reference = np.concatenate(plain.chunks).astype(np.float64)
        noise = np.sum((np.concatenate(filled.chunks) - reference) ** 2)
        assert 10 * np.log10(np.sum(reference**2) / max(noise, 1e-9)) > 60.0


class _Launched:
    """A vocoder call's audio, there at once (`vocode_async` of a device backend)."""

    def __init__(self, pcm: np.ndarray) -> None:
        self.pcm = pcm

    def result(self) -> tuple[np.ndarray, float]:
        return self.pcm, 0.001

    def wait(self) -> None:
        return None


class QueuedBackend(BesideBackend):
    """Encoder calls queued on the windows' stream (the plan's encoder_launch "queued"),
    vocoder calls launched without waiting: a GPU backend's asynchronous path."""

    def __init__(self, runtime: Any, beside: bool) -> None:
        super().__init__(runtime, beside)
        self.features = replace(self.features, async_calls=True, encoder_queued=True)

    def vocode_async(self, *args: Any) -> _Launched:
        return _Launched(self.vocode(*args))


def test_a_queued_encoder_call_with_windows_behind_it_is_taken_up_without_polling(
    stages, sentences
) -> None:
    """On a device stream a queued encoder call ends before the windows launched after it: the
    scheduler takes its sentences up then, not only once a poll finds it done, so their first
    windows go out a step sooner."""
    runtime = beside_stages(stages, beside=True)
    runtime.backend = QueuedBackend(stages, beside=True)
    backend = runtime.backend
    scheduler = StreamScheduler(runtime, 22050)
    assert scheduler._async
    scheduler.start()
    try:
        playing = Sink()
        scheduler.submit(list(sentences) * 3, QUIET, playing)
        deadline = time.monotonic() + 60
        while not playing.chunks and time.monotonic() < deadline:
            time.sleep(0.005)
        assert playing.chunks, "no first audio"
        backend.gate.clear()  # no poll finds the next encoder call done
        late = Sink()
        scheduler.submit(sentences[:1], QUIET, late)
        assert late.done.wait(60), "the queued call was never taken up"
        assert late.error is None and late.chunks
        assert backend.windows_while_encoding > 0
        assert backend.finished == backend.launched
    finally:
        backend.gate.set()
        scheduler.stop()


class FirstAudioSink(Sink):
    def __init__(self) -> None:
        super().__init__()
        self.first_at: float | None = None

    def audio(self, pcm: np.ndarray) -> None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        super().audio(pcm)


def test_a_new_streams_first_window_does_not_wait_for_the_next_paced_step(
    stages, sentences
) -> None:
    """Where streams rest on their lead, a step that leaves no work waiting is followed by the
    next only `paced_step_ms` later. A new stream's encoder call queued behind the windows ends
    long before that: its first window goes out as soon as its frame counts are there, as with
    the encoder inline in the step, not at the next paced step."""
    pace_s = 1.0
    runtime = beside_stages(stages, beside=True)
    runtime.backend = QueuedBackend(stages, beside=True)
    backend = runtime.backend
    launched: list[float] = []
    launch = backend.encode_launch

    def timed_launch(*args: Any, **kwargs: Any) -> _Call:
        launched.append(time.monotonic())
        return launch(*args, **kwargs)

    backend.encode_launch = timed_launch  # type: ignore[method-assign]
    windows = WindowConfig(max_lead_ms=4000, paced_step_ms=int(pace_s * 1000))
    scheduler = StreamScheduler(runtime, 22050, windows=windows)
    scheduler.start()
    try:
        resting = Sink()
        scheduler.submit(list(sentences) * 4, QUIET, resting)
        deadline = time.monotonic() + 60
        # Until it rests on its lead: steps are paced from then on.
        while scheduler._rest_until is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert scheduler._rest_until is not None, "the stream never rested on its lead"
        new = FirstAudioSink()
        before = len(launched)
        scheduler.submit(sentences[:1], QUIET, new)
        assert new.done.wait(60) and new.error is None and new.first_at is not None
        (encoded_at,) = launched[before : before + 1]
        assert new.first_at - encoded_at < pace_s / 2, new.first_at - encoded_at
    finally:
        scheduler.stop()


def test_a_steps_encoder_calls_are_all_launched_before_any_is_waited_for(stages, sentences) -> None:
    """With the encoder inline on a backend that launches it (`launches_encoder`), a step's
    encoder calls (one per voice) are queued together and their frame counts read after: the
    device runs them back to back instead of idling while the host waits for each."""
    from engines.streaming.types import VoiceSlot

    runtime = beside_stages(stages, beside=False)
    backend = runtime.backend
    backend.features = replace(backend.features, launches_encoder=True)
    order: list[str] = []
    launch, finish = backend.encode_launch, _Call.finish

    def launched(*args: Any, **kwargs: Any) -> _Call:
        order.append("launch")
        return launch(*args, **kwargs)

    def finished(self: _Call) -> tuple[Any, np.ndarray]:
        order.append("finish")
        return finish(self)

    backend.encode_launch = launched  # type: ignore[method-assign]
    scheduler = StreamScheduler(runtime, 22050)
    for stage in scheduler.costs.per_frame:  # a GPU's: both new listeners fit one step
        scheduler.costs.per_frame[stage] = 1e-6
    voices = [VoiceSlot("a"), VoiceSlot("b")]
    sinks = [Sink(), Sink()]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_Call, "finish", finished)
        for sink, voice in zip(sinks, voices, strict=True):
            scheduler.submit(list(sentences), QUIET, sink, voice=voice)
        play_queued(scheduler, sinks)
    assert all(sink.error is None and sink.chunks for sink in sinks)
    # The first step encodes both voices' first sentences: two launches, then two finishes.
    assert order[:4] == ["launch", "launch", "finish", "finish"]
    assert backend.launched == backend.finished >= 4


class WholeSentenceBackend(QueuedBackend):
    """A GPU backend's path on the CPU with its flow over whole sentences after the encoder
    (`flow_sentences`), so that every window's frames are flowed before it is planned, and
    calls padded to batch buckets of 4 and 8."""

    def __init__(self, runtime: Any) -> None:
        super().__init__(runtime, beside=False)
        self.features = replace(
            self.features, encodes_beside=False, sentence_flow=True, batch_buckets=(4, 8)
        )

    def flow_sentences(self, prior, tables, frames, speakers, voice=None) -> bool:
        self.store_prior(prior, tables, frames)
        count = len(tables)
        zeros = np.zeros(count, np.int64)
        frames = np.asarray(frames, np.int64)
        self.flow(tables, zeros, frames, int(frames.max()), 0, frames, speakers, voice)
        return True


class SameVoice:
    """The joe voice's stages under weights of their own: a voice of its own to the
    scheduler (its calls split from the other's), with the same audio."""

    def __init__(self, stages: OnnxStages) -> None:
        self.stages = stages

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stages, name)


def test_a_calls_padding_rows_take_unpaced_streams_next_windows_with_the_same_audio(
    stages, sentences, monkeypatch
) -> None:
    """Unpaced listeners of two voices on a backend whose calls are padded to buckets and
    whose sentences are flowed whole: the rows still empty after `fill_buckets` take the
    windows that follow the call's own (planner.fill_with_next_windows), two or more of a
    stream in one call, and every listener hears the audio it hears with them turned off
    (VOXFLEET_NEXT_WINDOWS=0), each chunk in order and none after its last. (The calls saved
    are not asserted: how many a run makes moves with the machine's speed, as in the test
    above; the GPU runs measure it.)"""
    joined = counted(monkeypatch, "fill_with_next_windows")
    voices = [VoiceSlot("a", weights=SameVoice(stages)), VoiceSlot("b", weights=SameVoice(stages))]
    results = {}
    for setting in ("0", "1"):
        monkeypatch.setenv("VOXFLEET_NEXT_WINDOWS", setting)
        runtime = HostStages(stages, WholeSentenceBackend(stages))
        scheduler = StreamScheduler(runtime, 22050)
        assert scheduler.rules.next_windows == (setting == "1")
        scheduler.start()
        try:
            sinks = [Sink() for _ in range(20)]
            for row, sink in enumerate(sinks):
                scheduler.submit(list(sentences), QUIET, sink, voice=voices[row % 2])
            for sink in sinks:
                assert sink.done.wait(120), "a stream never finished"
        finally:
            scheduler.stop()
        results[setting] = sinks
    assert sum(joined) > 0
    assert_same_audio(results["0"], results["1"])


def test_one_voices_steps_take_two_encoder_calls_and_next_windows_with_the_same_audio(
    stages, sentences, monkeypatch
) -> None:
    """Unpaced listeners of one voice, more of them than an encoder call's rows (8 here), on a
    backend whose calls are padded to buckets and whose sentences are flowed whole: with two
    encoder calls a step (VOXFLEET_ENCODER_CALLS=2, the default) a step takes more new
    sentences than one call holds, split into calls of at most 8 rows, and its calls' padding
    rows take next windows; every listener hears the audio it hears with one call a step and
    no next windows for one voice (=1), each chunk in order and none after its last."""
    joined = counted(monkeypatch, "fill_with_next_windows")
    rows: dict[str, list[int]] = {"1": [], "2": []}
    split = scheduler_module.encoder_calls

    def calls(waiting: list[Any], *args: Any) -> Any:
        for scales, batch in split(waiting, *args):
            rows[setting].append(len(batch))
            yield scales, batch

    monkeypatch.setattr(scheduler_module, "encoder_calls", calls)
    taken: dict[str, list[int]] = {"1": [], "2": []}  # new sentences a step
    plan = scheduler_module.plan_step

    def planned(*args: Any, **kwargs: Any) -> Any:
        step = plan(*args, **kwargs)
        taken[setting].append(len(step.encodes))
        return step

    monkeypatch.setattr(scheduler_module, "plan_step", planned)
    results = {}
    for setting in ("1", "2"):
        monkeypatch.setenv("VOXFLEET_ENCODER_CALLS", setting)
        before = len(joined)
        runtime = HostStages(stages, WholeSentenceBackend(stages))
        scheduler = StreamScheduler(runtime, 22050, windows=WindowConfig(max_encoder_batch=8))
        assert scheduler.rules.encoder_calls == int(setting)
        # An encoder call's fixed cost, as a GPU pod's warmup seeds it; every listener waiting
        # before the first step, so that its new sentences are more than a call's rows.
        scheduler.costs.per_call["encoder"] = 4e-3
        sinks = [Sink() for _ in range(24)]
        for sink in sinks:
            scheduler.submit(list(sentences), QUIET, sink)
        play_queued(scheduler, sinks)
        results[setting] = sinks
        assert (sum(joined[before:]) > 0) == (setting == "2")
    assert max(rows["1"] + rows["2"]) <= 8
    assert max(taken["1"]) <= 8 < max(taken["2"])
    assert sum(rows["2"]) == sum(rows["1"])  # every sentence encoded once either way
    assert_same_audio(results["1"], results["2"])
