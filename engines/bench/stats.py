"""Per-run statistics and the benchmark's goals, from stream timelines (pure)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from engines.bench.timeline import StreamRecord, StreamStats, analyse_stream
from engines.contract.errors import RESOURCE_EXHAUSTED

SYSTEMS = (
    "piper",
    "triton-naive",
    "voxfleet-nobatch",
    "voxfleet",
    "voxfleet-paced",
    "voxfleet-pods",
    "voxfleet-api",
)
SPEECH_API_SYSTEM = "voxfleet-api"
# The same stream model on a server with a lead limit (`voxfleet serve --max-lead-ms`): the
# setting for listeners who play the audio as it comes, as a voice agent's do (needs
# --paced-url). Where it ran, the real-time goal is read from it.
PACED_SYSTEM = "voxfleet-paced"
# The stream model on every pod of a voice, a pod picked per stream (needs --pods).
BALANCED_SYSTEM = "voxfleet-pods"
# The speech API gateway's added first audio at p50, against direct gRPC (issue 41).
ADDED_P50_GOAL_MS = 5.0


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between ranks (numpy's default).

    NaN for no values, so that a run without a single first audio cannot pass any bound.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, got {q}")
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class RunSummary:
    """One (system, concurrency) point; the first fields are the documented --json schema."""

    system: str
    concurrency: int
    first_audio_ms: dict[str, float]
    # Late chunks, over all streams (a stream can underrun several times); `underrun_streams`
    # counts the streams with at least one.
    underrun_events: int
    streams: int
    rtf: float
    audio_seconds_per_second: float
    underrun_streams: int = 0
    underrun_rate: float = 0.0
    stall_seconds: float = 0.0
    errors: int = 0
    # `errors` by what the client was told (`error_kind`), most first: streams cut off at the
    # drain's end are not a server's failures.
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    # Streams every pod tried refused (RESOURCE_EXHAUSTED): counted apart from `errors`.
    refused: int = 0
    chunks: int = 0
    gap_ms: dict[str, float] = field(default_factory=dict)
    wall_seconds: float = 0.0
    server: dict[str, Any] = field(default_factory=dict)
    client: dict[str, Any] = field(default_factory=dict)
    machine_cpu_percent: float = math.nan
    other_cpu_percent: float = math.nan
    batching: dict[str, Any] = field(default_factory=dict)
    profile: dict[str, Any] = field(default_factory=dict)
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunSummary:
        known = {name for name in cls.__dataclass_fields__}
        if "underruns" in data and "underrun_events" not in data:  # results before 2026-11-29
            data = {**data, "underrun_events": data["underruns"]}
        return cls(**{key: value for key, value in data.items() if key in known})


ERROR_KIND_CHARS = 160  # an error kind keeps this much of the message


def is_refusal(error: str | None) -> bool:
    """Whether a stream record's error is a refusal (every pod tried was full): counted apart
    from failures, as the listener was told at once to ask again rather than let down."""
    return error is not None and f"[{RESOURCE_EXHAUSTED}]" in error


# A stream that ended without error but before its last chunk (the server closed it).
INCOMPLETE = "ended before its last chunk"


def error_kind(error: str) -> str:
    """A stream record's error without what differs from stream to stream (numbers: ids,
    ports, counts), so that errors of one cause count together."""
    return re.sub(r"\d+", "N", error.strip())[:ERROR_KIND_CHARS]


def summarise_run(
    system: str,
    concurrency: int,
    records: Iterable[StreamRecord],
    wall_s: float,
    tolerance_s: float = 0.0,
) -> RunSummary:
    """Aggregate the streams of one run.

    - first audio: request sent → first non-empty chunk, over completed streams;
    - underrun events: late chunks (see `engines.bench.timeline`); underrun streams: the
      streams with at least one, and their share of the streams (the rate);
    - rtf: total stream time (sent → end) over total audio seconds: below 1 means each stream
      was, on average, produced faster than it plays;
    - audio seconds per second: audio of the completed streams over the run's wall time.
    """
    stats: list[StreamStats] = []
    refused = 0
    kinds: Counter[str] = Counter()
    for record in records:
        if record.error is not None:
            if is_refusal(record.error):
                refused += 1
            else:
                kinds[error_kind(record.error)] += 1
            continue
        stats.append(analyse_stream(record, tolerance_s))
    done = [s for s in stats if s.completed]
    if len(stats) > len(done):
        kinds[INCOMPLETE] += len(stats) - len(done)
    errors = sum(kinds.values())
    first = [s.first_audio_s * 1000.0 for s in done if s.first_audio_s is not None]
    gaps = [gap * 1000.0 for s in done for gap in s.gaps_s]
    audio_s = sum(s.audio_s for s in done)
    busy_s = sum(s.duration_s or 0.0 for s in done)
    underrun_events = sum(s.underruns for s in done)
    underrun_streams = sum(1 for s in done if s.underruns)
    return RunSummary(
        system=system,
        concurrency=concurrency,
        first_audio_ms={
            "p50": percentile(first, 50),
            "p95": percentile(first, 95),
            "p99": percentile(first, 99),
        },
        underrun_events=underrun_events,
        streams=len(done),
        rtf=busy_s / audio_s if audio_s > 0 else math.nan,
        audio_seconds_per_second=audio_s / wall_s if wall_s > 0 else 0.0,
        underrun_streams=underrun_streams,
        underrun_rate=underrun_streams / len(done) if done else math.nan,
        stall_seconds=sum(s.stall_s for s in done),
        errors=errors,
        errors_by_kind=dict(kinds.most_common()),
        refused=refused,
        chunks=sum(len(s.gaps_s) + 1 for s in done if s.first_audio_s is not None),
        gap_ms={"p95": percentile(gaps, 95), "max": max(gaps) if gaps else math.nan},
        wall_seconds=wall_s,
    )


def auto_concurrencies(machine_limit_streams: float) -> list[int]:
    """Levels that answer the goals: low ones for first audio, and a few around the limit,
    including the smallest counts that reach half of it and 80 % of it, and one between the
    low levels and the half, so that a capacity there is not read as the level below it."""
    limit = max(machine_limit_streams, 1.0)
    half = math.ceil(0.5 * limit)
    levels = {1, 2, 4, half, math.ceil(0.8 * limit), round(limit), round(1.5 * limit)}
    if half > 5:
        levels.add((4 + half) // 2)
    return sorted(level for level in levels if level >= 1)


def profile_level(levels: Sequence[int], machine_limit_streams: float) -> int:
    """The level worth profiling: the first at or above 80 % of the limit (the goal's), else
    the highest."""
    at_goal = [level for level in sorted(levels) if level >= 0.8 * machine_limit_streams]
    return at_goal[0] if at_goal else max(levels)


def holds_real_time(run: RunSummary, p95_bound_ms: float) -> bool:
    """A run in which every stream played without a stall and first audio met the bound."""
    p95 = run.first_audio_ms.get("p95", math.nan)
    return (
        run.skipped is None
        and run.streams > 0
        and run.errors == 0
        and run.refused == 0
        and run.underrun_events == 0
        and not math.isnan(p95)
        and p95 < p95_bound_ms
    )


def real_time_capacity(runs: Iterable[RunSummary], system: str, p95_bound_ms: float) -> int:
    """The highest measured concurrency at which `system` holds real time, and at every
    measured concurrency below it (0 if none): a server that stalls streams at 4 but not at 8
    does not hold 8 streams, it got lucky at 8."""
    capacity = 0
    for run in sorted((r for r in runs if r.system == system), key=lambda r: r.concurrency):
        if not holds_real_time(run, p95_bound_ms):
            break
        capacity = run.concurrency
    return capacity


@dataclass(frozen=True)
class Goal:
    name: str
    measured: str
    target: str
    ratio: float | None
    met: bool | None  # None: a system needed for the goal was not run


def _run_at(runs: Sequence[RunSummary], system: str, concurrency: int) -> RunSummary | None:
    for run in runs:
        if run.system == system and run.concurrency == concurrency and run.skipped is None:
            return run
    return None


# The share of the machine limit voxfleet must hold now; 0.8 is the goal after this one.
MACHINE_LIMIT_RATIO = 0.5
MACHINE_LIMIT_TARGET = f"ratio ≥ {MACHINE_LIMIT_RATIO:.2f} (then 0.80)"


def evaluate_goals(
    runs: Sequence[RunSummary], machine_limit_streams: float | None, p95_bound_ms: float = 300.0
) -> list[Goal]:
    """The issue's three goals, each as a measured ratio against its target."""
    goals: list[Goal] = []
    ran = {run.system for run in runs}

    vox1 = _run_at(runs, "voxfleet", 1)
    piper1 = _run_at(runs, "piper", 1)
    if vox1 and piper1:
        vox_p95, piper_p95 = vox1.first_audio_ms["p95"], piper1.first_audio_ms["p95"]
        ratio = vox_p95 / piper_p95 if piper_p95 > 0 else math.nan
        goals.append(
            Goal(
                "first audio at concurrency 1",
                f"voxfleet p95 {vox_p95:.0f} ms vs piper full-sentence p95 {piper_p95:.0f} ms "
                f"(ratio {ratio:.2f})",
                "ratio ≤ 0.33",
                ratio,
                ratio <= 1 / 3,
            )
        )
    else:
        goals.append(
            Goal(
                "first audio at concurrency 1",
                "not measured (needs voxfleet and piper at concurrency 1)",
                "ratio ≤ 0.33",
                None,
                None,
            )
        )

    real_time = PACED_SYSTEM if PACED_SYSTEM in ran else "voxfleet"
    if real_time in ran and machine_limit_streams:
        capacity = real_time_capacity(runs, real_time, p95_bound_ms)
        ratio = capacity / machine_limit_streams
        goals.append(
            Goal(
                "real-time streams vs machine limit",
                f"{real_time} holds {capacity} streams "
                f"(zero underruns, p95 < {p95_bound_ms:.0f} ms); "
                f"machine limit 1/RTF = {machine_limit_streams:.1f} streams (ratio {ratio:.2f})",
                MACHINE_LIMIT_TARGET,
                ratio,
                ratio >= MACHINE_LIMIT_RATIO,
            )
        )
    else:
        goals.append(
            Goal(
                "real-time streams vs machine limit",
                "not measured",
                MACHINE_LIMIT_TARGET,
                None,
                None,
            )
        )

    if {"voxfleet", "triton-naive"} <= ran:
        vox = real_time_capacity(runs, "voxfleet", p95_bound_ms)
        naive = real_time_capacity(runs, "triton-naive", p95_bound_ms)
        ratio = vox / naive if naive else (math.inf if vox else math.nan)
        if naive:
            versus = f"ratio {ratio:.2f}"
        else:
            naive1 = _run_at(runs, "triton-naive", 1)
            at_one = (
                f"; its p95 at concurrency 1 was {naive1.first_audio_ms['p95']:.0f} ms"
                if naive1
                else ""
            )
            versus = (
                f"triton-naive holds no stream at this bound{at_one}, so the ratio is "
                "unbounded and says little"
            )
        goals.append(
            Goal(
                "real-time streams vs triton-naive",
                f"voxfleet {vox} streams vs triton-naive {naive} at p95 < {p95_bound_ms:.0f} ms "
                f"({versus})",
                "ratio ≥ 1.5",
                ratio,
                bool(ratio >= 1.5),
            )
        )
    else:
        goals.append(
            Goal("real-time streams vs triton-naive", "not measured", "ratio ≥ 1.5", None, None)
        )
    if SPEECH_API_SYSTEM in ran:
        goals.append(_gateway_goal(runs))
    return goals


def _gateway_goal(runs: Sequence[RunSummary]) -> Goal:
    """The speech API's added first audio at concurrency 1 (issue 41)."""
    name, target = "speech API's added first audio", f"≤ {ADDED_P50_GOAL_MS:.0f} ms at p50"
    rows = gateway_overhead(runs)
    if not rows:
        return Goal(name, "not measured (needs voxfleet and voxfleet-api)", target, None, None)
    row = rows[0]
    added = row["added_p50_ms"]
    return Goal(
        name,
        f"at concurrency {row['concurrency']:.0f}: p50 {row['api_p50_ms']:.1f} ms through the "
        f"gateway vs {row['direct_p50_ms']:.1f} ms direct (+{added:.1f} ms; p95 "
        f"+{row['added_p95_ms']:.1f} ms)",
        target,
        added,
        added <= ADDED_P50_GOAL_MS,
    )


def gateway_overhead(runs: Sequence[RunSummary]) -> list[dict[str, float]]:
    """Per level where both ran: the gateway's added first audio (p50, p95, ms) against
    `voxfleet` direct, and its CPU: % of a core per concurrent stream, ms per stream."""
    direct = {r.concurrency: r for r in runs if r.system == "voxfleet" and not r.skipped}
    rows = []
    for api in (r for r in runs if r.system == SPEECH_API_SYSTEM and not r.skipped):
        base = direct.get(api.concurrency)
        if base is None:
            continue
        cpu = api.server.get("cpu_percent")
        cpu_percent = float(cpu) if isinstance(cpu, (int, float)) else math.nan
        rows.append(
            {
                "concurrency": api.concurrency,
                "direct_p50_ms": base.first_audio_ms["p50"],
                "api_p50_ms": api.first_audio_ms["p50"],
                "added_p50_ms": api.first_audio_ms["p50"] - base.first_audio_ms["p50"],
                "direct_p95_ms": base.first_audio_ms["p95"],
                "api_p95_ms": api.first_audio_ms["p95"],
                "added_p95_ms": api.first_audio_ms["p95"] - base.first_audio_ms["p95"],
                "gateway_cpu_percent": cpu_percent,
                "gateway_cpu_percent_per_stream": cpu_percent / api.concurrency,
                "gateway_cpu_ms_per_request": (
                    cpu_percent / 100 * api.wall_seconds / api.streams * 1000
                    if api.streams
                    else math.nan
                ),
                "api_errors": api.errors,
                "api_underrun_streams": api.underrun_streams,
                "direct_underrun_streams": base.underrun_streams,
            }
        )
    return sorted(rows, key=lambda row: row["concurrency"])
