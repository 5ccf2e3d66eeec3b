"""The cluster's autoscaling machinery, on a live cluster reached with `kubectl`.

`AutoscalingControllers` runs in a thread of its own what a cluster would run:

- the Prometheus Operator's part: every `target_refresh_s`, the scrape targets of the
  ServiceMonitors in the namespace (the operator's, or the one `build_pool_service_monitor`
  renders for each pool when the API serves no ServiceMonitors) handed to the real Prometheus;
- the HPA controller: every `sync_period_s`, each HorizontalPodAutoscaler in the namespace
  (the objects the operator created) evaluated with the documented algorithm (hpa.py) on
  the chart's adapter rules (adapter.py), and the target's scale patched when it changes:
  `kubectl scale deployment` for a pool, `spec.replicas` of a TTSVoice for a per-voice HPA
  (the API emulator serves no `scale` subresource, so the same field is patched directly).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from voxfleet_operator.names import POOL_LABEL
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.pool import build_pool_service_monitor

from autoscale.adapter import AdapterRule, PrometheusAdapter
from autoscale.hpa import Decision, HorizontalPodAutoscaler, MetricsSource, Scale, pod_state
from autoscale.prometheus import PrometheusServer, service_monitor_targets


class KubectlLike(Protocol):
    def get(self, *args: str) -> Any: ...

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]: ...

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> Any: ...


@dataclass(frozen=True)
class ScaleEvent:
    time_s: float  # time.monotonic()
    hpa: str
    target: str
    from_replicas: int
    to_replicas: int
    reason: str
    metrics: Mapping[str, int | None]


def parse_selector(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    return dict(part.split("=", 1) for part in text.split(",") if "=" in part)


def matches(selector: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


@dataclass
class AutoscalingControllers:
    kubectl: KubectlLike
    namespace: str
    prometheus: PrometheusServer
    rules: Sequence[AdapterRule]
    sync_period_s: float = 15.0
    target_refresh_s: float = 2.0
    events: list[ScaleEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _controllers: dict[str, HorizontalPodAutoscaler] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _pods: list[dict[str, Any]] = field(default_factory=list)
    _monitors_served: bool = True

    def start(self) -> AutoscalingControllers:
        self._thread = threading.Thread(target=self._run, name="autoscaling", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        next_sync = time.monotonic() + self.sync_period_s
        while not self._stop.is_set():
            try:
                self.refresh_targets()
                if time.monotonic() >= next_sync:
                    next_sync += self.sync_period_s
                    self.sync_all()
            except Exception as error:  # kept and reported; the loop goes on as a controller does
                self.errors.append(f"{time.monotonic():.1f}: {type(error).__name__}: {error}")
            self._stop.wait(self.target_refresh_s)

    # --- Prometheus Operator ---

    def refresh_targets(self) -> None:
        self._pods = self.kubectl.items("pods")
        services = self.kubectl.items("services")
        monitors = self._service_monitors()
        targets = []
        for monitor in monitors:
            targets.extend(service_monitor_targets(monitor, services, self._pods))
        self.prometheus.set_targets(targets)

    def _service_monitors(self) -> list[dict[str, Any]]:
        live: list[dict[str, Any]] = []
        if self._monitors_served:
            try:
                live = self.kubectl.items("servicemonitors.monitoring.coreos.com")
            except Exception:  # the API serves no ServiceMonitors (no Prometheus Operator)
                self._monitors_served = False
        if live:
            return live
        pools = {
            str(label)
            for d in self.kubectl.items("deployments")
            if (label := (d["metadata"].get("labels") or {}).get(POOL_LABEL))
        }
        return [
            build_pool_service_monitor(Pool(name=str(pool)), self.namespace)
            for pool in sorted(pools)
        ]

    # --- HPA controller ---

    def _list_pods(self, namespace: str, selector: Mapping[str, str] | None) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in self._pods
            if p["metadata"].get("namespace", namespace) == namespace
            and matches(selector or {}, p["metadata"].get("labels"))
        ]

    def sync_all(self) -> list[Decision]:
        adapter = PrometheusAdapter(self.prometheus.url, self.rules, self._list_pods)
        decisions = []
        for hpa in self.kubectl.items("horizontalpodautoscalers"):
            name = hpa["metadata"]["name"]
            controller = self._controllers.get(name)
            if controller is None:
                controller = self._controllers[name] = HorizontalPodAutoscaler(hpa)
            controller.hpa = hpa  # the operator may have changed min/max since
            decision = self.sync_one(controller, adapter)
            if decision is not None:
                decisions.append(decision)
        return decisions

    def _scale_of(self, target: Mapping[str, str]) -> tuple[Scale, Any] | None:
        if target["kind"] == "Deployment":
            obj = self.kubectl.get("deployment", target["name"])
            if obj is None:
                return None
            spec = obj.get("spec") or {}
            replicas = spec.get("replicas")
            selector = (spec.get("selector") or {}).get("matchLabels") or {}
            current = int((obj.get("status") or {}).get("replicas") or 0)
            return Scale(1 if replicas is None else int(replicas), current, selector), obj
        if target["kind"] == "TTSVoice":
            obj = self.kubectl.get("ttsv", target["name"])
            if obj is None:
                return None
            voice_status = obj.get("status") or {}
            return (
                Scale(
                    int((obj.get("spec") or {}).get("replicas") or 0),
                    int(voice_status.get("replicas") or 0),
                    parse_selector(voice_status.get("selector")),
                ),
                obj,
            )
        raise ValueError(f"cannot scale a {target['kind']}")

    def sync_one(
        self, controller: HorizontalPodAutoscaler, adapter: MetricsSource
    ) -> Decision | None:
        target = controller.spec["scaleTargetRef"]
        found = self._scale_of(target)
        if found is None:
            return None
        scale, _ = found
        pods = [
            pod_state(p)
            for p in self._pods
            if matches(scale.selector or {}, p["metadata"].get("labels"))
        ]
        decision = controller.sync(scale, pods, adapter, time.time())
        if decision.rescale:
            replicas = decision.desired_replicas
            # Through the target's scale subresource, as the HPA controller writes it.
            resource = "deployment" if target["kind"] == "Deployment" else "ttsv"
            self.kubectl.run("scale", resource, target["name"], f"--replicas={replicas}")
            self.events.append(
                ScaleEvent(
                    time.monotonic(),
                    controller.hpa["metadata"]["name"],
                    f"{target['kind']}/{target['name']}",
                    decision.current_replicas,
                    replicas,
                    decision.reason,
                    {p.metric: p.usage_milli for p in decision.proposals},
                )
            )
        return decision
