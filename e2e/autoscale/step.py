"""`make autoscale`: a load step on the local cluster, and the autoscaling loop's response.

    python -m autoscale.step [--sync-period 5] [--scrape-interval 5s] [--rate-window 30s] ...

One installation (e2e/installation.py: the real control plane, the node agent's nodes with
each pool pod on its own CPU, the chart installed with helm, the operator running) and,
beside it, the real Prometheus (Debian's) scraping what the ServiceMonitors select, and the
real prometheus-adapter serving the chart's rules as `custom.metrics.k8s.io` (adapter.py);
the HPA controller is kube-controller-manager's own, with its sync period set by
`--sync-period` (5 s by default, shortened from Kubernetes' 15 s). controllers.py only
watches what it does. Two scenarios:

- pool: voice `joe` on the CPU pool. Steady load at half of one pod's capacity, a step to 1.5x,
  held, then back to half until the pool has scaled in again. Reported: time from the step to
  a second pod serving joe, first-audio p95 during the step, streams cut while a pod left,
  the scale events and a timeline.
- per-voice: `joe` and `joe-fast` on one pool, both `autoscaling.perVoice`, only joe loaded:
  joe's own HPA scales joe to 2 pods, joe-fast stays on 1.

Writes results/autoscaling.json, docs/img/autoscaling.png and the measured block of
docs/autoscaling.md, which explains them.
`--calibrate` measures one pod's first audio and underruns at 1..4 streams (`--calibrate-levels`)
instead.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import math
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from e2e_support import NAMESPACE, POOL, ROOT, Kubectl, eventually

from autoscale.adapter import MetricsAdapter, adapter_config_from_chart
from autoscale.controllers import AutoscalingWatch, ScaleEvent
from autoscale.load import Phase, TimedRecord, open_stream_through, run_phases
from autoscale.prometheus import PrometheusServer
from autoscale.report import SAMPLE_SECONDS, write
from engines.bench.timeline import analyse_stream
from engines.corpus import cycle_sentences, load_corpus, sentence_order

# e2e/installation.py reaches the local cluster as `e2e.cluster`, which mypy (checking it as
# `cluster`) would see twice; it is loaded by name and typed loosely here.
Installation = Any
POOL_DEPLOYMENT = f"voxfleet-triton-{POOL}"
POOL_PODS = f"app.kubernetes.io/name=voxfleet-triton,voxfleet.io/pool={POOL}"
JOE_PATH = "joe/en_US-joe-medium.onnx"


@dataclass(frozen=True)
class Targets:
    """The latency targets of the scenarios' voices (--slo-ms, --queue-target-ms)."""

    first_audio_p95_ms: int
    queue_ms: int


def voice_manifest(name: str, targets: Targets, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "voxfleet.io/v1alpha1",
        "kind": "TTSVoice",
        "metadata": {"name": name},
        "spec": {
            "pool": POOL,
            "source": {"pvc": {"claimName": "voices", "path": JOE_PATH}},
            **spec,
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "targetFirstAudioP95Ms": targets.first_audio_p95_ms,
                "targetQueueMs": targets.queue_ms,
                **spec.get("autoscaling", {}),
            },
        },
    }


def ready_voice(kubectl: Kubectl, name: str, timeout: float = 300) -> dict[str, Any]:
    def ready() -> dict[str, Any]:
        obj: dict[str, Any] = kubectl.get("ttsv", name) or {}
        status = obj.get("status") or {}
        assert status.get("phase") != "Failed", f"{name} failed: {status}"
        return obj if status.get("phase") == "Ready" and status.get("endpoint") else {}

    result: dict[str, Any] = eventually(ready, timeout=timeout, what=f"{name} is Ready")
    return result


def pod_ready(pod: dict[str, Any]) -> bool:
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = max(0, math.ceil(q * len(ordered)) - 1)
    return ordered[index]


