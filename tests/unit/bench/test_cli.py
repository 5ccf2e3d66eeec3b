"""`voxfleet bench` arguments: bad input gets a specific error; outputs are written."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from engines.bench.cli import _json_safe, _write_outputs
from engines.cli import build_parser, main


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "1,x"], "comma-separated whole numbers"),
        (["--concurrency", "0,4"], "at least 1"),
        (["--systems", "voxfleet,tgi"], "unknown system(s) tgi"),
        (["--url", "localhost"], "expected HOST:PORT"),
        (["--duration", "-3"], "expected a positive number"),
        (["--ramp", "-1"], "expected 0 or more seconds"),
        (["--ramp", "soon"], "expected a number of seconds"),
    ],
)
def test_bad_arguments_are_refused_with_a_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", *argv])
    assert message in capsys.readouterr().err


def test_defaults_cover_every_system_and_the_documented_sweep() -> None:
    args = build_parser().parse_args(["bench"])
    assert args.systems == ["piper", "triton-naive", "voxfleet-nobatch", "voxfleet"]
    assert args.concurrency == [1, 4, 16, 32, 64]
    assert args.url == "localhost:8001"


def test_triton_systems_without_a_server_address_fail_before_any_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["bench", "--systems", "triton-naive"])
    assert args.func(args) == 1
    assert "triton-naive needs --naive-url" in capsys.readouterr().err


def test_the_paced_system_without_its_server_fails_before_any_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["bench", "--systems", "voxfleet-paced"])
    assert args.func(args) == 1
    assert "voxfleet-paced needs --paced-url" in capsys.readouterr().err


def test_a_ramp_as_long_as_the_duration_is_refused_before_any_load(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = build_parser().parse_args(["bench", "--duration", "5", "--ramp", "5"])
    assert args.func(args) == 2
    assert "--ramp (5 s) must be shorter than --duration (5 s)" in capsys.readouterr().err


def _small_result() -> dict[str, Any]:
    return {
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "date_utc": "2026-01-01 00:00 UTC",
            "limit_streams": 12.0,
            "one_shot_rtf": 1 / 12,
        },
        "settings": {"concurrencies": [1, 4]},
        "runs": [
            {
                "system": system,
                "concurrency": c,
                "first_audio_ms": {"p50": 50.0 * c, "p95": 80.0 * c, "p99": 90.0 * c},
                "underrun_events": u,
                "streams": 10,
                "rtf": 0.2,
                "audio_seconds_per_second": 5.0,
                "underrun_rate": u / 10,
            }
            for system, u in (("voxfleet", 0), ("piper", 0))
            for c in (1, 4)
        ],
        "goals": [],
    }


def test_json_plot_and_page_are_written(tmp_path: Path) -> None:
    result = _small_result()
    docs = tmp_path / "docs"
    args = build_parser().parse_args(
        [
            "bench",
            "--json",
            str(docs / "b.json"),
            "--plot",
            str(docs / "b.png"),
            "--markdown",
            str(docs / "benchmarks.md"),
        ]
    )
    _write_outputs(args, result)
    assert json.loads((docs / "b.json").read_text())["runs"][0]["system"] == "voxfleet"
    assert (docs / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (docs / "benchmarks.md").read_text()
    assert "](b.png)" in page and "](b.json)" in page


def test_the_page_links_results_and_plot_kept_outside_its_folder(tmp_path: Path) -> None:
    # `make bench`: the page in docs/, the plot in docs/img/, the raw JSON in results/,
    # compressed; the page can be written again from it.
    raw = tmp_path / "results" / "b.json.gz"
    page_path = tmp_path / "docs" / "benchmarks.md"
    args = build_parser().parse_args(
        [
            "bench",
            "--json",
            str(raw),
            "--plot",
            str(tmp_path / "docs" / "img" / "b.png"),
            "--markdown",
            str(page_path),
        ]
    )
    _write_outputs(args, _small_result())
    page = page_path.read_text()
    assert "](img/b.png)" in page
    assert "[`../results/b.json.gz`](../results/b.json.gz)" in page
    assert gzip.decompress(raw.read_bytes()).startswith(b'{"')
    page_path.unlink()
    assert main(["bench", "--from-json", str(raw), "--markdown", str(page_path)]) == 0
    assert "[`../results/b.json.gz`](../results/b.json.gz)" in page_path.read_text()


def test_json_has_no_nan() -> None:
    assert _json_safe({"a": [float("nan"), 1.0], "b": float("inf")}) == {
        "a": [None, 1.0],
        "b": None,
    }
