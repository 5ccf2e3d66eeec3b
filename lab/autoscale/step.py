"""`make autoscale`: a load step on the local cluster, and the autoscaling loop's response.

    python -m lab.autoscale.step [--sync-period 5] [--scrape-interval 5s] [--rate-window 30s] ...

One installation per scenario (e2e/installation.py: the real control plane and a real node,
the kubelet giving each pool pod the CPU shares its request asks for, the chart installed
with helm, the operator running from its image)
and, beside it, the real Prometheus (Debian's) scraping what the ServiceMonitors select, and
the real prometheus-adapter serving the chart's rules as `custom.metrics.k8s.io` (adapter.py);
the HPA controller is kube-controller-manager's own, with its sync period set by
`--sync-period` (5 s by default, shortened from Kubernetes' 15 s). controllers.py only watches
what it does. Listeners are load.py's: balanced clients over the voice's pods, either one
client per listener or one for all (`load.LAYOUTS`).

The load follows from what the pod measures it holds, not from a constant: each scenario
first runs `--measure-streams` listeners on the one pod (its voice capped at one pod) and reads
the pod's own `voxfleet_capacity_streams` (C); the steady load is then C/2 and the step 1.5 C.
Scenarios:

- pool (one client per listener) and pool_shared (one client for all): voice `joe` on the CPU
  pool. Steady load, a step, held, then steady again until the pool has scaled in and a
  minute more. Reported: time from the step to a second pod serving joe, first-audio p95 of
  the admitted streams sent during the step, admitted streams with underruns, streams every
  pod refused (apart), streams per pod after the scale-up, streams cut while a pod left, the
  scale events and a timeline.
- per_voice: `joe` and `joe-fast` on one pool, both `autoscaling.perVoice`, only joe loaded:
  joe's own HPA scales joe to 2 pods because of the step, joe-fast stays on 1.

Writes results/autoscaling.json.gz, docs/img/autoscaling.png and the measured block of
docs/autoscaling.md, which explains them. `--calibrate` instead runs levels of listeners on
one pod (`--calibrate-levels`) and reports what clients saw beside what the pod measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from cluster.processes import stop_on_sigterm
from e2e_support import NAMESPACE, POOL, ROOT, Kubectl, eventually
from hpa.adapter import MetricsAdapter, adapter_config_from_chart
from hpa.controllers import AutoscalingWatch, KubectlLike, ScaleEvent, current_metrics_milli
from hpa.prometheus import PrometheusServer
from installation import Installation, local_installation

from engines.bench.results import read_json
from engines.bench.timeline import analyse_stream, late_chunks
from engines.contract import names
from lab.autoscale.load import (
    ListenerProcess,
    ListenerSpec,
    Phase,
    TimedRecord,
    drive_phases,
)
from lab.autoscale.reader import ApiReader
from lab.autoscale.report import SAMPLE_SECONDS, write

POOL_DEPLOYMENT = f"voxfleet-triton-{POOL}"
POOL_PODS = f"app.kubernetes.io/name=voxfleet-triton,voxfleet.io/pool={POOL}"
JOE_PATH = "joe/en_US-joe-medium.onnx"
GRPC_PORT, METRICS_PORT = 8001, 8002
# How often the harness looks the voice's headless Service up again for the listeners
# (engines.client.tts's default for a client's own lookups).
RESOLVE_TTL_S = 2.0
SCENARIOS = ("pool", "pool_shared", "per_voice")
LAYOUT = {"pool": "per-listener", "pool_shared": "shared", "per_voice": "per-listener"}


@dataclass(frozen=True)
class Targets:
    """The scenarios' voices' targets (--slo-ms, --load-target-percent) and lead limit
    (--max-lead-ms)."""

    first_audio_p95_ms: int
    load_percent: int
    max_lead_ms: int = 0


def voice_manifest(
    name: str, targets: Targets, max_replicas: int = 2, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "voxfleet.io/v1alpha1",
        "kind": "TTSVoice",
        "metadata": {"name": name},
        "spec": {
            "pool": POOL,
            "source": {"pvc": {"claimName": "voices", "path": JOE_PATH}},
            **({"streaming": {"maxLeadMs": targets.max_lead_ms}} if targets.max_lead_ms else {}),
            **spec,
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": max_replicas,
                "targetFirstAudioP95Ms": targets.first_audio_p95_ms,
                "targetLoadPercent": targets.load_percent,
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


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def pod_metrics(address: str) -> dict[str, float]:
    """A pool pod's own view of its load, from its Triton metrics port: the real-time streams
    it holds (predicted from its calls' costs), its load ratio (the largest of its voices'
    series, which all carry the pod's), and its live and refused streams (summed over its
    voices)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=3) as response:
        text = response.read().decode()
    found = {"capacity": 0.0, "load": 0.0, "live": 0.0, "refused": 0.0}
    largest = {names.CAPACITY_STREAMS: "capacity", names.LOAD_RATIO: "load"}
    summed = {names.LIVE_STREAMS: "live", names.REFUSED_STREAMS_TOTAL: "refused"}
    for line in text.splitlines():
        metric = line.split("{", 1)[0]
        if metric in largest or metric in summed:
            value = float(line.rsplit(" ", 1)[1])
            if metric in largest:
                found[largest[metric]] = max(found[largest[metric]], value)
            else:
                found[summed[metric]] += value
    return found


