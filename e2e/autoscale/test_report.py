"""docs/autoscaling.md gets the measured numbers between its markers, and the goals are judged
as the issue states them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autoscale.report import BEGIN, END, goals, write


def results(scale_up: float | None, p95: float, cut: int | None) -> dict[str, Any]:
    timeline = [
        {
            "t": 3.0,
            "concurrency": 1,
            "replicas": 1,
            "ready_pods": 1,
            "serving_pods": {"joe": 1},
            "first_audio_p95_ms_prometheus": {"joe": 400.0},
            "first_audio_p95_ms_client_30s": 420.0,
            "underruns": 0,
        }
    ]
    return {
        "command": "make autoscale",
        "date": "2026-11-23 04:13 UTC",
        "machine": "vm, x86_64, 2 CPUs",
        "sync_period_s": 15.0,
        "scrape_interval": "5s",
        "slo_ms": 800,
        "pod_capacity_streams": 2,
        "pool": {
            "scale_up_seconds": scale_up,
            "first_audio_p95_ms_during_step": p95,
            "scaled_in": cut is not None,
            "streams_cut_on_scale_in": cut,
            "scale_events": [],
            "timeline": timeline,
        },
    }


def test_goals_follow_the_issue() -> None:
    met = goals(results(45.0, 1500.0, 0))
    assert met["scale_up_within_60_s"] and met["step_p95_within_2x_slo"]
    assert met["no_stream_cut_on_scale_in"] is True
    missed = goals(results(None, 1700.0, None))
    assert missed["scale_up_within_60_s"] is False
    assert missed["step_p95_within_2x_slo"] is False
    # No pod left during the run: nothing could be cut, and nothing is claimed.
    assert missed["no_stream_cut_on_scale_in"] is None
    assert goals(results(45.0, 1500.0, 2))["no_stream_cut_on_scale_in"] is False


def test_write_replaces_only_the_measured_block(tmp_path: Path) -> None:
    doc = tmp_path / "autoscaling.md"
    doc.write_text(f"# Autoscaling\n\nBefore.\n\n{BEGIN}\nold numbers\n{END}\n\nAfter.\n")
    write(results(45.0, 1500.0, 0), tmp_path / "autoscaling.json")
    text = doc.read_text()
    assert text.startswith("# Autoscaling\n\nBefore.\n\n") and text.endswith("\n\nAfter.\n")
    assert "old numbers" not in text
    assert "| 45.0 s | ≤ 60 s | yes |" in text
    assert (tmp_path / "autoscaling.png").stat().st_size > 10_000


def test_write_links_raw_data_and_plot_kept_outside_the_docs(tmp_path: Path) -> None:
    # `make autoscale`: the JSON in results/, the plot in docs/img/, the page in docs/.
    doc = tmp_path / "docs" / "autoscaling.md"
    doc.parent.mkdir()
    doc.write_text(f"# Autoscaling\n\n{BEGIN}\nold numbers\n{END}\n")
    out, plot_path = tmp_path / "results" / "autoscaling.json", doc.parent / "img" / "a.png"
    write(results(45.0, 1500.0, 0), out, doc, plot_path)
    text = doc.read_text()
    assert "Raw data: [../results/autoscaling.json](../results/autoscaling.json)." in text
    assert "![timeline](img/a.png)" in text
    assert out.exists() and plot_path.stat().st_size > 10_000
