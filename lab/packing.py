"""Many voices in one pool pod: `python -m lab.packing` (a CUDA GPU, or the CPU).

One run, on a freshly started pod process (`voxfleet triton`, the pool pod's own command, in
explicit model control, under an MPS per-client memory limit when `--mps-limit` is given):

1. the first voice (its architecture: graphs captured) and then `--voices` more (perturbed
   copies, lab/voices.py) loaded through Triton's repository API, `--parallel` at a
   time, each timed;
2. the pod's memory report (the health port's /memory): total, used, fixed, per voice;
3. a cold voice: the first request to each of `--cold` voices loaded but never used, one at a
   time: first audio p50/p95;
4. a voice loaded while `--background` streams of ten other voices play: each load's time,
   and the background streams that underran while the loads ran (none with 0);
5. the closed-loop sweep (`voxfleet bench`'s runner, `--client-processes` listeners'
   processes) at `--levels` for: one voice; ten voices evenly; every voice with Zipf(1.1)
   popularity. The streams each pattern holds (every stream real time, first-audio p95 under
   `--p95-bound-ms`), and its first-audio p50/p95/p99 there. With `--during-sweep`, a shell
   command runs beside each pattern's sweep (a profiler of the voice host, say:
   `STAGE=gil` in tests/gpu/pace_session.sh).

Writes one JSON file (`*packing*.json`): budget_mib, fixed_mib, per_voice_mib, voices_loaded,
gpu, and per pattern held_streams and first_audio_ms, with every level's summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from engines.bench.loadgen import run_closed_loop
from engines.bench.runner import SweepSettings, run_sweep
from engines.bench.stats import percentile, real_time_capacity, summarise_run
from engines.bench.systems import SpreadTritonSystem
from engines.contract import names
from engines.contract.plan import ENCODER_LAUNCHES, ServingPlan, WindowConfig
from engines.contract.repository import build_model_repository, load_request, write_model_repository
from engines.pod.ports import free_port
from engines.text.corpus import cycle_sentences, load_corpus

READY_TIMEOUT_S = 600.0
# Seconds a `--during-sweep` command may run on after its sweep before it is stopped.
DURING_SWEEP_GRACE_S = 60.0


def memory_costs(first: dict[str, Any], last: dict[str, Any], first_voice: str) -> dict[str, Any]:
    """The pod's fixed cost and each further voice's, from its memory reports with the first
    voice only (`first`) and with every voice loaded (`last`).

    A further voice costs what the pod's used memory grew by per voice loaded
    (`per_voice_mib`): its weights as the pod attributes them, and whatever else loading it
    took that the pod does not attribute to a voice. The fixed cost (`fixed_mib`) is what
    the pod took with its first voice, less that voice's cost: the cost at zero voices of a
    straight line through the two reports. The attributed figures are kept beside."""
    voices = last.get("voices", {})
    count = len(voices)
    used_first, used_last = first.get("used_mib"), last.get("used_mib")
    attributed = [v["mib"] for n, v in voices.items() if n != first_voice]
    costs: dict[str, Any] = {
        "fixed_mib_after_first_voice": used_first,
        "per_voice_attributed_mib": round(statistics.median(attributed), 1) if attributed else None,
        "unattributed_mib": round((used_last or 0) - sum(v["mib"] for v in voices.values()), 1),
    }
    if used_first is None or used_last is None or count < 2:
        return {**costs, "fixed_mib": None, "per_voice_mib": None}
    per_voice = (used_last - used_first) / (count - 1)
    return {
        **costs,
        "fixed_mib": round(used_first - per_voice, 1),
        "per_voice_mib": round(per_voice, 1),
    }


def _http(url: str, body: bytes | None = None, timeout: float = 600.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as error:
        return int(error.code), error.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def _mib(limit: str) -> int:
    """MiB of an MPS limit such as 16G or 16000M (0 for none)."""
    if not limit:
        return 0
    units = {"G": 1024, "M": 1}
    return int(float(limit[:-1]) * units[limit[-1].upper()])


class Pod:
    """`voxfleet triton` as a pool pod runs it, on ports of its own."""

    def __init__(self, work: Path, plan: ServingPlan, mps_limit: str, log: Path) -> None:
        self.grpc, self.http, self.metrics, self.health = (free_port() for _ in range(4))
        repository = write_model_repository(build_model_repository([plan]), work / "models")
        env = {**os.environ, names.HEALTH_PORT_ENV: str(self.health)}
        if mps_limit:
            env[names.MPS_ENV] = "1"
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={mps_limit}"
        command = [
            sys.executable,
            "-m",
            "engines.cli",
            "triton",
            f"--model-repository={repository}",
            "--model-control-mode=explicit",
            f"--load-model={plan.name}",
            # The pool's declared memory: the limit MPS holds the voice host to.
            f"--voice-host-memory-mib={_mib(mps_limit)}",
            f"--grpc-port={self.grpc}",
            f"--http-port={self.http}",
            f"--metrics-port={self.metrics}",
            "--strict-readiness=false",
            "--log-verbose=0",
        ]
        self.log = open(log, "ab")
        self.process = subprocess.Popen(
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.url = f"127.0.0.1:{self.grpc}"

    def wait_ready(self) -> float:
        started = time.monotonic()
        while time.monotonic() - started < READY_TIMEOUT_S:
            if self.process.poll() is not None:
                raise RuntimeError(f"the pod exited with {self.process.returncode}")
            if _http(f"http://127.0.0.1:{self.health}/ready", timeout=2)[0] == 200:
                return time.monotonic() - started
            time.sleep(0.5)
        raise RuntimeError("the pod did not become ready")

    def load(self, plan: ServingPlan) -> tuple[float, int, str]:
        """(seconds, HTTP status, reply) of loading `plan`'s voice through the repository API."""
        body = json.dumps(load_request(plan)).encode()
        started = time.monotonic()
        status, reply = _http(
            f"http://127.0.0.1:{self.http}/v2/repository/models/{plan.name}/load", body
        )
        return time.monotonic() - started, status, reply.decode(errors="replace")[:300]

    def memory(self) -> dict[str, Any]:
        status, body = _http(f"http://127.0.0.1:{self.health}{names.MEMORY_PATH}", timeout=10)
        return json.loads(body) if status == 200 else {"error": status}

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)
        self.log.close()