class CpuMeter:
    """Where the machine's CPU goes between two calls, in cores: every pool pod's processes,
    the listeners' process, this one (the sampler, the endpoint lookups), and the rest of the
    machine (the control plane, Prometheus, the adapter, the operator, kubectl calls, anything
    else running)."""

    def __init__(self, installation: Installation, listeners: Callable[[], int | None]) -> None:
        self.cluster = installation.cluster
        self.listeners = listeners  # the listeners' process's pid, once it runs
        self._last: tuple[float, float, float, float, dict[int, float]] | None = None
        self._uids: dict[str, str | None] = {}  # a pod's name -> its uid, read once

    @staticmethod
    def _cpu(pid: int) -> float:
        try:
            times = psutil.Process(pid).cpu_times()
        except (psutil.Error, OSError):
            return 0.0
        return float(times.user + times.system)

    def sample(self, pods: Sequence[str]) -> dict[str, Any]:
        now = time.monotonic()
        machine = psutil.cpu_times()
        busy = float(sum(machine) - machine.idle - getattr(machine, "iowait", 0.0))
        mine = float(sum(psutil.Process().cpu_times()[:2]))
        pid = self.listeners()
        theirs = self._cpu(pid) if pid is not None else 0.0
        for pod in pods:
            if self._uids.get(pod) is None:
                self._uids[pod] = self.cluster.pod_uid(NAMESPACE, pod)
        pids = {pod: self.cluster.pod_processes(NAMESPACE, pod, self._uids[pod]) for pod in pods}
        per_pid = {pid: self._cpu(pid) for found in pids.values() for pid in found}
        last, self._last = self._last, (now, busy, mine, theirs, per_pid)
        if last is None:
            return {}
        elapsed = max(1e-6, now - last[0])

        def used(pid: int) -> float:
            return max(0.0, per_pid[pid] - last[4].get(pid, per_pid[pid]))

        by_pod = {pod: sum(used(pid) for pid in found) / elapsed for pod, found in pids.items()}
        machine_cores = (busy - last[1]) / elapsed
        harness = (mine - last[2]) / elapsed
        listeners = max(0.0, theirs - last[3]) / elapsed
        return {
            "machine": round(machine_cores, 2),
            "pods": {pod: round(cores, 2) for pod, cores in by_pod.items()},
            "listeners": round(listeners, 2),
            "harness": round(harness, 2),
            "rest": round(max(0.0, machine_cores - sum(by_pod.values()) - listeners - harness), 2),
        }


