"""Run statistics and goals from stream timelines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines.bench.stats import (
    RunSummary,
    evaluate_goals,
    percentile,
    real_time_capacity,
    summarise_run,
)
from engines.bench.timeline import Chunk, StreamRecord


@pytest.mark.parametrize("q", [0, 50, 95, 99, 100])
def test_percentile_matches_numpy_linear_interpolation(q: float) -> None:
    values = [5.0, 1.0, 9.0, 3.0, 7.0, 2.0, 8.0]
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_of_nothing_is_nan_and_bad_q_is_refused() -> None:
    assert math.isnan(percentile([], 95))
    with pytest.raises(ValueError, match=r"0\.\.100"):
        percentile([1.0], 101)


def _stream(
    sent: float,
    first: float,
    chunks: int,
    samples: int,
    gap: float,
    rate: int = 1000,
    error: str | None = None,
) -> StreamRecord:
    arrivals = [Chunk(sent + first + i * gap, samples) for i in range(chunks)]
    return StreamRecord("t", sent, rate, arrivals, arrivals[-1].arrival_s, error)


def test_summary_reports_first_audio_underruns_rtf_and_throughput() -> None:
    records = [
        # on time: 4 x 250 ms every 200 ms; 1 s of audio in 0.1 + 0.6 = 0.7 s
        _stream(0.0, 0.1, 4, 250, 0.2),
        # underruns: 4 x 100 ms every 300 ms → three stalls; 0.4 s audio in 0.3 + 0.9 = 1.2 s
        _stream(0.0, 0.3, 4, 100, 0.3),
        _stream(0.0, 0.2, 1, 100, 0.0, error="ConnectionError: reset"),
    ]
    run = summarise_run("voxfleet", 2, records, wall_s=2.0)
    assert run.streams == 2
    assert run.errors == 1
    assert run.first_audio_ms["p50"] == pytest.approx(200.0)
    assert run.underrun_events == 3
    assert run.underrun_streams == 1
    assert run.underrun_rate == pytest.approx(0.5)
    assert run.rtf == pytest.approx((0.7 + 1.2) / 1.4)
    assert run.audio_seconds_per_second == pytest.approx(1.4 / 2.0)
    assert run.chunks == 8
    assert run.gap_ms["max"] == pytest.approx(300.0)


def _run(
    system: str, concurrency: int, p95: float, underruns: int = 0, errors: int = 0
) -> RunSummary:
    return RunSummary(
        system,
        concurrency,
        {"p50": p95 / 2, "p95": p95, "p99": p95},
        underruns,
        streams=10,
        rtf=0.1,
        audio_seconds_per_second=1.0,
        errors=errors,
    )


def test_capacity_is_the_highest_concurrency_without_underruns_within_the_bound() -> None:
    runs = [
        _run("voxfleet", 1, 120),
        _run("voxfleet", 8, 250),
        _run("voxfleet", 16, 280),
        _run("voxfleet", 24, 350),
        _run("voxfleet", 32, 290, underruns=3),
        _run("triton-naive", 1, 200),
        _run("triton-naive", 4, 900),
    ]
    assert real_time_capacity(runs, "voxfleet", 300) == 16
    assert real_time_capacity(runs, "triton-naive", 300) == 1
    assert real_time_capacity(runs, "piper", 300) == 0


def test_capacity_stops_at_the_first_level_that_does_not_hold() -> None:
    runs = [
        _run("voxfleet", 1, 120),
        _run("voxfleet", 4, 320),  # first audio over the bound at 4 ...
        _run("voxfleet", 8, 250),  # ... so holding 8 does not count
        _run("triton-naive", 4, 200, underruns=1),
        _run("triton-naive", 1, 200),  # order of the runs does not matter
    ]
    assert real_time_capacity(runs, "voxfleet", 300) == 1
    assert real_time_capacity(runs, "triton-naive", 300) == 1


def test_a_run_with_failed_requests_does_not_hold_real_time() -> None:
    assert real_time_capacity([_run("voxfleet", 4, 100, errors=1)], "voxfleet", 300) == 0


def test_goals_report_ratios_and_verdicts() -> None:
    runs = [
        _run("piper", 1, 900),
        _run("voxfleet", 1, 150),
        _run("voxfleet", 16, 280),
        _run("triton-naive", 1, 280),
        _run("triton-naive", 8, 290),
        _run("triton-naive", 16, 800),
    ]
    first, limit, versus = evaluate_goals(runs, machine_limit_streams=18.0)
    assert first.ratio == pytest.approx(150 / 900) and first.met
    assert limit.ratio == pytest.approx(16 / 18.0) and limit.met
    assert versus.ratio == pytest.approx(2.0) and versus.met

    slower = [
        _run("piper", 1, 400),
        _run("voxfleet", 1, 200),
        _run("voxfleet", 4, 250),
        _run("triton-naive", 4, 280),
    ]
    first, limit, versus = evaluate_goals(slower, machine_limit_streams=18.0)
    assert first.met is False and limit.met is False and versus.met is False
    assert "voxfleet holds 4 streams" in limit.measured


def test_the_real_time_goal_is_read_from_the_paced_server_where_it_ran() -> None:
    runs = [
        _run("voxfleet", 1, 150),
        _run("voxfleet", 2, 380),  # without a lead limit, first audio misses at 2 ...
        _run("voxfleet-paced", 1, 140),
        _run("voxfleet-paced", 2, 160),
        _run("voxfleet-paced", 7, 250),  # ... with one, 7 listeners hold
        _run("triton-naive", 1, 280),
    ]
    _, limit, versus = evaluate_goals(runs, machine_limit_streams=13.2)
    assert limit.ratio == pytest.approx(7 / 13.2) and limit.met
    assert "voxfleet-paced holds 7 streams" in limit.measured
    # The comparison with triton-naive stays on the server without a lead limit.
    assert "voxfleet 1 streams vs triton-naive 1" in versus.measured
    # Without the paced server the goal is read from voxfleet, as before.
    _, alone, _ = evaluate_goals(runs[:2], machine_limit_streams=13.2)
    assert "voxfleet holds 1 streams" in alone.measured and alone.met is False


def test_goals_without_the_systems_they_compare_are_not_measured() -> None:
    goals = evaluate_goals([_run("voxfleet", 1, 100)], machine_limit_streams=None)
    assert [goal.met for goal in goals] == [None, None, None]


def test_auto_levels_include_the_half_and_80_percent_points_of_the_limit() -> None:
    from engines.bench.stats import auto_concurrencies

    assert auto_concurrencies(17.3) == [1, 2, 4, 6, 9, 14, 17, 26]
    # Half of 17.0 is 8.5 streams: the level that can show it is 9, not 8.
    assert auto_concurrencies(17.0) == [1, 2, 4, 6, 9, 14, 17, 26]
    assert auto_concurrencies(6.0) == [1, 2, 3, 4, 5, 6, 9]
    assert auto_concurrencies(0.5) == [1, 2, 4]


def test_errors_are_counted_by_what_the_client_was_told() -> None:
    """A run's errors say why: streams cut off at the drain's end apart from a server's
    failures (ids and numbers left out, so one cause counts once), and refusals apart."""
    from engines.bench.loadgen import CUT_OFF
    from engines.bench.stats import INCOMPLETE

    cut = [_stream(0.0, 0.1, 1, 100, 0.0, error=CUT_OFF) for _ in range(3)]
    failed = [
        _stream(0.0, 0.1, 1, 100, 0.0, error=f"InferenceServerException: stream {n} lost")
        for n in (17, 2048)
    ]
    refused = [_stream(0.0, 0.1, 1, 100, 0.0, error="[RESOURCE_EXHAUSTED] full")]
    unfinished = StreamRecord("t", 0.0, 1000, [Chunk(0.1, 100)], None, None)
    run = summarise_run("voxfleet", 4, [*cut, *failed, *refused, unfinished], wall_s=2.0)
    assert run.errors == 6 and run.refused == 1
    assert run.errors_by_kind == {
        CUT_OFF: 3,
        "InferenceServerException: stream N lost": 2,
        INCOMPLETE: 1,
    }
    assert list(run.errors_by_kind) == [
        CUT_OFF,
        "InferenceServerException: stream N lost",
        INCOMPLETE,
    ]
    # and a summary read back from the results JSON keeps them.
    assert RunSummary.from_json(run.to_json()).errors_by_kind == run.errors_by_kind