def _first_audio_ms(url: str, voice: str, text: str) -> float | None:
    from engines.client.tts import synthesize

    result = synthesize(url, text, voice=voice)
    return None if result.first_audio_s is None else result.first_audio_s * 1000.0


def _loads_under_streams(
    pod: Pod, plans: list[ServingPlan], voices: list[str], streams: int, sentences: list[str]
) -> dict[str, Any]:
    """Load `plans` one after another while `streams` listeners play the ten `voices`; the
    background streams that underran while the loads ran."""
    system = SpreadTritonSystem("background", pod.url, voices)
    loads: list[float] = []
    window: list[float] = []

    def load_all() -> None:
        time.sleep(5.0)  # the background is playing by now
        window.append(time.perf_counter())
        for plan in plans:
            seconds, status, reply = pod.load(plan)
            if status != 200:
                raise RuntimeError(f"loading {plan.name}: {status} {reply}")
            loads.append(seconds)
        window.append(time.perf_counter())

    async def run() -> Any:
        await system.connect()
        loader = threading.Thread(target=load_all)
        loader.start()
        result = await run_closed_loop(
            system.open_stream, cycle_sentences(sentences), streams, 15.0 + 2.0 * len(plans)
        )
        loader.join()
        await system.close()
        return result

    result = asyncio.run(run())
    start, end = window
    overlapping = [
        r for r in result.records if r.sent_s < end and (r.ended_s is None or r.ended_s > start)
    ]
    summary = summarise_run("during-loads", streams, overlapping, end - start)
    return {
        "background_streams": streams,
        "load_s": [round(s, 3) for s in loads],
        "load_s_max": round(max(loads), 3),
        "overlapping_streams": summary.streams,
        "underrun_streams": summary.underrun_streams,
        "errors": summary.errors,
        "first_audio_ms": summary.first_audio_ms,
    }


def _beside(command: str, pattern: str) -> subprocess.Popen[bytes] | None:
    """`--during-sweep`: the command started beside a pattern's sweep (PATTERN in its
    environment), or None."""
    if not command:
        return None
    return subprocess.Popen(["bash", "-c", command], env={**os.environ, "PATTERN": pattern})


def _finish(process: subprocess.Popen[bytes] | None, pattern: str) -> None:
    """The command beside a sweep, waited for once the sweep is over (stopped after
    DURING_SWEEP_GRACE_S)."""
    if process is None:
        return
    try:
        status = process.wait(timeout=DURING_SWEEP_GRACE_S)
    except subprocess.TimeoutExpired:
        process.kill()
        status = process.wait()
    if status:
        print(f"packing: --during-sweep for {pattern} exited with {status}", file=sys.stderr)