@dataclass
class Sampler:
    """Every SAMPLE_SECONDS: replicas, ready and serving pods, each pod's own load, the voices'
    metrics as their HPAs read them, the listeners' first audio, underruns and refusals."""

    kubectl: KubectlLike
    adapter: MetricsAdapter
    voices: Sequence[str]
    records: list[TimedRecord]
    clients: ListenerProcess  # the listeners' own counts
    concurrency: Callable[[], int]
    started: float
    cpu: CpuMeter | None = None
    # The pool HPA as the autoscaling watch last read it (no read of its own).
    pool_hpa: Callable[[], dict[str, Any]] = dict
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

    def voice_metric(self, metric: str, scale: float) -> dict[str, float | None]:
        """Each voice's value of an adapter metric of TTSVoices, as its HPA reads it."""
        values: dict[str, float | None] = {}
        for v in self.voices:
            value = self.adapter.metric(NAMESPACE, "ttsvoices.voxfleet.io", v, metric)
            values[v] = round(value * scale, 3) if value is not None else None
        return values

    def sample(self, counted: set[int]) -> dict[str, Any]:
        now = time.monotonic()
        deployment = self.kubectl.get("deployment", POOL_DEPLOYMENT) or {}
        hpa = self.pool_hpa()
        ready = [p for p in self.kubectl.items("pods", POOL_PODS) if pod_ready(p)]
        serving = {
            v: sum(
                1
                for p in ready
                if (p["metadata"].get("labels") or {}).get(f"serving.voxfleet.io/{v}") == "true"
            )
            for v in self.voices
        }
        pods: dict[str, dict[str, float]] = {}
        for pod in ready:
            with contextlib.suppress(OSError, ValueError):
                address = f"{pod['status']['podIP']}:{METRICS_PORT}"
                pods[pod["metadata"]["name"]] = pod_metrics(address)
        recent = [
            analyse_stream(r.record).first_audio_s
            for r in list(self.records)
            if now - 30 <= r.record.sent_s <= now and r.record.chunks
        ]
        underruns = 0
        for index, item in enumerate(list(self.records)):
            if index in counted or (item.record.ended_s is None and item.record.error is None):
                continue
            counted.add(index)
            underruns += analyse_stream(item.record).underruns
        specs = {v["metadata"]["name"]: v.get("spec") or {} for v in self.kubectl.items("ttsv")}
        return {
            "t": round(now - self.started, 1),
            "concurrency": self.concurrency(),
            "replicas": (deployment.get("spec") or {}).get("replicas") or 1,
            # What the pool HPA last read and wanted: why it did (not) scale.
            "pool_hpa": {
                "desired_replicas": (hpa.get("status") or {}).get("desiredReplicas"),
                "metrics_milli": current_metrics_milli(hpa),
            },
            "ready_pods": len(ready),
            "serving_pods": serving,
            "voice_replicas": {v: specs.get(v, {}).get("replicas") for v in self.voices},
            "pods": pods,
            "voice_load_pods": self.voice_metric("voxfleet_voice_load_pods", 1.0),
            "first_audio_p95_ms_prometheus": self.voice_metric(
                "voxfleet_voice_first_audio_p95_seconds", 1000.0
            ),
            "first_audio_p95_ms_client_30s": (
                ms(percentile([x for x in recent if x is not None], 0.95)) if recent else None
            ),
            "underruns": underruns,
            "refused_streams": self.clients.refused_streams,
            "streams_by_pod": {e: c["streams"] for e, c in self.clients.counts().items()},
            "cpu_cores": self.cpu.sample([p["metadata"]["name"] for p in ready])
            if self.cpu is not None
            else {},
        }


def voice_lookup(installation: Installation, voice: str) -> Callable[[], list[str]]:
    """What a lookup of `voice`'s headless Service would answer: the ready pods its
    EndpointSlices list (the harness runs on the host, outside cluster DNS)."""
    service = f"{voice}-tts-pods"

    def lookup() -> list[str]:
        return list(installation.cluster.endpoints(NAMESPACE, service, GRPC_PORT))

    return lookup


