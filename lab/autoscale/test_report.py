"""docs/autoscaling.md gets the measured numbers between its markers, and the goals are judged
as the issue states them, with every client layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engines.bench.results import read_json
from lab.autoscale.report import BEGIN, END, goals, markdown, write


def pool(
    scale_up: float | None,
    p95: float,
    cut: int | None,
    underruns: int = 0,
    pods_before_step: int = 1,
) -> dict[str, Any]:
    timeline = [
        {
            "t": 3.0,
            "concurrency": 1,
            "replicas": 1,
            "ready_pods": 1,
            "serving_pods": {"joe": 1},
            "pods": {"voxfleet-triton-cpu-abcde": {"load": 0.5, "capacity": 8.0}},
            "first_audio_p95_ms_prometheus": {"joe": 400.0},
            "first_audio_p95_ms_client_30s": 420.0,
            "underruns": 0,
            "refused_streams": 3,
        }
    ]
    return {
        "pod_capacity_streams": 8,
        "load_streams": {"measure": 4, "steady": 4, "step": 12, "down": 4},
        "ready_pods_before_step": pods_before_step,
        "scale_up_seconds": scale_up,
        "first_audio_p95_ms_during_step": p95,
        "admitted_streams": 400,
        "admitted_streams_with_underruns": underruns,
        "refused_streams": 30,
        "failed_streams": 0,
        "streams_per_pod_after_scale_up": {"10.0.0.1:8001": 50, "10.0.0.2:8001": 48},
        "scaled_in": cut is not None,
        "scale_in_seconds_after_step": 310.0 if cut is not None else None,
        "streams_cut_on_scale_in": cut,
        "scale_events": [],
        "timeline": timeline,
    }


def results(**scenarios: dict[str, Any]) -> dict[str, Any]:
    return {
        "command": "make autoscale",
        "date": "2026-11-29 04:13 UTC",
        "machine": "vm, x86_64, 2 CPUs",
        "sync_period_s": 5.0,
        "scrape_interval": "5s",
        "slo_ms": 800,
        "load_target_percent": 70,
        **scenarios,
    }


def per_voice(before: dict[str, int], end: tuple[int, int]) -> dict[str, Any]:
    return {
        "serving_pods_before_step": before,
        "joe_serving_pods_at_end": end[0],
        "joe_fast_serving_pods_at_end": end[1],
        "scale_events": [],
        "timeline": pool(40.0, 500.0, 0)["timeline"],
    }


def test_goals_follow_the_issue_for_every_layout() -> None:
    met = goals(results(pool=pool(45.0, 1500.0, 0), pool_shared=pool(50.0, 900.0, 0)))
    assert met["scale_up_within_60_s"] and met["step_p95_within_2x_slo"]
    assert met["admitted_streams_with_underruns_within_1_percent"] is True
    assert met["scaled_in_with_no_stream_cut"] is True
    assert met["per_voice_loaded_voice_on_2_other_on_1"] is None  # not run
    # One layout missing a goal misses it.
    missed = goals(results(pool=pool(45.0, 1500.0, 0), pool_shared=pool(None, 1700.0, None, 5)))
    assert missed["scale_up_within_60_s"] is False
    assert missed["step_p95_within_2x_slo"] is False
    assert missed["admitted_streams_with_underruns_within_1_percent"] is False  # 5 of 400
    # No pod left during the run: the goal (scale-in within the run, 0 cut) is missed.
    assert missed["scaled_in_with_no_stream_cut"] is False
    assert goals(results(pool=pool(45.0, 1500.0, 2)))["scaled_in_with_no_stream_cut"] is False
    # A pool already on two pods before the step did not scale because of it.
    early = goals(results(pool=pool(45.0, 1500.0, 0, pods_before_step=2)))
    assert early["scale_up_within_60_s"] is False


def test_per_voice_goal_needs_both_voices_on_one_pod_until_the_step() -> None:
    good = per_voice({"joe": 1, "joe-fast": 1}, (2, 1))
    assert goals(results(per_voice=good))["per_voice_loaded_voice_on_2_other_on_1"] is True
    early = per_voice({"joe": 2, "joe-fast": 1}, (2, 1))
    assert goals(results(per_voice=early))["per_voice_loaded_voice_on_2_other_on_1"] is False
    both = per_voice({"joe": 1, "joe-fast": 1}, (2, 2))
    assert goals(results(per_voice=both))["per_voice_loaded_voice_on_2_other_on_1"] is False


def test_write_replaces_only_the_measured_block(tmp_path: Path) -> None:
    doc = tmp_path / "autoscaling.md"
    doc.write_text(f"# Autoscaling\n\nBefore.\n\n{BEGIN}\nold numbers\n{END}\n\nAfter.\n")
    write(
        results(
            pool=pool(45.0, 1500.0, 0),
            pool_shared=pool(50.0, 900.0, 0),
            per_voice=per_voice({"joe": 1, "joe-fast": 1}, (2, 1)),
        ),
        tmp_path / "autoscaling.json",
    )
    text = doc.read_text()
    assert text.startswith("# Autoscaling\n\nBefore.\n\n") and text.endswith("\n\nAfter.\n")
    assert "old numbers" not in text
    assert "| 45 s (yes) | 50 s (yes) | ≤ 60 s |" in text
    assert "| 0 of 400 (yes) | 0 of 400 (yes) | ≤ 1 % |" in text
    assert (tmp_path / "autoscaling.png").stat().st_size > 10_000


def test_the_block_names_the_voices_lead_limit() -> None:
    recorded = results(pool=pool(45.0, 1500.0, 0))
    recorded["goals"] = goals(recorded)
    assert "streaming.maxLeadMs 0 ms." in markdown(recorded)
    recorded["max_lead_ms"] = 1000
    assert "streaming.maxLeadMs 1000 ms." in markdown(recorded)
    # A run from before the field: the lead limit is read from its voice's spec.
    older = results(pool=pool(45.0, 1500.0, 0))
    older["pool"]["voice_spec"] = {"pool": "cpu", "streaming": {"maxLeadMs": 500}}
    older["goals"] = goals(older)
    assert "streaming.maxLeadMs 500 ms." in markdown(older)


def test_write_links_raw_data_and_plot_kept_outside_the_docs(tmp_path: Path) -> None:
    # `make autoscale`: the JSON in results/ (compressed), the plot in docs/img/, the page in
    # docs/.
    doc = tmp_path / "docs" / "autoscaling.md"
    doc.parent.mkdir()
    doc.write_text(f"# Autoscaling\n\n{BEGIN}\nold numbers\n{END}\n")
    out, plot_path = tmp_path / "results" / "autoscaling.json.gz", doc.parent / "img" / "a.png"
    write(results(pool=pool(45.0, 1500.0, 0)), out, doc, plot_path)
    text = doc.read_text()
    assert "Raw data: [../results/autoscaling.json.gz](../results/autoscaling.json.gz)." in text
    assert "![timeline](img/a.png)" in text
    assert plot_path.stat().st_size > 10_000
    # What `--report-only` reads back.
    assert read_json(out)["pool"] == results(pool=pool(45.0, 1500.0, 0))["pool"]
