"""docs/benchmarks.md from a benchmark's JSON (pure: text in, text out).

The GPU section between `<!-- gpu:begin -->` and `<!-- gpu:end -->` is written by the GPU
benchmark, not by this one; it is carried over verbatim from the previous page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

GPU_BEGIN = "<!-- gpu:begin -->"
GPU_END = "<!-- gpu:end -->"

METHOD = """\
## How it is measured

- **Load**: closed loop. Each of N workers holds one request open and sends the next corpus
  sentence as soon as the previous one has ended (all systems see the same sentences in the
  same order). Starts are spread over the first second. No new request starts after the run's
  duration; open ones may finish.
- **First audio**: request sent → first non-empty audio chunk received. For `piper` and
  `triton-naive` that is when the whole sentence is ready, because that is all they offer.
- **Underrun**: a chunk that arrives after all audio received before it would have finished
  playing, with playback starting at the first chunk; playback then resumes from the late
  chunk, so one stall counts once. *Underrun rate* is the share of streams with at least one.
- **RTF**: total request time (sent → last chunk) over total audio seconds; below 1, streams
  arrive faster than they play. **Audio s/s**: audio seconds delivered per wall second.
- **Server CPU / memory**: CPU time of the server's whole process tree (Triton and its Python
  backend stubs) during the run over wall time (100 % = one core), and its peak resident set.
  For `piper` the "server" is the benchmark process itself. *Load generator CPU* is the
  benchmark process's own CPU while it drives a Triton system: it runs on the same cores.
- **Batching**: Triton's per-model statistics (executions per batch size) read before and
  after each run; the table shows the mean batch size of the model that does the work.
- **Machine limit**: 1 / RTF of one-shot, single-stream synthesis (the monolithic voice, whole
  sentences, one after another), measured at the start of the same run.
- **Real-time streams** of a system: the highest measured concurrency with zero underruns, no
  errors and first-audio p95 under the bound.
"""


def gpu_section(previous: str | None) -> str:
    """The GPU block of a previous page, verbatim; empty markers if it had none."""
    if previous:
        begin = previous.find(GPU_BEGIN)
        end = previous.find(GPU_END, begin + len(GPU_BEGIN)) if begin >= 0 else -1
        if begin >= 0 and end >= 0:
            return previous[begin : end + len(GPU_END)]
    return f"{GPU_BEGIN}\n{GPU_END}"


def _num(value: Any, digits: int = 0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return "–"
    return f"{value:,.{digits}f}{suffix}"


def _batching(run: dict[str, Any]) -> str:
    models = run.get("batching") or {}
    if not models:
        return "–"
    # The batched stage is the model with the largest mean batch: a decoupled front model or a
    # BLS caller executes once per request (batch 1) and says nothing about batching.
    busiest = max(models.items(), key=lambda item: item[1]["mean_batch_size"])
    return f"{busiest[1]['mean_batch_size']:.1f} (max {busiest[1]['max_batch_size']})"


def runs_table(runs: Sequence[dict[str, Any]]) -> str:
    header = (
        "| system | streams in flight | requests | first audio p50 / p95 / p99 (ms) | "
        "underruns | underrun rate | RTF | audio s/s | server CPU | server RSS | "
        "load generator CPU | mean batch |\n"
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows = []
    for run in sorted(runs, key=lambda r: (r["concurrency"], _order(r["system"]))):
        if run.get("skipped"):
            rows.append(f"| {run['system']} | {run['concurrency']} | – | not run: "
                        f"{run['skipped']} | | | | | | | | |")
            continue
        fa = run["first_audio_ms"]
        server = run.get("server") or {}
        errors = f" ({run['errors']} failed)" if run.get("errors") else ""
        rows.append(
            f"| {run['system']} | {run['concurrency']} | {run['streams']}{errors} | "
            f"{_num(fa['p50'])} / {_num(fa['p95'])} / {_num(fa['p99'])} | {run['underruns']} | "
            f"{_num(100 * run.get('underrun_rate', math.nan), 0, ' %')} | "
            f"{_num(run['rtf'], 3)} | {_num(run['audio_seconds_per_second'], 1)} | "
            f"{_num(server.get('cpu_percent'), 0, ' %')} | "
            f"{_num(server.get('peak_rss_mib'), 0, ' MiB')} | "
            f"{_num((run.get('client') or {}).get('cpu_percent'), 0, ' %')} | {_batching(run)} |"
        )
    return header + "\n".join(rows) + "\n"


def _order(system: str) -> int:
    from engines.bench.stats import SYSTEMS

    return SYSTEMS.index(system) if system in SYSTEMS else len(SYSTEMS)


def goals_table(goals: Sequence[dict[str, Any]]) -> str:
    lines = ["| goal | measured | target | met |", "|---|---|---|---|"]
    for goal in goals:
        met = {True: "yes", False: "**no**", None: "not measured"}[goal["met"]]
        lines.append(f"| {goal['name']} | {goal['measured']} | {goal['target']} | {met} |")
    return "\n".join(lines) + "\n"


def build_page(
    result: dict[str, Any],
    plot_name: str,
    json_name: str,
    command: str,
    previous: str | None = None,
    notes: Sequence[str] = (),
) -> str:
    machine = result["machine"]
    settings = result.get("settings", {})
    limit = machine.get("limit_streams")
    parts = [
        "# Benchmarks\n",
        "Every number on this page comes from one command, rerun by anyone with `make bench`\n"
        "(which starts the servers, runs the sweep below and rewrites this page). All systems\n"
        "ran in the same run, on the same machine, with the same corpus\n"
        "(`engines/bench/corpus.txt`, public-domain sentences of 3 to 60 words).\n",
        f"## CPU: {machine.get('cores', '?')} cores, {machine.get('date_utc', '')}\n",
        f"- machine: {machine.get('cpu', '?')}, {machine.get('cores', '?')} usable cores, "
        f"{machine.get('memory_gib', '?')} GiB memory, {machine.get('os', '?')}, "
        f"Python {machine.get('python', '?')}, onnxruntime {machine.get('onnxruntime', '?')}"
        + (f", Triton {machine['tritonserver']}" if machine.get("tritonserver") else ""),
        f"- load average when the run started: {machine.get('load_average_at_start', '?')}",
        f"- command: `{command}`",
        f"- sweep: concurrency {settings.get('concurrencies', '?')}, "
        f"{settings.get('duration_s', '?')} s per point, first-audio bound "
        f"{settings.get('p95_bound_ms', 300):.0f} ms",
        f"- machine limit: one-shot single-stream RTF {_num(machine.get('one_shot_rtf'), 4)} "
        f"→ {_num(limit, 1)} real-time streams",
    ]
    parts += [f"- {note}" for note in notes]
    parts += [
        "",
        "### Goals\n",
        goals_table(result.get("goals", [])),
        "### Runs\n",
        runs_table(result["runs"]),
        f"![first-audio p95 and underrun rate against concurrency]({plot_name})\n"
        if plot_name else "",
        f"Raw results: [`{json_name}`]({json_name}).\n" if json_name else "",
        METHOD,
        "## GPU\n",
        gpu_section(previous),
        "",
    ]
    return "\n".join(parts)