def run_load(
    run: Run, phases: Sequence[Phase], until: Callable[[], bool] | None
) -> dict[str, float]:
    """Run the phases with `run`'s listeners; returns each phase's start (monotonic)."""
    starts: dict[str, float] = {}

    def started(name: str, at: float, concurrency: int) -> None:
        starts[name] = at
        run.current["concurrency"] = concurrency

    try:
        with run.listeners:
            drive_phases(run.listeners, phases, until=until, started=started)
    finally:
        run.current["concurrency"] = 0
    return starts


def measured_capacity(timeline: Sequence[dict[str, Any]], since_s: float) -> int:
    """The real-time streams the pod says it holds: the median of its nonzero
    `voxfleet_capacity_streams` readings since `since_s` (s after the start)."""
    readings = [
        pod["capacity"]
        for sample in timeline
        if sample.get("t", -1) >= since_s
        for pod in (sample.get("pods") or {}).values()
        if pod.get("capacity")
    ]
    if not readings:
        raise AssertionError(
            "the pod reported no capacity while it streamed (voxfleet_capacity_streams): is "
            "its metrics port reachable?"
        )
    return max(1, round(statistics.median(readings)))


def load_levels(capacity: int) -> tuple[int, int]:
    """The steady load (half of what one pod holds) and the step (1.5 times it)."""
    return max(1, round(capacity / 2)), max(2, round(capacity * 1.5))


def streams_cut(records: Sequence[TimedRecord], since: float, until: float) -> list[dict[str, Any]]:
    """Streams in flight between `since` and `until` that ended with an error or never ended.

    A failed stream ended when its error arrived; one with no end was still streaming when the
    load stopped. A stream that failed before `since` was not cut by what happened after it,
    and a refusal (every pod full) is no cut: it never started."""
    cut = []
    for item in records:
        record = item.record
        end = record.ended_s if record.ended_s is not None else math.inf
        if record.sent_s > until or end < since or item.refused:
            continue
        if record.error is not None or record.ended_s is None:
            cut.append({"sent_s": record.sent_s, "error": record.error})
    return cut


def underrun_detail(records: Sequence[TimedRecord], started: float) -> list[dict[str, Any]]:
    """Each admitted stream that underran: when it was sent (s after `started`), its phase, its
    text's length, its first audio, the admitted streams in flight when it was sent, and its
    late chunks (index, how late, s after its first audio): where in a stream, and at what
    load, the listeners heard a gap."""
    admitted = [r.record for r in records if r.record.chunks]
    detail = []
    for item in records:
        record = item.record
        late = late_chunks(record) if record.chunks else []
        if not late:
            continue
        in_flight = sum(
            1
            for other in admitted
            if other.sent_s <= record.sent_s < (other.ended_s or math.inf) and other is not record
        )
        detail.append(
            {
                "sent_s": round(record.sent_s - started, 2),
                "phase": item.phase,
                "characters": len(record.text),
                "first_audio_ms": ms(record.chunks[0].arrival_s - record.sent_s),
                "streams_in_flight": in_flight,
                "late": [
                    {"chunk": c.index, "late_ms": ms(c.stall_s), "at_s": round(c.after_first_s, 2)}
                    for c in late
                ],
            }
        )
    return detail


def stream_stats(records: Sequence[TimedRecord], phase: str | None = None) -> dict[str, Any]:
    """Admitted streams (a pod took them), those with an underrun, refusals (every pod tried
    was full) and other failures; first audio of the admitted ones from their request, and
    the listeners' wait from when they first asked (refusals and retries included)."""
    chosen = [r for r in records if phase is None or r.phase == phase]
    admitted = [r for r in chosen if r.record.chunks]
    stats = [analyse_stream(r.record) for r in admitted]
    first = [s.first_audio_s for s in stats if s.first_audio_s is not None]
    waits = [r.record.chunks[0].arrival_s - r.asked_s for r in admitted]
    return {
        "streams": len(chosen),
        "admitted_streams": len(admitted),
        "admitted_streams_with_underruns": sum(1 for s in stats if s.underruns),
        "refused_streams": sum(1 for r in chosen if r.refused),
        "failed_streams": sum(
            1 for r in chosen if not r.refused and not r.record.chunks and r.record.error
        ),
        "first_audio_p95_ms": ms(percentile(first, 0.95)),
        "listener_wait_p95_ms": ms(percentile(waits, 0.95)),
    }