@dataclass
class Sampler:
    """Every SAMPLE_SECONDS: replicas, ready and serving pods, p95s, underruns."""

    kubectl: Kubectl
    adapter: MetricsAdapter
    voices: Sequence[str]
    records: list[TimedRecord]
    concurrency: Callable[[], int]
    started: float
    timeline: list[dict[str, Any]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Sampler:
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        counted: set[int] = set()
        while not self._stop.wait(SAMPLE_SECONDS):
            try:
                self.timeline.append(self.sample(counted))
            except Exception as error:  # a missed sample is not the end of the run
                self.timeline.append({"t": time.monotonic() - self.started, "error": str(error)})

    def voice_metric_ms(self, metric: str) -> dict[str, float | None]:
        """Each voice's value of an adapter metric of TTSVoices, as its HPA reads it, in ms."""
        values: dict[str, float | None] = {}
        for v in self.voices:
            value = self.adapter.metric(NAMESPACE, "ttsvoices.voxfleet.io", v, metric)
            values[v] = round(value * 1000, 1) if value is not None else None
        return values

    def sample(self, counted: set[int]) -> dict[str, Any]:
        now = time.monotonic()
        deployment = self.kubectl.get("deployment", POOL_DEPLOYMENT) or {}
        pods = [p for p in self.kubectl.items("pods", POOL_PODS)]
        ready = [p for p in pods if pod_ready(p)]
        serving = {
            v: sum(
                1
                for p in ready
                if (p["metadata"].get("labels") or {}).get(f"serving.voxfleet.io/{v}") == "true"
            )
            for v in self.voices
        }
        p95 = self.voice_metric_ms("voxfleet_voice_first_audio_p95_seconds")
        queue = self.voice_metric_ms("voxfleet_voice_queue_seconds")
        recent = [
            analyse_stream(r.record).first_audio_s
            for r in self.records
            if now - 30 <= r.record.sent_s <= now and r.record.chunks
        ]
        underruns = 0
        for index, item in enumerate(list(self.records)):
            if index in counted or (item.record.ended_s is None and item.record.error is None):
                continue
            counted.add(index)
            underruns += analyse_stream(item.record).underruns
        specs = {v["metadata"]["name"]: v.get("spec") or {} for v in self.kubectl.items("ttsv")}
        voices = {v: specs.get(v, {}).get("replicas") for v in self.voices}
        return {
            "t": round(now - self.started, 1),
            "concurrency": self.concurrency(),
            "replicas": (deployment.get("spec") or {}).get("replicas") or 1,
            "ready_pods": len(ready),
            "serving_pods": serving,
            "voice_replicas": voices,
            "first_audio_p95_ms_prometheus": p95,
            "queue_ms_prometheus": queue,
            "first_audio_p95_ms_client_30s": (
                round(1000 * (percentile([x for x in recent if x is not None], 0.95) or 0), 1)
                if recent
                else None
            ),
            "underruns": underruns,
        }


def sentences() -> Iterator[str]:
    return cycle_sentences(sentence_order(load_corpus()))


async def reachable(address: str, voice: str, timeout_s: float = 60.0) -> None:
    """Wait until one stream succeeds through the voice's Service.

    A voice is Ready once its model is loaded and its pod labelled; the Service routes to the
    pod a moment later (the endpoints and the proxy follow the label, as kube-proxy does).
    The load starts after that moment, so its first streams measure the voice, not the
    Service's catching up.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async for _ in open_stream_through(address, voice, "Ready."):
                pass
            return
        except Exception as error:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no stream reached {voice} through {address}: {error}"
                ) from error
            await asyncio.sleep(0.5)


def run_load(
    installation: Installation,
    endpoint: str,
    voice: str,
    phases: Sequence[Phase],
    records: list[TimedRecord],
    until: Callable[[], bool] | None,
    current: dict[str, int],
) -> dict[str, float]:
    """Run the phases; returns each phase's start (monotonic)."""
    starts: dict[str, float] = {}

    async def tracked() -> None:
        await reachable(address, voice)
        # Phase starts are read back from run_phases' progress through `current`.
        task = asyncio.ensure_future(
            run_phases(address, voice, sentences(), phases, records, until=until)
        )
        clock = time.monotonic()
        for phase in phases:
            starts[phase.name] = clock
            current["concurrency"] = phase.concurrency
            end = clock + phase.seconds
            while time.monotonic() < end and not task.done():
                await asyncio.sleep(0.2)
            clock = time.monotonic()
        await task
        current["concurrency"] = 0

    with installation.reach_service(endpoint) as address:
        asyncio.run(tracked())
    return starts


def streams_cut(records: Sequence[TimedRecord], since: float, until: float) -> list[dict[str, Any]]:
    """Streams in flight between `since` and `until` that ended early or with an error.

    A failed stream ended when its error arrived; one with no end was still streaming when the
    load stopped. A stream that failed before `since` was not cut by what happened after it.
    """
    cut = []
    for item in records:
        record = item.record
        end = record.ended_s if record.ended_s is not None else math.inf
        if record.sent_s > until or end < since:
            continue
        if record.error is not None or record.ended_s is None:
            cut.append({"sent_s": record.sent_s, "error": record.error})
    return cut


def pool_scenario(
    installation: Installation,
    controllers: AutoscalingWatch,
    adapter: MetricsAdapter,
    capacity: int,
    targets: Targets,
    steady_s: float,
    step_s: float,
    down_max_s: float,
) -> dict[str, Any]:
    kubectl = installation.kubectl
    kubectl.apply(voice_manifest("joe", targets))
    endpoint = ready_voice(kubectl, "joe")["status"]["endpoint"]
    low, high = max(1, round(capacity / 2)), max(2, round(capacity * 1.5))
    records: list[TimedRecord] = []
    current = {"concurrency": 0}
    started = time.monotonic()
    sampler = Sampler(
        kubectl, adapter, ["joe"], records, lambda: current["concurrency"], started
    ).start()
    first_event = len(controllers.events)

    def scaled_in() -> bool:
        events = controllers.events[first_event:]
        down = [e for e in events if e.to_replicas < e.from_replicas]
        if not down:
            return False
        ready = [
            p
            for p in kubectl.items("pods", POOL_PODS)
            if not p["metadata"].get("deletionTimestamp")
        ]
        return len(ready) <= down[-1].to_replicas and time.monotonic() - down[-1].time_s > 60

    phases = [
        Phase("steady", low, steady_s),
        Phase("step", high, step_s),
        Phase("down", low, down_max_s),
    ]
    try:
        starts = run_load(installation, endpoint, "joe", phases, records, scaled_in, current)
    finally:
        sampler.stop()
    events = controllers.events[first_event:]
    step_start = starts["step"]
    second = next(
        (
            s
            for s in sampler.timeline
            if s.get("serving_pods", {}).get("joe", 0) >= 2 and s["t"] >= step_start - started
        ),
        None,
    )
    step_first_audio = [
        s.first_audio_s
        for item in records
        if item.phase == "step" and (s := analyse_stream(item.record)).first_audio_s is not None
    ]
    downs = [e for e in events if e.to_replicas < e.from_replicas]
    cut: list[dict[str, Any]] = []
    if downs:
        # From the scale-in until the removed pod's grace period is surely over.
        cut = streams_cut(records, downs[0].time_s, downs[-1].time_s + 60)
    stats = [analyse_stream(item.record) for item in records]
    return {
        "voice_spec": voice_manifest("joe", targets)["spec"],
        "load_streams": {"steady": low, "step": high, "down": low},
        "phase_start_s": {k: round(v - started, 1) for k, v in starts.items()},
        "scale_up_seconds": (
            round(second["t"] - (step_start - started), 1) if second is not None else None
        ),
        "first_audio_p95_ms_during_step": (
            round(1000 * (percentile(step_first_audio, 0.95) or 0), 1) if step_first_audio else None
        ),
        "streams": len(records),
        "streams_with_underruns": sum(1 for s in stats if s.underruns),
        "streams_failed": sum(1 for s in stats if not s.completed),
        "scaled_in": bool(downs),
        "streams_cut_on_scale_in": len(cut) if downs else None,
        "streams_cut_detail": cut,
        "scale_events": [event_json(e, started) for e in events],
        "timeline": sampler.timeline,
    }


def per_voice_scenario(
    installation: Installation,
    controllers: AutoscalingWatch,
    adapter: MetricsAdapter,
    capacity: int,
    targets: Targets,
    steady_s: float,
    step_s: float,
) -> dict[str, Any]:
    kubectl = installation.kubectl
    first_event = len(controllers.events)
    per_voice = {"replicas": 1, "autoscaling": {"perVoice": True}}
    kubectl.apply(voice_manifest("joe", targets, **per_voice))
    kubectl.apply(voice_manifest("joe-fast", targets, speakingRate=1.25, **per_voice))
    endpoint = ready_voice(kubectl, "joe")["status"]["endpoint"]
    ready_voice(kubectl, "joe-fast")
    records: list[TimedRecord] = []
    current = {"concurrency": 0}
    started = time.monotonic()
    sampler = Sampler(
        kubectl, adapter, ["joe", "joe-fast"], records, lambda: current["concurrency"], started
    ).start()
    low, high = max(1, round(capacity / 2)), max(2, round(capacity * 1.5))

    def joe_on_two() -> bool:
        last = sampler.timeline[-1] if sampler.timeline else {}
        return bool(last.get("serving_pods", {}).get("joe", 0) >= 2)

    phases = [Phase("steady", low, steady_s), Phase("step", high, step_s)]
    try:
        starts = run_load(installation, endpoint, "joe", phases, records, joe_on_two, current)
        time.sleep(3 * SAMPLE_SECONDS)
    finally:
        sampler.stop()
    last = sampler.timeline[-1] if sampler.timeline else {}
    second = next(
        (
            s
            for s in sampler.timeline
            if s.get("serving_pods", {}).get("joe", 0) >= 2 and s["t"] >= starts["step"] - started
        ),
        None,
    )
    return {
        "load_streams": {"steady": low, "step": high, "voice": "joe"},
        "phase_start_s": {k: round(v - started, 1) for k, v in starts.items()},
        "joe_serving_pods_before_step": next(
            (
                s.get("serving_pods", {}).get("joe")
                for s in reversed(sampler.timeline)
                if "serving_pods" in s and s["t"] < starts["step"] - started
            ),
            None,
        ),
        "joe_serving_pods_at_end": last.get("serving_pods", {}).get("joe"),
        "joe_fast_serving_pods_at_end": last.get("serving_pods", {}).get("joe-fast"),
        "joe_scale_up_seconds": (
            round(second["t"] - (starts["step"] - started), 1) if second is not None else None
        ),
        "scale_events": [event_json(e, started) for e in controllers.events[first_event:]],
        "timeline": sampler.timeline,
    }


def event_json(event: ScaleEvent, started: float) -> dict[str, Any]:
    out = asdict(event)
    out["t"] = round(out.pop("time_s") - started, 1)
    out["metrics"] = dict(event.metrics)
    return out


def calibrate(
    installation: Installation,
    adapter: MetricsAdapter,
    targets: Targets,
    levels_to_run: list[int],
) -> dict[str, Any]:
    kubectl = installation.kubectl
    kubectl.apply(voice_manifest("joe", targets, autoscaling={"maxReplicas": 1}))
    endpoint = ready_voice(kubectl, "joe")["status"]["endpoint"]
    levels = {}
    for streams in levels_to_run:
        records: list[TimedRecord] = []
        run_load(
            installation,
            endpoint,
            "joe",
            [Phase(f"c{streams}", streams, 40)],
            records,
            None,
            {"concurrency": 0},
        )
        stats = [analyse_stream(r.record) for r in records]
        first = [s.first_audio_s for s in stats if s.first_audio_s is not None]
        levels[streams] = {
            "streams": len(stats),
            "first_audio_p50_ms": round(1000 * (percentile(first, 0.5) or 0), 1),
            "first_audio_p95_ms": round(1000 * (percentile(first, 0.95) or 0), 1),
            "streams_with_underruns": sum(1 for s in stats if s.underruns),
        }
        print(streams, levels[streams], flush=True)
    return {"calibration": levels}


@contextlib.contextmanager
def autoscaling_environment(
    workdir: Path, args: argparse.Namespace
) -> Iterator[tuple[Installation, AutoscalingWatch, MetricsAdapter]]:
    """A fresh installation (the controller manager's HPA period: `--sync-period`) with
    Prometheus and the real prometheus-adapter beside it; all stopped and removed on exit."""
    local_installation = importlib.import_module("installation").local_installation
    workdir.mkdir(parents=True, exist_ok=True)
    config = adapter_config_from_chart(
        "helm", "--set", f"prometheusAdapter.rules.rateWindow={args.rate_window}"
    )
    try:
        with (
            local_installation(workdir, hpa_sync_period_s=args.sync_period) as installation,
            PrometheusServer(args.scrape_interval, work_dir=workdir / "prometheus") as prometheus,
            MetricsAdapter(
                installation.cluster.control_plane,
                installation.kubectl,
                prometheus.url,
                config,
                workdir / "adapter",
            ) as adapter,
        ):
            watch = AutoscalingWatch(
                installation.kubectl,
                NAMESPACE,
                prometheus,
                target_refresh_s=parse_seconds(args.scrape_interval),
            ).start()
            try:
                yield installation, watch, adapter
            finally:
                watch.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def parse_seconds(duration: str) -> float:
    """A Prometheus duration such as 5s or 1m, in seconds."""
    units = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
    for unit in ("ms", "s", "m", "h"):
        if duration.endswith(unit):
            return float(duration[: -len(unit)]) * units[unit]
    return float(duration)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--sync-period",
        type=float,
        default=5.0,
        help="the controller manager's --horizontal-pod-autoscaler-sync-period, s "
        "(Kubernetes' default is 15; shortened, as the suite's 5 s scrapes allow)",
    )
    parser.add_argument("--scrape-interval", default="5s", help="Prometheus scrape interval")
    parser.add_argument(
        "--rate-window",
        default="30s",
        help="the chart's prometheusAdapter.rules.rateWindow (the chart's default, 1m, suits "
        "15 to 30 s scrapes; with a 5 s scrape 30 s still holds 6 samples and reacts sooner)",
    )
    # Calibrated 2026-11-25 (docs/autoscaling.md): one pod on one CPU held 12 streams.
    parser.add_argument("--capacity", type=int, default=12, help="streams one pod holds")
    parser.add_argument("--slo-ms", type=int, default=800, help="targetFirstAudioP95Ms")
    parser.add_argument(
        "--queue-target-ms", type=int, default=120, help="targetQueueMs (0: the same as --slo-ms)"
    )
    parser.add_argument("--steady", type=float, default=60.0)
    parser.add_argument("--step", type=float, default=150.0)
    parser.add_argument("--down-max", type=float, default=540.0)
    parser.add_argument("--scenarios", default="pool,per_voice")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument(
        "--calibrate-levels",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 2, 3, 4],
        help="streams per calibration level, e.g. 1,2,4,6,8",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="redraw the plot and doc from --out's JSON"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the raw JSON (default results/autoscaling.json, with the plot in docs/img/ and the "
        "numbers in docs/autoscaling.md); elsewhere, the plot and any page go beside it",
    )
    args = parser.parse_args(argv)
    doc: Path | None = None
    plot_path: Path | None = None
    if args.out is None:
        args.out = ROOT / "results" / "autoscaling.json"
        doc, plot_path = ROOT / "docs" / "autoscaling.md", ROOT / "docs" / "img" / "autoscaling.png"
    targets = Targets(args.slo_ms, args.queue_target_ms or args.slo_ms)
    if args.report_only:
        write(json.loads(args.out.read_text()), args.out, doc, plot_path)
        return 0
    if shutil.which("kubectl") is None or shutil.which("helm") is None:
        raise SystemExit("kubectl and helm must be on PATH (.tools/bin after `make setup`)")
    workdir = Path(tempfile.mkdtemp(prefix="voxfleet-autoscale-"))
    given = list(sys.argv[1:] if argv is None else argv)
    command = " ".join(
        ["make autoscale", *([f"AUTOSCALE_ARGS='{' '.join(given)}'"] if given else [])]
    )
    results: dict[str, Any] = {
        "command": command,
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.node()}, {platform.processor() or platform.machine()}, "
        f"{len(os.sched_getaffinity(0))} CPUs",
        "sync_period_s": args.sync_period,
        "scrape_interval": args.scrape_interval,
        "rate_window": args.rate_window,
        "slo_ms": args.slo_ms,
        "queue_target_ms": args.queue_target_ms or args.slo_ms,
        "pod_capacity_streams": args.capacity,
    }
    # Each scenario on a fresh installation: a pool still scaled out, or a p95 window still
    # full of the previous scenario's load, would say nothing about the next one.
    scenarios = ["calibrate"] if args.calibrate else args.scenarios.split(",")
    try:
        for scenario in scenarios:
            if scenario not in ("calibrate", "pool", "per_voice"):
                raise SystemExit(f"unknown scenario {scenario!r}: pool or per_voice")
            with autoscaling_environment(workdir / scenario, args) as (
                installation,
                controllers,
                adapter,
            ):
                try:
                    if scenario == "calibrate":
                        results.update(
                            calibrate(installation, adapter, targets, args.calibrate_levels)
                        )
                        print(json.dumps(results, indent=1))
                        return 0
                    if scenario == "pool":
                        results["pool"] = pool_scenario(
                            installation,
                            controllers,
                            adapter,
                            args.capacity,
                            targets,
                            args.steady,
                            args.step,
                            args.down_max,
                        )
                    elif scenario == "per_voice":
                        results["per_voice"] = per_voice_scenario(
                            installation,
                            controllers,
                            adapter,
                            args.capacity,
                            targets,
                            args.steady,
                            args.step,
                        )
                finally:
                    results.setdefault("controller_errors", {})[scenario] = controllers.errors[-20:]
            write(results, args.out, doc, plot_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
