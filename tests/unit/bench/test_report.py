"""docs/benchmarks.md: table, goals, plot link, and the GPU section kept verbatim."""

from __future__ import annotations

from typing import Any

from engines.bench.report import GPU_BEGIN, GPU_END, build_page, gpu_section


def _result() -> dict[str, Any]:
    run = {
        "system": "voxfleet",
        "concurrency": 4,
        "first_audio_ms": {"p50": 101.0, "p95": 180.4, "p99": 210.0},
        "underrun_events": 0,
        "streams": 40,
        "rtf": 0.31,
        "audio_seconds_per_second": 12.5,
        "underrun_rate": 0.0,
        "errors": 0,
        "server": {"cpu_percent": 150.0, "peak_rss_mib": 900.0},
        "batching": {"joe (vocoder)": {"mean_batch_size": 3.2, "max_batch_size": 4}},
    }
    skipped = {
        "system": "piper",
        "concurrency": 16,
        "first_audio_ms": {},
        "underrun_events": 0,
        "streams": 0,
        "rtf": None,
        "audio_seconds_per_second": None,
        "skipped": "saturated at concurrency 8 (first-audio p95 over 5000 ms)",
    }
    return {
        "machine": {
            "cpu": "Test CPU",
            "cores": 2,
            "date_utc": "2026-01-01 00:00 UTC",
            "one_shot_rtf": 0.05,
            "limit_streams": 20.0,
        },
        "settings": {"concurrencies": [4, 16], "duration_s": 10, "p95_bound_ms": 300},
        "runs": [run, skipped],
        "goals": [
            {
                "name": "real-time streams vs machine limit",
                "measured": "4 of 20",
                "target": "ratio ≥ 0.80",
                "ratio": 0.2,
                "met": False,
            }
        ],
    }


def test_page_has_machine_goals_runs_plot_and_json() -> None:
    page = build_page(_result(), "benchmarks-cpu.png", "benchmarks-cpu.json", "voxfleet bench")
    assert "Test CPU" in page and "2026-01-01 00:00 UTC" in page
    assert "| voxfleet | 4 | 40 | 101 / 180 / 210 | 0 (0 %) | 0 |" in page
    assert "3.2 (max 4), vocoder" in page
    assert "- `piper` not run at 16: saturated at concurrency 8" in page
    assert "| real-time streams vs machine limit | 4 of 20 | ratio ≥ 0.80 | **no** |" in page
    assert "![first-audio p95 and underrun rate against concurrency](benchmarks-cpu.png)" in page
    assert "(benchmarks-cpu.json)" in page
    assert f"{GPU_BEGIN}\n{GPU_END}" in page


def test_gpu_section_of_the_previous_page_is_kept_verbatim() -> None:
    gpu = f"{GPU_BEGIN}\n### H100\n\n| a | b |\n|---|---|\n| 1 | 2 |\n  trailing  \n{GPU_END}"
    previous = f"# Old page\n\nold CPU table\n\n{gpu}\n\nold footer\n"
    page = build_page(_result(), "p.png", "r.json", "voxfleet bench", previous=previous)
    assert gpu in page
    assert "old CPU table" not in page
    assert page.count(GPU_BEGIN) == 1


def test_analysis_written_by_people_survives_a_rerun() -> None:
    analysis = "<!-- analysis:begin -->\nThe vocoder is 56 % of samples.\n<!-- analysis:end -->"
    page = build_page(
        _result(), "p.png", "r.json", "voxfleet bench", previous=f"# Old\n{analysis}\n"
    )
    assert analysis in page


def test_voxfleet_without_vocoder_counts_does_not_claim_batch_1() -> None:
    result = _result()
    result["runs"][0]["batching"] = {"joe": {"mean_batch_size": 1.0, "max_batch_size": 1}}
    page = build_page(result, "p.png", "r.json", "voxfleet bench")
    assert "not reported by the model" in page
    assert "1.0 (max 1)" not in page


def test_markers_are_created_when_the_page_has_none() -> None:
    assert gpu_section(None) == f"{GPU_BEGIN}\n{GPU_END}"
    assert gpu_section("# no markers here") == f"{GPU_BEGIN}\n{GPU_END}"


def test_stage_costs_table() -> None:
    from engines.bench.report import stage_costs_section

    table = stage_costs_section(
        [
            {
                "stage": "vocoder, window",
                "frames": 144,
                "batch": 4,
                "ms": 228.4,
                "ms_per_audio_second": 34.2,
            }
        ]
    )
    assert "| vocoder, window | 144 | 4 | 228 | 34 |" in table
    assert stage_costs_section([]) == ""
