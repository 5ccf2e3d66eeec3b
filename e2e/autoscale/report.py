"""What `make autoscale` writes: results/autoscaling.json, the timeline plot (docs/img/), and
the measured numbers of docs/autoscaling.md.

Also usable alone on an existing JSON: `python -m autoscale.step --report-only`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SAMPLE_SECONDS = 3.0


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [k for k in ("pool", "per_voice") if k in results]
    fig, axes = plt.subplots(2, len(scenarios), figsize=(7 * len(scenarios), 7), squeeze=False)
    for column, key in enumerate(scenarios):
        timeline = [s for s in results[key]["timeline"] if "error" not in s]
        t = [s["t"] for s in timeline]
        top, bottom = axes[0][column], axes[1][column]
        top.step(t, [s["concurrency"] for s in timeline], where="post", label="streams (load)")
        top.step(t, [s["replicas"] for s in timeline], where="post", label="pool replicas")
        top.step(t, [s["ready_pods"] for s in timeline], where="post", label="ready pods")
        for voice in timeline[0]["serving_pods"] if timeline else []:
            top.step(
                t,
                [s["serving_pods"][voice] for s in timeline],
                where="post",
                linestyle="--",
                label=f"pods serving {voice}",
            )
        top.set_ylabel("count")
        top.set_title(f"{key.replace('_', '-')} scenario")
        top.legend(fontsize=8)
        for voice in timeline[0]["first_audio_p95_ms_prometheus"] if timeline else []:
            bottom.plot(
                t,
                [s["first_audio_p95_ms_prometheus"][voice] or float("nan") for s in timeline],
                label=f"{voice} p95 (Prometheus, 1m)",
            )
        bottom.plot(
            t,
            [s["first_audio_p95_ms_client_30s"] or float("nan") for s in timeline],
            label="client p95 (last 30 s)",
            alpha=0.6,
        )
        bottom.axhline(results["slo_ms"], color="grey", linestyle=":", label="SLO")
        under = [s["underruns"] for s in timeline]
        if any(under):
            twin = bottom.twinx()
            twin.bar(t, under, width=SAMPLE_SECONDS, color="red", alpha=0.3, label="underruns")
            twin.set_ylabel("underruns")
        bottom.set_xlabel("seconds")
        bottom.set_ylabel("first audio (ms)")
        bottom.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def goals(results: dict[str, Any]) -> dict[str, Any]:
    pool = results.get("pool") or {}
    slo = results["slo_ms"]
    up, p95, cut = (
        pool.get("scale_up_seconds"),
        pool.get("first_audio_p95_ms_during_step"),
        pool.get("streams_cut_on_scale_in"),
    )
    per_voice = results.get("per_voice") or {}
    return {
        "scale_up_within_60_s": up is not None and up <= 60,
        "step_p95_within_2x_slo": p95 is not None and p95 <= 2 * slo,
        # None: no pod was removed during the run, so nothing could be cut.
        "no_stream_cut_on_scale_in": None if cut is None else cut == 0,
        "per_voice_loaded_voice_on_2_other_on_1": (
            per_voice.get("joe_serving_pods_at_end") == 2
            and per_voice.get("joe_fast_serving_pods_at_end") == 1
        )
        if per_voice
        else None,
    }


BEGIN = "<!-- make autoscale: begin -->"
END = "<!-- make autoscale: end -->"


def _fmt(value: Any, unit: str = "") -> str:
    return "not reached" if value is None else f"{value}{unit}"


def markdown(
    results: dict[str, Any], json_link: str = "autoscaling.json", plot_link: str = "autoscaling.png"
) -> str:
    """The measured numbers for docs/autoscaling.md (between its markers), linking the raw
    JSON and the plot by the given paths (relative to the page)."""
    pool = results.get("pool") or {}
    voice = results.get("per_voice") or {}
    marks = {True: "yes", False: "**no**", None: "not reached"}
    goal = results["goals"]
    lines = [
        BEGIN,
        f"Command: `{results['command']}` on {results['date']} ({results['machine']}); "
        f"HPA sync period {results['sync_period_s']:g} s, Prometheus scrape interval "
        f"{results['scrape_interval']}, adapter rate window {results.get('rate_window', '1m')}, "
        f"SLO (targetFirstAudioP95Ms) {results['slo_ms']} ms, targetQueueMs "
        f"{results.get('queue_target_ms', results['slo_ms'])} ms, "
        f"one pod's capacity taken as {results['pod_capacity_streams']} "
        f"streams. Raw data: [{json_link}]({json_link}).",
        "",
        "| measure | value | goal | met |",
        "|---|---|---|---|",
        f"| scale-up: load step → a second pod serving joe | "
        f"{_fmt(pool.get('scale_up_seconds'), ' s')} | ≤ 60 s | "
        f"{marks[goal['scale_up_within_60_s']]} |",
        f"| first-audio p95 of streams sent during the step (client) | "
        f"{_fmt(pool.get('first_audio_p95_ms_during_step'), ' ms')} | ≤ {2 * results['slo_ms']} ms "
        f"(2 × SLO) | {marks[goal['step_p95_within_2x_slo']]} |",
        f"| streams cut while a pod left on scale-in | "
        f"{_fmt(pool.get('streams_cut_on_scale_in')) if pool.get('scaled_in') else 'no scale-in'}"
        " | 0 | "
        f"{marks[goal['no_stream_cut_on_scale_in']]} |",
        f"| per-voice: pods serving joe / joe-fast at the end | "
        f"{_fmt(voice.get('joe_serving_pods_at_end'))} / "
        f"{_fmt(voice.get('joe_fast_serving_pods_at_end'))} | 2 / 1 | "
        f"{marks[goal['per_voice_loaded_voice_on_2_other_on_1']]} |",
        f"| per-voice: load step → a second pod serving joe (pods serving joe before the step: "
        f"{_fmt(voice.get('joe_serving_pods_before_step'))}) | "
        f"{_fmt(voice.get('joe_scale_up_seconds'), ' s')} | | |",
        "",
        f"Pool scenario: {_fmt(pool.get('streams'))} streams "
        f"({(pool.get('load_streams') or {}).get('steady')} → "
        f"{(pool.get('load_streams') or {}).get('step')} → "
        f"{(pool.get('load_streams') or {}).get('down')} at a time), "
        f"{_fmt(pool.get('streams_with_underruns'))} with an underrun, "
        f"{_fmt(pool.get('streams_failed'))} failed. Scale events (s after the start):",
        "",
    ]
    for key in ("pool", "per_voice"):
        for event in (results.get(key) or {}).get("scale_events", []):
            usage = ", ".join(f"{m} {v} m" for m, v in event["metrics"].items() if v is not None)
            lines.append(
                f"- {key.replace('_', '-')} {event['t']} s: {event['target']} "
                f"{event['from_replicas']} → {event['to_replicas']} ({event['reason']}; {usage})"
            )
    lines += ["", f"![timeline]({plot_link})", END]
    return "\n".join(lines)


def write(
    results: dict[str, Any], out: Path, doc: Path | None = None, plot_path: Path | None = None
) -> None:
    """The JSON to `out`, the plot to `plot_path` and the numbers into `doc`, where it exists
    (by default both beside `out`, with its name)."""
    doc = doc or out.with_suffix(".md")
    plot_path = plot_path or out.with_suffix(".png")
    results["goals"] = goals(results)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(results, plot_path)
    if doc.exists():
        block = markdown(results, _link(out, doc), _link(plot_path, doc))
        text = doc.read_text()
        if BEGIN in text and END in text:
            head, rest = text.split(BEGIN, 1)
            text = head + block + rest.split(END, 1)[1]
        else:
            text = text.rstrip("\n") + "\n\n" + block + "\n"
        doc.write_text(text)
    print(f"wrote {out}, {plot_path} and {doc}")


def _link(path: Path, page: Path) -> str:
    return Path(os.path.relpath(path.resolve(), page.resolve().parent)).as_posix()