def first_sample(
    timeline: Sequence[dict[str, Any]], since: float, test: Callable[[dict[str, Any]], bool]
) -> dict[str, Any] | None:
    return next((s for s in timeline if s.get("t", -1) >= since and test(s)), None)


def spread_after(timeline: Sequence[dict[str, Any]], since: float, until: float) -> dict[str, int]:
    """Streams each pod got between two times (from the listeners' own counts)."""
    inside = [s for s in timeline if "streams_by_pod" in s and since <= s["t"] <= until]
    if len(inside) < 2:
        return {}
    first, last = inside[0]["streams_by_pod"], inside[-1]["streams_by_pod"]
    return {pod: count - first.get(pod, 0) for pod, count in sorted(last.items())}


def cpu_summary(
    timeline: Sequence[dict[str, Any]], since: float, until: float
) -> dict[str, float] | None:
    """Mean cores used between two times: the machine, the pool pods, the listeners, this
    harness, the rest."""
    samples = [
        s["cpu_cores"] for s in timeline if since <= s.get("t", -1) < until and s.get("cpu_cores")
    ]
    if not samples:
        return None
    return {
        "machine": round(statistics.fmean(c["machine"] for c in samples), 2),
        "pods": round(statistics.fmean(sum(c["pods"].values()) for c in samples), 2),
        "listeners": round(statistics.fmean(c["listeners"] for c in samples), 2),
        "harness": round(statistics.fmean(c.get("harness", 0.0) for c in samples), 2),
        "rest": round(statistics.fmean(c["rest"] for c in samples), 2),
    }


class Run:
    """One scenario's installation, listeners and sampler, and what they observed."""

    def __init__(
        self,
        installation: Installation,
        controllers: AutoscalingWatch,
        adapter: MetricsAdapter,
        voices: Sequence[str],
        layout: str,
    ) -> None:
        self.installation = installation
        self.kubectl = installation.kubectl
        self.controllers = controllers
        self.records: list[TimedRecord] = []
        self.current = {"concurrency": 0}
        self.listeners = ListenerProcess(
            ListenerSpec(layout, voices[0], RESOLVE_TTL_S),
            voice_lookup(installation, voices[0]),
            self.records,
        )
        self.started = time.monotonic()
        self.first_event = len(controllers.events)
        self.sampler = Sampler(
            ApiReader(self.kubectl),
            adapter,
            voices,
            self.records,
            self.listeners,
            lambda: self.current["concurrency"],
            self.started,
            CpuMeter(installation, lambda: self.listeners.pid),
            lambda: controllers.hpas.get(POOL_DEPLOYMENT, {}),
        )
        self.capacity = 0

    def t(self, monotonic: float) -> float:
        return round(monotonic - self.started, 1)

    def events(self) -> list[ScaleEvent]:
        return self.controllers.events[self.first_event :]

    def measure_then(
        self, args: argparse.Namespace, release: Callable[[], None]
    ) -> tuple[list[Phase], Callable[[], tuple[int, int]]]:
        """The phases that measure the pod's capacity with the voice held to one pod, settle at
        the steady load, then `release` the voice to scale; and the load levels found."""
        measuring: dict[str, float] = {}

        def mark() -> None:
            measuring["since"] = time.monotonic() - self.started + args.measure_s / 3

        def levels() -> tuple[int, int]:
            if not self.capacity:
                self.capacity = measured_capacity(self.sampler.timeline, measuring["since"])
            return load_levels(self.capacity)

        phases = [
            Phase("measure", args.measure_streams, args.measure_s, before=mark),
            # The adapter's window forgets the measuring load before the voice may scale.
            Phase("settle", lambda: levels()[0], args.settle_s),
            Phase("steady", lambda: levels()[0], args.steady, before=release),
        ]
        return phases, levels


