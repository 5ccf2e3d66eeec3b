"""What runs beside the real HPA controller during `make autoscale`, reached with `kubectl`.

`AutoscalingWatch` runs in a thread of its own:
- the Prometheus Operator's part: every `target_refresh_s`, the scrape targets of the
  ServiceMonitors in the namespace (the operator's, or the one `build_pool_service_monitor`
  renders for each pool when the API serves no ServiceMonitors), handed to the real
  Prometheus, from the pods and Services as the API server has them;
- an observer of the real HPA controller (kube-controller-manager's): every
  `observe_s`, each HorizontalPodAutoscaler's target scale; a change of it is a
  `ScaleEvent`, with the HPA's `currentMetrics` (as the adapter served them, milli-units)
  and its AbleToScale/ScalingActive/ScalingLimited reasons. HPA conditions that say the
  controller could not read a metric are kept in `errors`.

Nothing here decides or writes a scale: that is the controller manager's HPA controller.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from voxfleet_operator.names import POOL_LABEL
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.pool import build_pool_service_monitor

from hpa.adapter import quantity
from hpa.prometheus import PrometheusServer, service_monitor_targets


class KubectlLike(Protocol):
    def get(self, *args: str) -> Any: ...

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]: ...


@dataclass(frozen=True)
class ScaleEvent:
    time_s: float  # time.monotonic() when the change was seen
    hpa: str
    target: str
    from_replicas: int
    to_replicas: int
    reason: str
    metrics: Mapping[str, int | None]


def current_metrics_milli(hpa: Mapping[str, Any]) -> dict[str, int | None]:
    """The metric values the HPA controller read, by metric name, in milli-units."""
    values: dict[str, int | None] = {}
    for item in (hpa.get("status") or {}).get("currentMetrics") or []:
        source = item.get(str(item.get("type", "")).lower()) or {}
        name = (source.get("metric") or {}).get("name", "?")
        current = source.get("current") or {}
        value = current.get("averageValue") or current.get("value")
        values[name] = round(quantity(value) * 1000) if value is not None else None
    return values


def conditions_text(hpa: Mapping[str, Any]) -> str:
    return "; ".join(
        f"{c['type']}={c['status']} {c.get('reason', '')}"
        for c in (hpa.get("status") or {}).get("conditions") or []
    )


@dataclass
class AutoscalingWatch:
    kubectl: KubectlLike
    namespace: str
    prometheus: PrometheusServer
    target_refresh_s: float = 2.0
    observe_s: float = 1.0
    events: list[ScaleEvent] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    # Each HPA as last read (by name), for samplers that report what it read and wanted.
    hpas: dict[str, dict[str, Any]] = field(default_factory=dict)
    _scales: dict[str, int] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _monitors_served: bool = True

    def start(self) -> AutoscalingWatch:
        self._thread = threading.Thread(target=self._run, name="autoscaling", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        next_refresh = 0.0
        while not self._stop.is_set():
            try:
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.target_refresh_s
                    self.refresh_targets()
                self.observe()
            except Exception as error:  # kept and reported; the watch goes on
                self.errors.append(f"{time.monotonic():.1f}: {type(error).__name__}: {error}")
            self._stop.wait(self.observe_s)

    # --- Prometheus Operator ---

    def refresh_targets(self) -> None:
        pods = self.kubectl.items("pods")
        services = self.kubectl.items("services")
        targets = []
        for monitor in self._service_monitors():
            targets.extend(service_monitor_targets(monitor, services, pods))
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

    # --- the real HPA controller, observed ---

    def observe(self) -> None:
        hpas = self.kubectl.items("horizontalpodautoscalers")
        self.hpas = {hpa["metadata"]["name"]: hpa for hpa in hpas}
        for hpa in hpas:
            name = hpa["metadata"]["name"]
            target = hpa["spec"]["scaleTargetRef"]
            kind = "deployment" if target["kind"] == "Deployment" else "ttsv"
            obj = self.kubectl.get(kind, target["name"]) or {}
            replicas = int((obj.get("spec") or {}).get("replicas") or 1)
            before = self._scales.get(name)
            self._scales[name] = replicas
            for condition in (hpa.get("status") or {}).get("conditions") or []:
                if condition["type"] == "ScalingActive" and condition["status"] == "False":
                    text = f"{name}: {condition.get('reason')}: {condition.get('message', '')}"
                    if not self.errors or not self.errors[-1].endswith(text):
                        self.errors.append(f"{time.monotonic():.1f}: {text}")
            if before is not None and before != replicas:
                self.events.append(
                    ScaleEvent(
                        time.monotonic(),
                        name,
                        f"{target['kind']}/{target['name']}",
                        before,
                        replicas,
                        conditions_text(hpa),
                        current_metrics_milli(hpa),
                    )
                )
