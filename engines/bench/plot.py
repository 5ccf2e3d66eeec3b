"""First-audio p95 and underrun rate against concurrency, one line per system."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from engines.bench.stats import SYSTEMS, RunSummary

_STYLE = {
    "piper": ("tab:gray", "s"),
    "triton-naive": ("tab:orange", "^"),
    "voxfleet-nobatch": ("tab:blue", "v"),
    "voxfleet": ("tab:green", "o"),
    "voxfleet-paced": ("tab:purple", "P"),
    "voxfleet-api": ("tab:olive", "D"),
}


def plot_runs(
    runs: Sequence[RunSummary],
    path: Path,
    p95_bound_ms: float = 300.0,
    machine_limit_streams: float | None = None,
    title: str = "",
) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on servers and CI
    import matplotlib.pyplot as plt

    names = [s for s in SYSTEMS if any(r.system == s for r in runs)]
    names += sorted({r.system for r in runs} - set(names))
    figure, (latency, underruns) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in names:
        points = sorted(
            (r for r in runs if r.system == name and r.skipped is None and r.streams > 0),
            key=lambda r: r.concurrency,
        )
        if not points:
            continue
        color, marker = _STYLE.get(name, (None, "x"))
        xs = [r.concurrency for r in points]
        latency.plot(
            xs, [r.first_audio_ms["p95"] for r in points], marker=marker, color=color, label=name
        )
        underruns.plot(
            xs, [100.0 * r.underrun_rate for r in points], marker=marker, color=color, label=name
        )
    latency.axhline(
        p95_bound_ms, color="red", linestyle="--", linewidth=1, label=f"{p95_bound_ms:.0f} ms bound"
    )
    for axis in (latency, underruns):
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams (closed loop)")
        axis.grid(True, which="both", alpha=0.3)
        if machine_limit_streams and not math.isinf(machine_limit_streams):
            axis.axvline(
                machine_limit_streams,
                color="black",
                linestyle=":",
                linewidth=1,
                label=f"machine limit 1/RTF = {machine_limit_streams:.1f}",
            )
        concurrencies = sorted({r.concurrency for r in runs})
        axis.set_xticks(concurrencies, [str(c) for c in concurrencies])
    latency.set_yscale("log")
    latency.set_ylabel("first audio p95 (ms)")
    latency.set_title("Time to first audio")
    underruns.set_ylabel("streams with an underrun (%)")
    underruns.set_ylim(-3, 103)
    underruns.set_title("Underruns")
    latency.legend(fontsize=8, loc="upper left")
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
