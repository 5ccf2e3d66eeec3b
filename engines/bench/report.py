"""docs/benchmarks.md from a benchmark's JSON (pure: text in, text out).

The GPU section between `<!-- gpu:begin -->` and `<!-- gpu:end -->` is written by the GPU
benchmark, not by this one, the speech API gateway's between `<!-- speech-api:begin -->` and
`<!-- speech-api:end -->` from `scripts/gateway-overhead.sh`'s runs, and the analysis between
`<!-- analysis:begin -->` and `<!-- analysis:end -->` by people; all are carried over verbatim
from the previous page.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

GPU_BEGIN = "<!-- gpu:begin -->"
GPU_END = "<!-- gpu:end -->"
# Findings written by people (profiles read, causes found) survive a rerun of `make bench`.
ANALYSIS_BEGIN = "<!-- analysis:begin -->"
ANALYSIS_END = "<!-- analysis:end -->"
# The speech API gateway's figures, from fresh-server runs of scripts/gateway-overhead.sh.
SPEECH_API_BEGIN = "<!-- speech-api:begin -->"
SPEECH_API_END = "<!-- speech-api:end -->"
# The refusal benchmark's section (lab/refusals.py), kept as written.
REFUSALS_BEGIN = "<!-- refusals:begin -->"
REFUSALS_END = "<!-- refusals:end -->"

METHOD = """\
## How it is measured

- **Load**: closed loop. Each of N workers holds one request open and sends the next corpus
  sentence as soon as the previous one has ended. Every run starts at the top of the same
  fixed shuffle of the corpus, so all systems and levels get the same sentences in the same
  order. Starts are spread evenly over the first second (over a tenth of the duration if that
  is shorter; `--ramp S`, the GPU session script's `RAMP`, sets another span, recorded as
  `settings.ramp_s`). No new request starts after the run's duration; open ones may finish.
  A worker whose request failed waits 0.1 s before its next one, twice as long after each
  failure in a row (at most 2 s), instead of asking again at once.
- **Paced listeners**: `voxfleet-paced` is the voxfleet server with a lead limit
  (`voxfleet serve --max-lead-ms`, 1,000 ms in `make bench`, `BENCH_LEAD_MS`): a stream sends
  audio as fast as it can until it is that far ahead of its listener, then as fast as it
  plays, as for the listeners of a voice agent. `voxfleet` has no limit (as for a pipeline
  that saves the audio). The goal of real-time streams against the machine limit is read
  from `voxfleet-paced` where it ran; the comparison with `triton-naive` from `voxfleet`.
- **First audio**: request sent → first non-empty audio chunk received. For `piper` and
  `triton-naive` that is when the whole sentence is ready, because that is all they offer.
- **Underrun**: a chunk that arrives after all audio received before it would have finished
  playing, with playback starting at the first chunk; playback then resumes from the late
  chunk, so one stall counts once. *Underrun streams* are the streams with at least one (and
  their share of the streams); *underrun events* count every stall of every stream.
- **Errors**: streams that failed, other than refusals; the JSON's `errors_by_kind` counts
  them by what the client was told (numbers left out), so a stream still open when the drain
  ran out (cut off) is told apart from a server's failure.
- **RTF**: total request time (sent → last chunk) over total audio seconds; below 1, streams
  arrive faster than they play. **Audio s/s**: audio seconds delivered per wall second.