def pool_scenario(
    installation: Installation,
    controllers: AutoscalingWatch,
    adapter: MetricsAdapter,
    targets: Targets,
    args: argparse.Namespace,
    layout: str,
) -> dict[str, Any]:
    kubectl = installation.kubectl
    kubectl.apply(voice_manifest("joe", targets, max_replicas=1))
    ready_voice(kubectl, "joe")
    run = Run(installation, controllers, adapter, ["joe"], layout)

    def release() -> None:
        kubectl.apply(voice_manifest("joe", targets, max_replicas=2))

    phases, levels = run.measure_then(args, release)

    def scaled_in() -> bool:
        down = [e for e in run.events() if e.to_replicas < e.from_replicas]
        if not down:
            return False
        ready = [
            p
            for p in kubectl.items("pods", POOL_PODS)
            if not p["metadata"].get("deletionTimestamp")
        ]
        return len(ready) <= down[-1].to_replicas and time.monotonic() - down[-1].time_s > 60

    phases += [
        Phase("step", lambda: levels()[1], args.step),
        Phase("down", lambda: levels()[0], args.down_max),
    ]
    run.sampler.start()
    try:
        starts = run_load(run, phases, scaled_in)
    finally:
        run.sampler.stop()
    timeline, events = run.sampler.timeline, run.events()
    step_at, down_at = run.t(starts["step"]), run.t(starts["down"])
    second = first_sample(timeline, step_at, lambda s: s.get("serving_pods", {}).get("joe", 0) >= 2)
    before_step = [
        s for s in timeline if "serving_pods" in s and run.t(starts["steady"]) <= s["t"] < step_at
    ]
    downs = [e for e in events if e.to_replicas < e.from_replicas]
    cut: list[dict[str, Any]] = []
    if downs:
        # From the scale-in until the removed pod's grace period is surely over.
        cut = streams_cut(run.records, downs[0].time_s, downs[-1].time_s + 60)
    low, high = levels()
    whole, step = stream_stats(run.records), stream_stats(run.records, "step")
    return {
        "layout": layout,
        "voice_spec": voice_manifest("joe", targets)["spec"],
        "pod_capacity_streams": run.capacity,
        "load_streams": {
            "measure": args.measure_streams,
            "steady": low,
            "step": high,
            "down": low,
        },
        "phase_start_s": {k: run.t(v) for k, v in starts.items()},
        "ready_pods_before_step": max((s["ready_pods"] for s in before_step), default=None),
        "scale_up_seconds": round(second["t"] - step_at, 1) if second is not None else None,
        "first_audio_p95_ms_during_step": step["first_audio_p95_ms"],
        "listener_wait_p95_ms_during_step": step["listener_wait_p95_ms"],
        "step": step,
        **whole,
        "streams_per_pod_after_scale_up": (
            spread_after(timeline, second["t"], down_at) if second is not None else {}
        ),
        "cpu_cores": {
            "steady": cpu_summary(timeline, run.t(starts["steady"]), step_at),
            "step_one_pod": cpu_summary(timeline, step_at, second["t"] if second else down_at),
            "step_two_pods": cpu_summary(timeline, second["t"], down_at) if second else None,
        },
        "scaled_in": bool(downs),
        "scale_in_seconds_after_step": run.t(downs[0].time_s) - down_at if downs else None,
        "streams_cut_on_scale_in": len(cut) if downs else None,
        "streams_cut_detail": cut,
        "underrun_detail": underrun_detail(run.records, run.started),
        # (s after the start when the stall ended, ms) for each stall of the listeners' loop.
        "listener_loop_stalls": [
            (round(t - run.started, 2), ms(late)) for t, late in run.listeners.stalls
        ],
        "listener_priority": run.listeners.priority,
        # Where the listeners' loop was while it stalled, most sampled first.
        "listener_loop_stall_places": run.listeners.stall_places,
        "scale_events": [event_json(e, run.started) for e in events],
        "timeline": timeline,
    }


