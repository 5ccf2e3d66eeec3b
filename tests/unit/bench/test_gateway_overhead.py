"""The speech API gateway in the benchmark: its added first audio and CPU against direct gRPC,
the goal it is held to, and its section of the page kept across reruns."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from engines.bench.gateway import summarise
from engines.bench.report import SPEECH_API_BEGIN, SPEECH_API_END, build_page
from engines.bench.stats import RunSummary, evaluate_goals, gateway_overhead


def run(system: str, concurrency: int, p50: float, p95: float, cpu: float = 0.0) -> RunSummary:
    return RunSummary(
        system,
        concurrency,
        {"p50": p50, "p95": p95, "p99": p95},
        0,
        streams=40,
        rtf=0.1,
        audio_seconds_per_second=1.0,
        wall_seconds=20.0,
        server={"cpu_percent": cpu},
    )


def test_overhead_per_level_against_direct_grpc() -> None:
    runs = [
        run("voxfleet", 1, 40.0, 50.0),
        run("voxfleet-api", 1, 42.5, 56.0, cpu=3.0),
        run("voxfleet", 12, 100.0, 150.0),
        run("voxfleet-api", 12, 103.0, 151.0, cpu=24.0),
        run("voxfleet-api", 20, 300.0, 900.0, cpu=30.0),  # no direct run to compare with
    ]
    rows = gateway_overhead(runs)
    assert [row["concurrency"] for row in rows] == [1, 12]
    assert rows[0]["added_p50_ms"] == pytest.approx(2.5)
    assert rows[0]["added_p95_ms"] == pytest.approx(6.0)
    assert rows[1]["gateway_cpu_percent_per_stream"] == pytest.approx(2.0)
    # 24 % of a core for 20 s over 40 requests: 120 ms of CPU each.
    assert rows[1]["gateway_cpu_ms_per_request"] == pytest.approx(120.0)


def test_the_goal_is_5_ms_at_p50_and_only_when_the_gateway_ran() -> None:
    assert len(evaluate_goals([run("voxfleet", 1, 40.0, 50.0)], None)) == 3
    met = evaluate_goals([run("voxfleet", 1, 40.0, 50), run("voxfleet-api", 1, 44.9, 60)], None)
    assert met[-1].met is True and "+4.9 ms" in met[-1].measured
    missed = evaluate_goals([run("voxfleet", 1, 40.0, 50), run("voxfleet-api", 1, 46, 60)], None)
    assert missed[-1].met is False and missed[-1].ratio == pytest.approx(6.0)


def test_summary_gives_the_median_and_the_worst_run(tmp_path: Path) -> None:
    files = []
    for index, added in enumerate((1.0, 3.0, 8.0)):
        path = tmp_path / f"run{index}.json"
        level = {"concurrency": 1, "added_p50_ms": added, "gateway_cpu_percent": 2.0 + index}
        path.write_text(json.dumps({"date_utc": "d", "levels": [level]}))
        files.append(path)
    summary = summarise(files)["by_concurrency"]["1"]
    assert summary["added_p50_ms"] == {"median": 3.0, "worst": 8.0}
    assert summary["gateway_cpu_percent"] == {"median": 3.0, "worst": 4.0}
    assert summary["runs"] == 3


def test_the_pages_gateway_section_survives_a_rerun() -> None:
    result = {
        "machine": {"cpu": "CPU", "cores": 2, "date_utc": "today", "limit_streams": math.nan},
        "settings": {},
        "runs": [],
        "goals": [],
    }
    block = f"{SPEECH_API_BEGIN}\nadded 2 ms at p50\n{SPEECH_API_END}"
    page = build_page(result, "", "", "voxfleet bench", previous=f"# old\n{block}\n")
    assert "## Speech API gateway" in page and block in page
