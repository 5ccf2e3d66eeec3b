"""Stream timelines → what a listener hears: first audio, gaps, underruns."""

from __future__ import annotations

import pytest

from engines.bench.timeline import Chunk, StreamRecord, analyse_stream

RATE = 1000  # 1 sample = 1 ms keeps the arithmetic readable


def record(
    sent: float,
    chunks: list[tuple[float, int]],
    ended: float | None = None,
    error: str | None = None,
) -> StreamRecord:
    last = chunks[-1][0] if chunks else sent
    return StreamRecord(
        text="x",
        sent_s=sent,
        sample_rate=RATE,
        chunks=[Chunk(at, samples) for at, samples in chunks],
        ended_s=last if ended is None and error is None else ended,
        error=error,
    )


def test_chunks_that_arrive_before_the_audio_runs_out_play_without_a_stall() -> None:
    # 200 ms of audio at t=1.0, next chunk at 1.15 (50 ms to spare), then at 1.30.
    stats = analyse_stream(record(0.8, [(1.0, 200), (1.15, 200), (1.30, 200)]))
    assert stats.completed
    assert stats.first_audio_s == pytest.approx(0.2)
    assert stats.gaps_s == pytest.approx((0.15, 0.15))
    assert stats.underruns == 0
    assert stats.stall_s == 0.0
    assert stats.audio_s == pytest.approx(0.6)


def test_a_chunk_after_the_buffer_ran_dry_is_one_underrun_with_its_stall() -> None:
    # 100 ms played from 1.0 to 1.1; the next chunk comes at 1.25: 150 ms of silence.
    stats = analyse_stream(record(0.9, [(1.0, 100), (1.25, 500)]))
    assert stats.underruns == 1
    assert stats.stall_s == pytest.approx(0.15)


def test_playback_resumes_from_the_late_chunk_so_one_stall_counts_once() -> None:
    # Late at 1.5 (buffer ran out at 1.1); from there 300 ms are buffered, so 1.7 is on time.
    # Counting from the first chunk without resuming would call 1.7 late as well.
    stats = analyse_stream(record(0.9, [(1.0, 100), (1.5, 300), (1.7, 100)]))
    assert stats.underruns == 1
    assert stats.stall_s == pytest.approx(0.4)


def test_every_separate_stall_is_counted() -> None:
    stats = analyse_stream(record(0.0, [(0.1, 50), (0.3, 50), (0.5, 50), (0.52, 50)]))
    assert stats.underruns == 2
    assert stats.stall_s == pytest.approx(0.15 + 0.15)


def test_a_chunk_arriving_exactly_when_the_audio_ends_is_on_time() -> None:
    stats = analyse_stream(record(0.0, [(0.5, 250), (0.75, 250)]))
    assert stats.underruns == 0


def test_tolerance_forgives_lateness_up_to_a_device_buffer() -> None:
    late_by_20ms = record(0.0, [(0.5, 100), (0.62, 100)])
    assert analyse_stream(late_by_20ms).underruns == 1
    assert analyse_stream(late_by_20ms, tolerance_s=0.05).underruns == 0


def test_empty_responses_are_neither_first_audio_nor_chunks() -> None:
    # The final-flagged response of a stream carries no audio.
    stats = analyse_stream(record(0.0, [(0.05, 0), (0.2, 100), (0.25, 100), (0.3, 0)]))
    assert stats.first_audio_s == pytest.approx(0.2)
    assert stats.gaps_s == pytest.approx((0.05,))


def test_a_failed_or_silent_stream_is_not_completed() -> None:
    assert not analyse_stream(record(0.0, [(0.2, 100)], error="boom")).completed
    silent = analyse_stream(record(0.0, [], ended=0.4))
    assert not silent.completed
    assert silent.first_audio_s is None


def test_duration_runs_from_request_to_the_end_of_the_stream() -> None:
    stats = analyse_stream(record(1.0, [(1.2, 100), (1.3, 100)], ended=1.35))
    assert stats.duration_s == pytest.approx(0.35)