- **Server CPU / memory**: CPU time of the server's whole process tree (Triton and its Python
  backend stubs, and where Triton runs under `voxfleet serve` or `voxfleet triton`, the pod's
  every process: the supervisor, the voice host and its phonemiser workers) during the run
  over wall time (100 % = one core), and its peak resident set. The JSON's
  `server.voice_host_threads` gives the voice host's threads by name, each one's share of a
  core (`busy`; the busiest of a name where there are several), and `server.busiest_thread`
  the busiest of them all: one thread of one process is a ceiling no core count lifts.
  `vf-stages` are the runtime's own threads (onnxruntime's pool on the CPU): the stages'
  compute (before 2026-11-30 they showed as `vf-host-prepare`, the thread that loaded them).
  For `piper` the "server" is the benchmark process itself; for `voxfleet-api` it is the
  gateway's process alone (the Triton server behind it counts as other processes).
  *Load generator CPU* is the benchmark process's own CPU while it drives a Triton system:
  it runs on the same cores.
  *Other processes' CPU* is the machine's busy CPU minus both: work that was not part of the
  benchmark (on a shared machine, the reason two runs of the same point differ). The JSON's
  `client.loop_lag_ms` (p50, p95, max, and `max_at_s`, when in the run the worst came) is
  how late the benchmark's event loop woke up during the run: every chunk is timestamped on
  that loop, so first audio and underruns are the server's only while it stays small.
  `client.gc_pause_ms` (count, total, max) are the benchmark's garbage collections, which
  stop that loop. With `--client-processes N` (the GPU session script's `CLIENTS`, 4 there)
  a level's listeners run in N processes, listener g in process g mod N, each over a gRPC
  connection of its own; their records are merged (one clock, `CLOCK_MONOTONIC`), the loop
  figures are the latest process's and the collections every process's, and the load
  generator CPU counts them all. piper always runs in the benchmark process.
  `server.triton_queue_ms` is the mean time a request waited in Triton's queue before a
  model instance took it, per model (Triton's statistics).
- **Pods of a voice** (`voxfleet-pods`, not in the default systems): `--systems voxfleet-pods
  --pods joe-tts-pods.<ns>.svc:8001` (a voice's headless Service, looked up again every 2 s)
  or `--pods HOST:PORT,HOST:PORT`. The stream model on every pod, over a connection per pod,
  each stream sent to the pod with the fewest of the client's streams in flight
  (`engines/client/balancing.py`), and a stream a pod refuses before its first audio
  (`RESOURCE_EXHAUSTED`, `UNAVAILABLE` or `NOT_FOUND`) sent to another, each pod at most
  once, 3 tries in all. With `--client-processes N` each process balances on its own over
  its own connections. A stream every tried pod refused is counted as `refused`, apart from
  `errors`, in the JSON, the progress line and the runs table. A level with a refusal does
  not hold real time. No server resources are read for this system (several servers).
- **Batching**: Triton's per-model statistics (executions per batch size) read before and
  after each run. voxfleet's stream model is decoupled and batches inside itself (one vocoder
  call for the windows of many streams), so Triton sees batch 1 there; its batches come from
  the model's `voxfleet_vocoder_batches_total{batch_size=...}` counter on the metrics port,
  when the model exports it.
- **Machine limit**: 1 / RTF of one-shot, single-stream synthesis (the monolithic voice, whole
  sentences, one after another), measured at the start of the same run.
- **Real-time streams** of a system: the highest measured concurrency with zero underruns, no
  errors and first-audio p95 under the bound, at it and at every measured concurrency below it.
"""


def kept_block(previous: str | None, begin_marker: str, end_marker: str) -> str:
    """A marked block of a previous page, verbatim; empty markers if it had none."""
    if previous:
        begin = previous.find(begin_marker)
        end = previous.find(end_marker, begin + len(begin_marker)) if begin >= 0 else -1
        if begin >= 0 and end >= 0:
            return previous[begin : end + len(end_marker)]
    return f"{begin_marker}\n{end_marker}"


def gpu_section(previous: str | None) -> str:
    """The GPU block of a previous page (written by the GPU benchmark)."""
    return kept_block(previous, GPU_BEGIN, GPU_END)


def _num(value: Any, digits: int = 0, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and (math.isnan(value) or math.isinf(value))):
        return "–"
    return f"{value:,.{digits}f}{suffix}"


def _batching(run: dict[str, Any]) -> str:
    models = run.get("batching") or {}
    vocoder = {name: info for name, info in models.items() if name.endswith("(vocoder)")}
    if vocoder:
        info = max(vocoder.values(), key=lambda item: item["mean_batch_size"])
        return f"{info['mean_batch_size']:.1f} (max {info['max_batch_size']}), vocoder"
    if run["system"].startswith("voxfleet") and run["system"] != "voxfleet-api":
        # (The gateway batches nothing; its server's batches are the voxfleet system's.)
        # Triton hands the decoupled stream model one request per call (batch 1); its batching
        # happens inside, and only the model's own counter can show it.
        return "not reported by the model"
    if not models:
        return "–"
    info = max(models.values(), key=lambda item: item["mean_batch_size"])
    return f"{info['mean_batch_size']:.1f} (max {info['max_batch_size']})"


def runs_table(runs: Sequence[dict[str, Any]]) -> str:
    header = (
        "| system | streams in flight | requests | first audio p50 / p95 / p99 (ms) | "
        "underrun streams | underrun events | RTF | audio s/s | server CPU | server RSS | "
        "load generator CPU | other processes' CPU | mean batch |\n"
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    rows = []
    skipped: dict[str, list[dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: (r["concurrency"], _order(r["system"]))):
        if run.get("skipped"):
            skipped.setdefault(run["system"], []).append(run)
            continue
        fa = run["first_audio_ms"]
        server = run.get("server") or {}
        errors = f" ({run['errors']} failed)" if run.get("errors") else ""
        if run.get("refused"):
            errors += f" ({run['refused']} refused)"
        rows.append(
            f"| {run['system']} | {run['concurrency']} | {run['streams']}{errors} | "
            f"{_num(fa['p50'])} / {_num(fa['p95'])} / {_num(fa['p99'])} | "
            f"{run.get('underrun_streams', 0)} "
            f"({_num(100 * run.get('underrun_rate', math.nan), 0, ' %')}) | "
            f"{run.get('underrun_events', run.get('underruns', 0))} | "
            f"{_num(run['rtf'], 3)} | {_num(run['audio_seconds_per_second'], 1)} | "
            f"{_num(server.get('cpu_percent'), 0, ' %')} | "
            f"{_num(server.get('peak_rss_mib'), 0, ' MiB')} | "
            f"{_num((run.get('client') or {}).get('cpu_percent'), 0, ' %')} | "
            f"{_num(run.get('other_cpu_percent'), 0, ' %')} | {_batching(run)} |"
        )
    notes = [
        f"- `{system}` not run at {', '.join(str(r['concurrency']) for r in points)}: "
        f"{points[0]['skipped']}"
        for system, points in sorted(skipped.items(), key=lambda item: _order(item[0]))
    ]
    return header + "\n".join(rows) + "\n" + ("\n" + "\n".join(notes) + "\n" if notes else "")


def _order(system: str) -> int:
    from engines.bench.stats import SYSTEMS

    return SYSTEMS.index(system) if system in SYSTEMS else len(SYSTEMS)


def profile_section(runs: Sequence[dict[str, Any]]) -> str:
    profiled = [run for run in runs if run.get("profile")]
    if not profiled:
        return ""
    lines = []
    for run in profiled:
        profile = run["profile"]
        lines.append(
            f"### Where `{run['system']}`'s server spends its time "
            f"(concurrency {run['concurrency']})\n"
        )
        if profile.get("error"):
            lines.append(f"Not profiled: {profile['error']}\n")
            continue
        # (Results from before the voice host was sampled too name no processes.)
        sampled = " and ".join(f"the {kind}" for kind in profile.get("sampled", ["backend stub"]))
        lines.append(
            f"py-spy, {profile['samples']} samples of {sampled} over "
            f"{_num(profile.get('duration_s'))} s; share of samples with the function on the "
            "stack:\n"
        )
        lines.append("| function | share of samples |\n|---|---:|")
        lines += [
            f"| `{row['function']}` | {100 * row['share']:.0f} % |"
            for row in profile.get("inclusive", [])
            if row["share"] >= 0.005
        ]
        lines.append("")
    return "\n".join(lines) + "\n"


def stage_costs_section(costs: Sequence[dict[str, Any]]) -> str:
    if not costs:
        return ""
    lines = [
        "### Stage costs of the stream model's windows\n",
        "The split voice's flow and vocoder timed alone at the stream model's window sizes "
        "(context included), best of 3, before the sweep. One scheduler step that holds N "
        "windows takes about N times the batch-1 time unless batching is cheaper per window; "
        "a stream waits for a whole step between two chunks.\n",
        "| stage | frames per item | batch | ms per call | ms per second of audio |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c['stage']} | {c['frames']} | {c['batch']} | {c['ms']:.0f} | "
        f"{c['ms_per_audio_second']:.0f} |"
        for c in costs
    ]
    return "\n".join(lines) + "\n"


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
        "Every number of the CPU run below comes from one command, rerun by anyone with\n"
        "`make bench` (which starts the servers, runs the sweep and rewrites this part of the\n"
        "page; the analysis and the GPU section are written by hand and kept). All systems\n"
        "ran in the same run, on the same machine, with the same corpus\n"
        "(`engines/text/corpus.txt`, public-domain sentences of 3 to 60 words).\n",
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
    others = [
        r["other_cpu_percent"]
        for r in result["runs"]
        if isinstance(r.get("other_cpu_percent"), int | float)
    ]
    if others:
        cores = machine.get("cores") or 1
        parts.append(
            f"- CPU used by other processes during the runs: median "
            f"{sorted(others)[len(others) // 2]:.0f} %, max {max(others):.0f} % "
            f"(of {100 * cores} %)"
        )
    parts += [f"- {note}" for note in notes]
    parts += [
        "",
        "### Goals\n",
        goals_table(result.get("goals", [])),
        "### Runs\n",
        runs_table(result["runs"]),
        f"![first-audio p95 and underrun rate against concurrency]({plot_name})\n"
        if plot_name
        else "",
        f"Raw results: [`{json_name}`]({json_name}).\n" if json_name else "",
        profile_section(result["runs"]),
        stage_costs_section(result.get("stage_costs") or []),
        "### Analysis\n",
        kept_block(previous, ANALYSIS_BEGIN, ANALYSIS_END),
        "",
        METHOD,
        "## Speech API gateway\n",
        kept_block(previous, SPEECH_API_BEGIN, SPEECH_API_END),
        "",
        "## Refusals under a hammering client\n",
        kept_block(previous, REFUSALS_BEGIN, REFUSALS_END),
        "",
        "## GPU\n",
        gpu_section(previous),
        "",
    ]
    return "\n".join(parts)