def per_voice_scenario(
    installation: Installation,
    controllers: AutoscalingWatch,
    adapter: MetricsAdapter,
    targets: Targets,
    args: argparse.Namespace,
) -> dict[str, Any]:
    kubectl = installation.kubectl
    per_voice = {"replicas": 1, "autoscaling": {"perVoice": True}}
    voices = {"joe": {}, "joe-fast": {"speakingRate": 1.25}}

    def apply(max_replicas: int) -> None:
        for name, spec in voices.items():
            kubectl.apply(voice_manifest(name, targets, max_replicas, **spec, **per_voice))

    apply(1)
    for name in voices:
        ready_voice(kubectl, name)
    run = Run(installation, controllers, adapter, list(voices), LAYOUT["per_voice"])
    phases, levels = run.measure_then(args, lambda: apply(2))

    def joe_on_two() -> bool:
        last = run.sampler.timeline[-1] if run.sampler.timeline else {}
        return bool(last.get("serving_pods", {}).get("joe", 0) >= 2)

    phases.append(Phase("step", lambda: levels()[1], args.step))
    run.sampler.start()
    try:
        starts = run_load(run, phases, joe_on_two)
        time.sleep(3 * SAMPLE_SECONDS)
    finally:
        run.sampler.stop()
    timeline = run.sampler.timeline
    step_at = run.t(starts["step"])
    last = timeline[-1] if timeline else {}
    before = [
        s for s in timeline if "serving_pods" in s and run.t(starts["steady"]) <= s["t"] < step_at
    ]
    second = first_sample(timeline, step_at, lambda s: s.get("serving_pods", {}).get("joe", 0) >= 2)
    low, high = levels()
    return {
        "layout": LAYOUT["per_voice"],
        "pod_capacity_streams": run.capacity,
        "load_streams": {"measure": args.measure_streams, "steady": low, "step": high},
        "phase_start_s": {k: run.t(v) for k, v in starts.items()},
        # The most pods serving each voice at any sample between the release and the step.
        "serving_pods_before_step": {
            v: max((s["serving_pods"].get(v, 0) for s in before), default=None) for v in voices
        },
        "joe_serving_pods_at_end": last.get("serving_pods", {}).get("joe"),
        "joe_fast_serving_pods_at_end": last.get("serving_pods", {}).get("joe-fast"),
        "joe_scale_up_seconds": round(second["t"] - step_at, 1) if second is not None else None,
        **stream_stats(run.records),
        "scale_events": [event_json(e, run.started) for e in run.events()],
        "timeline": timeline,
    }


def event_json(event: ScaleEvent, started: float) -> dict[str, Any]:
    out = asdict(event)
    out["t"] = round(out.pop("time_s") - started, 1)
    out["metrics"] = dict(event.metrics)
    return out


def calibrate(
    installation: Installation,
    controllers: AutoscalingWatch,
    adapter: MetricsAdapter,
    targets: Targets,
    levels_to_run: list[int],
) -> dict[str, Any]:
    """Levels of listeners on one pod: what they saw, and what the pod said it holds."""
    kubectl = installation.kubectl
    kubectl.apply(voice_manifest("joe", targets, max_replicas=1))
    ready_voice(kubectl, "joe")
    levels = {}
    for streams in levels_to_run:
        run = Run(installation, controllers, adapter, ["joe"], "shared")
        run.sampler.start()
        try:
            run_load(run, [Phase(f"c{streams}", streams, 40)], None)
        finally:
            run.sampler.stop()
        capacities = [
            pod["capacity"] for s in run.sampler.timeline for pod in (s.get("pods") or {}).values()
        ]
        levels[streams] = {
            **stream_stats(run.records),
            "pod_capacity_streams": sorted(set(capacities)),
        }
        print(streams, json.dumps(levels[streams]), flush=True)
    return {"calibration": levels}


