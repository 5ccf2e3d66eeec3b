"""What `make autoscale` writes: results/autoscaling.json.gz, the timeline plot (docs/img/), and
the measured numbers of docs/autoscaling.md.

Also usable alone on an existing JSON: `python -m lab.autoscale.step --report-only`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from engines.bench.results import stem, write_json

SAMPLE_SECONDS = 3.0
# The pool scenario runs with each client layout (lab/autoscale/load.py).
POOL_SCENARIOS = ("pool", "pool_shared")
TITLES = {
    "pool": "pool, a client per listener",
    "pool_shared": "pool, one client for all listeners",
    "per_voice": "per-voice",
}
UNDERRUN_SHARE_GOAL = 0.01


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [k for k in (*POOL_SCENARIOS, "per_voice") if k in results]
    if not scenarios:
        return
    fig, axes = plt.subplots(2, len(scenarios), figsize=(6.5 * len(scenarios), 7), squeeze=False)
    for column, key in enumerate(scenarios):
        timeline = [s for s in results[key]["timeline"] if "error" not in s]
        t = [s["t"] for s in timeline]
        top, bottom = axes[0][column], axes[1][column]
        top.step(t, [s["concurrency"] for s in timeline], where="post", label="listeners (load)")
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
        refused = [s.get("refused_streams", 0) for s in timeline]
        if any(refused):
            twin_top = top.twinx()
            twin_top.plot(t, refused, color="red", alpha=0.4, label="refused streams (total)")
            twin_top.set_ylabel("refused streams")
            twin_top.legend(fontsize=7, loc="lower right")
        top.set_ylabel("count")
        top.set_title(TITLES.get(key, key))
        top.legend(fontsize=7, loc="upper left")
        for voice in timeline[0]["first_audio_p95_ms_prometheus"] if timeline else []:
            bottom.plot(
                t,
                [s["first_audio_p95_ms_prometheus"][voice] or float("nan") for s in timeline],
                label=f"{voice} p95 (Prometheus)",
            )
        bottom.plot(
            t,
            [s["first_audio_p95_ms_client_30s"] or float("nan") for s in timeline],
            label="client p95 (last 30 s)",
            alpha=0.6,
        )
        bottom.axhline(results["slo_ms"], color="grey", linestyle=":", label="SLO")
        bottom.set_xlabel("seconds")
        bottom.set_ylabel("first audio (ms)")
        bottom.legend(fontsize=7, loc="upper left")
        pods = sorted({pod for s in timeline for pod in s.get("pods") or {}})
        if pods:
            twin = bottom.twinx()
            for pod in pods:
                twin.plot(
                    t,
                    [
                        (s.get("pods") or {}).get(pod, {}).get("load", float("nan"))
                        for s in timeline
                    ],
                    linestyle="-.",
                    alpha=0.7,
                    label=f"load {pod[-5:]}",
                )
            twin.axhline(results.get("load_target_percent", 70) / 100, color="black", alpha=0.3)
            twin.set_ylabel("pod load (live / capacity)")
            twin.set_ylim(0, 1.6)
            twin.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _share(part: int | None, whole: int | None) -> float | None:
    return None if part is None or not whole else part / whole


def pool_goals(pool: dict[str, Any], slo_ms: int) -> dict[str, bool]:
    """The pool scenario's goals as the issue states them; the pool must be on one pod until
    the step, or its scale-up says nothing about the step."""
    up, p95 = pool.get("scale_up_seconds"), pool.get("first_audio_p95_ms_during_step")
    share = _share(pool.get("admitted_streams_with_underruns"), pool.get("admitted_streams"))
    cut = pool.get("streams_cut_on_scale_in")
    return {
        "scale_up_within_60_s": pool.get("ready_pods_before_step") == 1
        and up is not None
        and up <= 60,
        "step_p95_within_2x_slo": p95 is not None and p95 <= 2 * slo_ms,
        "admitted_streams_with_underruns_within_1_percent": share is not None
        and share <= UNDERRUN_SHARE_GOAL,
        "scaled_in_with_no_stream_cut": bool(pool.get("scaled_in")) and cut == 0,
    }


def per_voice_goal(per_voice: dict[str, Any]) -> bool:
    before = per_voice.get("serving_pods_before_step") or {}
    return (
        before.get("joe") == 1
        and before.get("joe-fast") == 1
        and per_voice.get("joe_serving_pods_at_end") == 2
        and per_voice.get("joe_fast_serving_pods_at_end") == 1
    )


def goals(results: dict[str, Any]) -> dict[str, bool | None]:
    """One boolean per goal of the issue: met with every client layout that ran (None where
    the scenario did not run)."""
    layouts = [pool_goals(results[k], results["slo_ms"]) for k in POOL_SCENARIOS if k in results]
    met: dict[str, bool | None] = {}
    for name in (
        "scale_up_within_60_s",
        "step_p95_within_2x_slo",
        "admitted_streams_with_underruns_within_1_percent",
        "scaled_in_with_no_stream_cut",
    ):
        met[name] = all(g[name] for g in layouts) if layouts else None
    met["per_voice_loaded_voice_on_2_other_on_1"] = (
        per_voice_goal(results["per_voice"]) if "per_voice" in results else None
    )
    return met


BEGIN = "<!-- make autoscale: begin -->"
END = "<!-- make autoscale: end -->"


def _fmt(value: Any, unit: str = "") -> str:
    return (
        "not reached"
        if value is None
        else f"{value:g}{unit}"
        if isinstance(value, float)
        else f"{value}{unit}"
    )


def markdown(
    results: dict[str, Any],
    json_link: str = "autoscaling.json.gz",
    plot_link: str = "autoscaling.png",
) -> str:
    """The measured numbers for docs/autoscaling.md (between its markers), linking the raw
    JSON and the plot by the given paths (relative to the page)."""
    marks = {True: "yes", False: "**no**", None: "not run"}
    slo = results["slo_ms"]
    pools = [k for k in POOL_SCENARIOS if k in results]
    voice = results.get("per_voice") or {}
    lines = [
        BEGIN,
        f"Command: `{results['command']}` on {results['date']} ({results['machine']}; load "
        f"average at the start {results.get('load_average_at_start')}); HPA sync period "
        f"{results['sync_period_s']:g} s, Prometheus scrape interval "
        f"{results['scrape_interval']}, adapter window {results.get('rate_window', '1m')}, "
        f"targetFirstAudioP95Ms {slo} ms, targetLoadPercent "
        f"{results.get('load_target_percent')}, streaming.maxLeadMs {_max_lead_ms(results)} ms. "
        f"Raw data: [{json_link}]({json_link}).",
        "",
        "| measure | " + " | ".join(TITLES[k] for k in pools) + " | goal |",
        "|---|" + "---|" * len(pools) + "---|",
    ]

    def row(label: str, cells: list[str], goal: str) -> None:
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {goal} |")

    by = {k: results[k] for k in pools}
    met = {k: pool_goals(by[k], slo) for k in pools}
    row(
        "one pod's capacity, by its own measure (streams)",
        [_fmt(by[k].get("pod_capacity_streams")) for k in pools],
        "",
    )
    row(
        "listeners: steady → step → steady",
        [
            "{steady} → {step} → {down}".format(**(by[k].get("load_streams") or {}))
            if by[k].get("load_streams")
            else ""
            for k in pools
        ],
        "C/2 → 1.5 C",
    )
    row(
        "scale-up: step → a second pod serving joe",
        [
            f"{_fmt(by[k].get('scale_up_seconds'), ' s')} ({marks[met[k]['scale_up_within_60_s']]})"
            for k in pools
        ],
        "≤ 60 s",
    )
    row(
        "first-audio p95 of admitted streams sent during the step",
        [
            f"{_fmt(by[k].get('first_audio_p95_ms_during_step'), ' ms')} "
            f"({marks[met[k]['step_p95_within_2x_slo']]})"
            for k in pools
        ],
        f"≤ {2 * slo} ms",
    )
    row(
        "listeners' wait during the step, p95 (refusals and retries included)",
        [_fmt(by[k].get("listener_wait_p95_ms_during_step"), " ms") for k in pools],
        "",
    )
    row(
        "admitted streams with an underrun",
        [
            f"{_fmt(by[k].get('admitted_streams_with_underruns'))} of "
            f"{_fmt(by[k].get('admitted_streams'))} "
            f"({marks[met[k]['admitted_streams_with_underruns_within_1_percent']]})"
            for k in pools
        ],
        "≤ 1 %",
    )
    row(
        "streams refused by every pod (apart) / other failures",
        [
            f"{_fmt(by[k].get('refused_streams'))} / {_fmt(by[k].get('failed_streams'))}"
            for k in pools
        ],
        "",
    )
    row(
        "streams per pod after the scale-up",
        [
            ", ".join(str(n) for n in (by[k].get("streams_per_pod_after_scale_up") or {}).values())
            or "none"
            for k in pools
        ],
        "both",
    )
    row(
        "scale-in: s after the step ended; streams cut",
        [
            (
                f"{_fmt(by[k].get('scale_in_seconds_after_step'), ' s')}; "
                f"{_fmt(by[k].get('streams_cut_on_scale_in'))} cut"
                if by[k].get("scaled_in")
                else "no scale-in"
            )
            + f" ({marks[met[k]['scaled_in_with_no_stream_cut']]})"
            for k in pools
        ],
        "in the run, 0 cut",
    )
    before = voice.get("serving_pods_before_step") or {}
    lines += [
        "",
        f"Per-voice scenario (capacity {_fmt(voice.get('pod_capacity_streams'))} streams, "
        f"listeners {voice.get('load_streams')}): pods serving joe / joe-fast before the step "
        f"{_fmt(before.get('joe'))} / {_fmt(before.get('joe-fast'))}, at the end "
        f"{_fmt(voice.get('joe_serving_pods_at_end'))} / "
        f"{_fmt(voice.get('joe_fast_serving_pods_at_end'))} (goal 1 / 1, then 2 / 1: "
        f"{marks[results['goals'].get('per_voice_loaded_voice_on_2_other_on_1')]}); joe on a "
        f"second pod {_fmt(voice.get('joe_scale_up_seconds'), ' s')} after the step.",
        "",
        "Scale events (s after the scenario's start):",
        "",
    ]
    for key in (*pools, "per_voice"):
        for event in (results.get(key) or {}).get("scale_events", []):
            usage = ", ".join(f"{m} {v} m" for m, v in event["metrics"].items() if v is not None)
            lines.append(
                f"- {TITLES[key]} {event['t']} s: {event['target']} "
                f"{event['from_replicas']} → {event['to_replicas']} ({event['reason']}; {usage})"
            )
    lines += ["", f"![timeline]({plot_link})", END]
    return "\n".join(lines)


def _max_lead_ms(results: dict[str, Any]) -> int:
    """The voices' lead limit: the JSON's own field, or in results from before it, the
    streaming settings of a pool scenario's voice."""
    if "max_lead_ms" in results:
        return int(results["max_lead_ms"])
    spec = next((results[k].get("voice_spec") or {} for k in POOL_SCENARIOS if k in results), {})
    return int((spec.get("streaming") or {}).get("maxLeadMs", 0))


def write(
    results: dict[str, Any], out: Path, doc: Path | None = None, plot_path: Path | None = None
) -> None:
    """The JSON to `out` (gzip-compressed for a `.gz` name), the plot to `plot_path` and the
    numbers into `doc`, where it exists (by default both beside `out`, with its name; git
    leaves plots in results/ out: a run's plot is drawn again from its JSON)."""
    doc = doc or out.with_name(stem(out) + ".md")
    plot_path = plot_path or out.with_name(stem(out) + ".png")
    results["goals"] = goals(results)
    write_json(out, results)
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