def _sweep(
    url: str, name: str, voices: list[str], popularity: str, args: argparse.Namespace
) -> dict[str, Any]:
    system = SpreadTritonSystem(name, url, voices, popularity)
    settings = SweepSettings(
        concurrencies=args.levels,
        duration_s=args.duration,
        drain_s=args.drain,
        skip_after_p95_ms=4 * args.p95_bound_ms,
        client_processes=args.client_processes,
    )
    sentences = load_corpus()

    async def run() -> list[Any]:
        try:
            return await run_sweep([system], sentences, settings)
        finally:
            await system.close()

    runs = asyncio.run(run())
    held = real_time_capacity(runs, name, args.p95_bound_ms)
    at_held = next((r for r in runs if r.concurrency == held), None)
    return {
        "voices": len(voices),
        "popularity": popularity,
        "held_streams": held,
        "first_audio_ms": at_held.first_audio_ms if at_held else None,
        "levels": [r.to_json() for r in runs],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab.packing", description=__doc__)
    parser.add_argument("--voices", type=int, default=100, help="voices beyond the first (100)")
    parser.add_argument("--voices-dir", type=Path, required=True, help="their engine entries")
    parser.add_argument("--engine-dir", type=Path, required=True, help="the first voice's entry")
    parser.add_argument("--runtime", default="torch-cuda")
    parser.add_argument("--windows", type=int, default=WindowConfig().max_batch_windows)
    parser.add_argument("--sentences", type=int, default=WindowConfig().max_encoder_batch)
    parser.add_argument(
        "--encoder-launch",
        choices=ENCODER_LAUNCHES,
        default=WindowConfig().encoder_launch,
        help="how the encoder's calls run (the plan's encoder_launch)",
    )
    parser.add_argument("--mps-limit", default="", help="e.g. 16G: MPS per-client memory limit")
    parser.add_argument("--parallel", type=int, default=8, help="loads at a time (8)")
    parser.add_argument("--cold", type=int, default=20, help="cold voices to time (20)")
    parser.add_argument(
        "--background", type=int, default=200, help="streams while loading (0: no such loads)"
    )
    parser.add_argument(
        "--levels", type=lambda v: [int(x) for x in v.split(",")], default=[250, 500, 1000]
    )
    parser.add_argument("--patterns", default="one,ten,zipf")
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--drain", type=float, default=20.0)
    parser.add_argument("--p95-bound-ms", type=float, default=800.0)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument(
        "--during-sweep",
        default="",
        help="a shell command started as each pattern's sweep starts (PATTERN set to the "
        "pattern), waited for after it: a profiler, say",
    )
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args(argv)

    config = args.engine_dir / "voice.onnx.json"
    template = ServingPlan(
        "joe",
        str(args.engine_dir),
        voice_config_path=str(config),
        runtime=args.runtime,
        windows=replace(
            WindowConfig(),
            max_batch_windows=args.windows,
            max_encoder_batch=args.sentences,
            encoder_launch=args.encoder_launch,
        ),
    )
    entries = sorted(p for p in args.voices_dir.iterdir() if (p / "vocoder.onnx").is_file())
    extra = len(entries) - args.voices
    if extra < 5:
        raise SystemExit(f"{args.voices_dir} needs {args.voices + 5} voices (5 load under streams)")
    plans = [
        replace(template, name=e.name, engine_dir=str(e), voice_config_path=str(config))
        for e in entries
    ]
    packed, later = plans[: args.voices], plans[args.voices : args.voices + 5]
    work = Path(tempfile.mkdtemp(prefix="voxfleet-packing-"))
    log = args.out.with_suffix(".log")
    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv),
        "runtime": args.runtime,
        "windows": args.windows,
        "sentences": args.sentences,
        "encoder_launch": args.encoder_launch,
        "budget": f"CUDA MPS per-client limit {args.mps_limit}" if args.mps_limit else "none",
    }
    try:
        import torch

        result["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except ImportError:
        result["gpu"] = "cpu"
    pod = Pod(work, template, args.mps_limit, log)
    try:
        result["ready_s"] = round(pod.wait_ready(), 1)
        first = pod.memory()
        with ThreadPoolExecutor(args.parallel) as pool:
            loads = list(pool.map(pod.load, packed))
        refused = [(p.name, s, r) for p, (_, s, r) in zip(packed, loads, strict=True) if s != 200]
        result["load_s"] = {
            "median": round(statistics.median(t for t, _, _ in loads), 3),
            "max": round(max(t for t, _, _ in loads), 3),
            "parallel": args.parallel,
        }
        result["refused"] = refused[:5]
        memory = pod.memory()
        voices = memory.get("voices", {})
        result.update(
            {
                "budget_mib": memory.get("total_mib"),
                "used_mib": memory.get("used_mib"),
                **memory_costs(first, memory, template.name),
                "voices_loaded": len(voices),
                "memory": memory,
            }
        )
        loaded = [p.name for p in packed if p.name in voices]
        text = "Good morning, how can I help you today?"
        cold = [_first_audio_ms(pod.url, name, text) for name in loaded[-args.cold :]]
        cold_ms = [c for c in cold if c is not None]
        result["cold_voice_first_audio_ms"] = {
            "voices": len(cold_ms),
            "p50": round(percentile(cold_ms, 50), 1),
            "p95": round(percentile(cold_ms, 95), 1),
            "max": round(max(cold_ms), 1),
        }
        ten = loaded[:10]
        if args.background > 0:
            result["loads_under_streams"] = _loads_under_streams(
                pod, later, ten, args.background, load_corpus()
            )
        patterns = {
            "one": ([template.name], "even"),
            "ten": (ten, "even"),
            "zipf": (loaded, "zipf:1.1"),
        }
        result["patterns"] = {}
        for key in args.patterns.split(","):
            models, popularity = patterns[key]
            beside = _beside(args.during_sweep, key)
            try:
                result["patterns"][key] = _sweep(pod.url, key, models, popularity, args)
            finally:
                _finish(beside, key)
            print(json.dumps({key: result["patterns"][key]["held_streams"]}), flush=True)
    finally:
        pod.stop()
        args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(
        json.dumps({k: v for k, v in result.items() if k not in ("patterns", "memory")}, indent=2)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