@contextlib.contextmanager
def autoscaling_environment(
    workdir: Path, args: argparse.Namespace
) -> Iterator[tuple[Installation, AutoscalingWatch, MetricsAdapter]]:
    """A fresh installation (the controller manager's HPA period: `--sync-period`) with
    Prometheus and the real prometheus-adapter beside it; all stopped and removed on exit."""
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
                ApiReader(installation.kubectl),
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
    parser.add_argument("--slo-ms", type=int, default=800, help="targetFirstAudioP95Ms")
    parser.add_argument(
        "--load-target-percent", type=int, default=70, help="targetLoadPercent (the chart's 70)"
    )
    parser.add_argument(
        "--max-lead-ms",
        type=int,
        default=1000,
        help="the voices' streaming.maxLeadMs: the listeners play in real time; without a "
        "limit every pod makes audio as fast as it can, busy at any load (0: none)",
    )
    parser.add_argument(
        "--measure-streams",
        type=int,
        default=4,
        help="listeners on the one pod while its capacity is read (voxfleet_capacity_streams)",
    )
    parser.add_argument("--measure-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=35.0)
    parser.add_argument("--steady", type=float, default=60.0)
    parser.add_argument("--step", type=float, default=150.0)
    parser.add_argument("--down-max", type=float, default=540.0)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument(
        "--calibrate-levels",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[2, 4, 6, 8, 12],
        help="listeners per calibration level, e.g. 2,4,8",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="redraw the plot and doc from --out's JSON"
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="the raw JSON (default results/autoscaling.json.gz, with the plot in docs/img/ and "
        "the numbers in docs/autoscaling.md); elsewhere, the plot and any page go beside it",
    )
    args = parser.parse_args(argv)
    doc: Path | None = None
    plot_path: Path | None = None
    if args.out is None:
        args.out = ROOT / "results" / "autoscaling.json.gz"
        doc, plot_path = ROOT / "docs" / "autoscaling.md", ROOT / "docs" / "img" / "autoscaling.png"
    targets = Targets(args.slo_ms, args.load_target_percent, args.max_lead_ms)
    if args.report_only:
        write(read_json(args.out), args.out, doc, plot_path)
        return 0
    if shutil.which("kubectl") is None or shutil.which("helm") is None:
        raise SystemExit("kubectl and helm must be on PATH (.tools/bin after `make setup`)")
    scenarios = ["calibrate"] if args.calibrate else args.scenarios.split(",")
    for scenario in scenarios:
        if scenario not in ("calibrate", *SCENARIOS):
            raise SystemExit(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
    # A SIGTERM (a `timeout`, a `kill`) unwinds the run, so that its clusters are stopped.
    stop_on_sigterm()
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
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "sync_period_s": args.sync_period,
        "scrape_interval": args.scrape_interval,
        "rate_window": args.rate_window,
        "slo_ms": args.slo_ms,
        "load_target_percent": args.load_target_percent,
        "max_lead_ms": args.max_lead_ms,
    }
    # Each scenario on a fresh installation: a pool still scaled out, or a window still full
    # of the previous scenario's load, would say nothing about the next one.
    try:
        for scenario in scenarios:
            with autoscaling_environment(workdir / scenario, args) as (
                installation,
                controllers,
                adapter,
            ):
                try:
                    if scenario == "calibrate":
                        results.update(
                            calibrate(
                                installation, controllers, adapter, targets, args.calibrate_levels
                            )
                        )
                        print(json.dumps(results, indent=1))
                        return 0
                    if scenario == "per_voice":
                        results[scenario] = per_voice_scenario(
                            installation, controllers, adapter, targets, args
                        )
                    else:
                        results[scenario] = pool_scenario(
                            installation, controllers, adapter, targets, args, LAYOUT[scenario]
                        )
                finally:
                    results.setdefault("controller_errors", {})[scenario] = controllers.errors[-20:]
            write(results, args.out, doc, plot_path)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
