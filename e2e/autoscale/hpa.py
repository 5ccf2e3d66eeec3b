"""kube-controller-manager's HorizontalPodAutoscaler algorithm, applied to a rendered HPA.

The HPA controller is part of a Go binary that cannot be installed here, so the e2e suite
applies the documented algorithm (and, where the documentation is silent, what
`pkg/controller/podautoscaler` does) to the `autoscaling/v2` HPA the operator renders:

- per metric, `desiredReplicas = ceil(currentReplicas x currentValue / target)`:
  `Pods` metrics with an `AverageValue` target (mean over the pods with a sample),
  `Object` and `External` metrics with a `Value` target (ratio times the ready pods) or an
  `AverageValue` target (`ceil(value / target)`), all in milli-units as the controller does;
- the tolerance (10 % by default): a ratio within it leaves the count alone;
- pods being deleted or failed are ignored; pending pods and not-yet-ready pods are set
  aside; pods without a sample are "missing". When pods were set aside or missing, the
  mean is recomputed with missing pods at 100 % of the target on a scale-down and 0 % on
  a scale-up, and not-yet-ready pods at 0 % on a scale-up; a result that flips direction
  or falls within the tolerance leaves the count alone;
- the largest proposal over all metrics wins; when a metric cannot be read and the others
  propose a scale-down, nothing scales;
- `minReplicas`/`maxReplicas` clamping, and `spec.replicas == 0` disables autoscaling;
- `behavior` with the API server's defaults filled in: stabilisation windows (the highest
  recommendation of the scale-down window, the lowest of the scale-up window, the count at
  the controller's first sync of the HPA being the first recommendation), and rate policies
  (`Pods`/`Percent` over `periodSeconds`, counted from the scale events of this controller,
  with `selectPolicy` Max, Min or Disabled).

Not emulated: `Resource` and `ContainerResource` metrics (they need metrics-server), metric
label selectors (`metric.selector`; the chart's rules need none), the
per-HPA tolerance of `behavior` (alpha in Kubernetes 1.33), the controller's events and
status conditions (only the desired count and a reason come back), and its work queue (one
`sync` per call). Readiness: the documentation describes setting not-yet-ready pods aside
for every metric and that is what is applied here; the controller's code applies the
readiness part (initial readiness delay, CPU initialisation period) to CPU only, where
custom metrics set aside only pending pods. `readiness_for_custom_metrics=False` gives the
code's behaviour.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

DEFAULT_TOLERANCE = 0.1
DEFAULT_SYNC_PERIOD_SECONDS = 15.0
DEFAULT_DOWNSCALE_STABILIZATION_SECONDS = 300
DEFAULT_INITIAL_READINESS_DELAY_SECONDS = 30.0
DEFAULT_CPU_INITIALIZATION_PERIOD_SECONDS = 300.0

# autoscaling/v2 defaults (SetDefaults_HorizontalPodAutoscalerBehavior).
_DEFAULT_SCALE_UP: dict[str, Any] = {
    "stabilizationWindowSeconds": 0,
    "selectPolicy": "Max",
    "policies": [
        {"type": "Pods", "value": 4, "periodSeconds": 15},
        {"type": "Percent", "value": 100, "periodSeconds": 15},
    ],
}
_DEFAULT_SCALE_DOWN: dict[str, Any] = {
    "selectPolicy": "Max",
    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}

_QUANTITY = re.compile(
    r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$"
)
_SUFFIX = {
    None: Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}


def milli_value(quantity: str | float | int) -> int:
    """A Kubernetes quantity in milli-units, rounded up as `Quantity.MilliValue()` does."""
    if isinstance(quantity, (int, float)):
        return math.ceil(Decimal(str(quantity)) * 1000)
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {quantity!r}")
    value = Decimal(match.group(1)) * _SUFFIX[match.group(2)] * 1000
    return math.ceil(value)


class MetricUnavailable(RuntimeError):
    """A metric could not be read (no series, no pods): the HPA proposes nothing for it."""


class MetricsSource(Protocol):
    """What the custom and external metrics APIs answer (prometheus-adapter in a cluster);
    `selector` is the label selector of the HPA target's pods."""

    def pod_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> dict[str, PodSample]: ...

    def object_metric(
        self,
        namespace: str,
        metric: str,
        described_object: Mapping[str, str],
        selector: Mapping[str, str] | None,
    ) -> float: ...

    def external_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> list[float]: ...


@dataclass(frozen=True)
class PodSample:
    """One pod's value of a metric, and when (epoch seconds) over which window it was taken."""

    value: float
    timestamp: float = 0.0
    window_seconds: float = 60.0


@dataclass(frozen=True)
class PodState:
    """What the HPA reads of a pod of its target (times in epoch seconds)."""

    name: str
    phase: str = "Running"
    ready: bool = True
    deleting: bool = False
    start_time: float | None = 0.0
    ready_transition_time: float | None = 0.0


def _epoch(timestamp: str | None) -> float | None:
    if not timestamp:
        return None
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def pod_state(pod: Mapping[str, Any]) -> PodState:
    """A `v1.Pod` object as the HPA sees it."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    ready_condition = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None
    )
    return PodState(
        name=meta["name"],
        phase=status.get("phase") or "Pending",
        ready=bool(ready_condition and ready_condition.get("status") == "True"),
        deleting=bool(meta.get("deletionTimestamp")),
        start_time=_epoch(status.get("startTime")),
        ready_transition_time=(
            _epoch(ready_condition.get("lastTransitionTime")) if ready_condition else None
        ),
    )


@dataclass(frozen=True)
class Scale:
    """The target's scale subresource: `spec.replicas`, `status.replicas`, its selector."""

    spec_replicas: int
    status_replicas: int
    selector: Mapping[str, str] | None = None


@dataclass(frozen=True)
class MetricProposal:
    metric: str
    replicas: int | None
    usage_milli: int | None
    error: str | None = None


@dataclass(frozen=True)
class Decision:
    """One sync: the count the target should have now, and why."""

    current_replicas: int
    desired_replicas: int
    reason: str
    proposals: tuple[MetricProposal, ...] = ()
    metric_replicas: int | None = None
    stabilized_replicas: int | None = None

    @property
    def rescale(self) -> bool:
        return self.desired_replicas != self.current_replicas


@dataclass
class _ScaleEvent:
    change: int
    timestamp: float


@dataclass
class _Recommendation:
    replicas: int
    timestamp: float


def behavior_with_defaults(
    spec: Mapping[str, Any], downscale_stabilization_seconds: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The (scaleUp, scaleDown) rules as the API server defaults them."""
    behavior = spec.get("behavior") or {}
    up = {**_DEFAULT_SCALE_UP, **(behavior.get("scaleUp") or {})}
    down = {
        **_DEFAULT_SCALE_DOWN,
        "stabilizationWindowSeconds": downscale_stabilization_seconds,
        **(behavior.get("scaleDown") or {}),
    }
    return up, down


def _changes_within(period_seconds: float, events: Sequence[_ScaleEvent], now: float) -> int:
    cutoff = now - period_seconds
    return sum(e.change for e in events if e.timestamp > cutoff)


def _policy_starts(
    current: int,
    up_events: Sequence[_ScaleEvent],
    down_events: Sequence[_ScaleEvent],
    rules: Mapping[str, Any],
    now: float,
) -> list[tuple[Mapping[str, Any], int]]:
    """Each policy with the replica count it starts from: the count before the changes
    made within its period (as both limit functions of the controller compute it)."""
    starts = []
    for policy in rules.get("policies") or []:
        added = _changes_within(policy["periodSeconds"], up_events, now)
        deleted = _changes_within(policy["periodSeconds"], down_events, now)
        starts.append((policy, current - added + deleted))
    return starts


def scale_up_limit(
    current: int,
    up_events: Sequence[_ScaleEvent],
    down_events: Sequence[_ScaleEvent],
    rules: Mapping[str, Any],
    now: float,
) -> int:
    """calculateScaleUpLimitWithScalingRules: the most replicas the policies allow now."""
    select = rules.get("selectPolicy", "Max")
    if select == "Disabled":
        return current
    proposals = []
    for policy, start in _policy_starts(current, up_events, down_events, rules, now):
        if policy["type"] == "Pods":
            proposals.append(start + int(policy["value"]))
        else:  # Percent: rounded up, or a small target could never grow
            proposals.append(math.ceil(start * (1 + int(policy["value"]) / 100)))
    if not proposals:
        return current
    return min(proposals) if select == "Min" else max(proposals)


def scale_down_limit(
    current: int,
    up_events: Sequence[_ScaleEvent],
    down_events: Sequence[_ScaleEvent],
    rules: Mapping[str, Any],
    now: float,
) -> int:
    """calculateScaleDownLimitWithBehaviors: the fewest replicas the policies allow now."""
    select = rules.get("selectPolicy", "Max")
    if select == "Disabled":
        return current
    proposals = []
    for policy, start in _policy_starts(current, up_events, down_events, rules, now):
        if policy["type"] == "Pods":
            proposals.append(start - int(policy["value"]))
        else:  # Percent: truncated toward zero, as int32(float64) does
            proposals.append(int(start * (1 - int(policy["value"]) / 100)))
    if not proposals:
        return current
    # "Max" means the largest change, which for a scale-down is the smallest count.
    return max(proposals) if select == "Min" else min(proposals)


@dataclass
class HorizontalPodAutoscaler:
    """The controller's state for one HPA: recommendations and scale events over time.

    Call `sync` once per sync period with the live scale, the target's pods and a metrics
    source; apply `Decision.desired_replicas` to the scale when `Decision.rescale`.
    """

    hpa: Mapping[str, Any]
    tolerance: float = DEFAULT_TOLERANCE
    downscale_stabilization_seconds: int = DEFAULT_DOWNSCALE_STABILIZATION_SECONDS
    initial_readiness_delay_seconds: float = DEFAULT_INITIAL_READINESS_DELAY_SECONDS
    cpu_initialization_period_seconds: float = DEFAULT_CPU_INITIALIZATION_PERIOD_SECONDS
    readiness_for_custom_metrics: bool = True
    _recommendations: list[_Recommendation] = field(default_factory=list)
    _initialized: bool = False
    _up_events: list[_ScaleEvent] = field(default_factory=list)
    _down_events: list[_ScaleEvent] = field(default_factory=list)

    @property
    def spec(self) -> Mapping[str, Any]:
        spec: Mapping[str, Any] = self.hpa["spec"]
        return spec

    @property
    def namespace(self) -> str:
        return str(self.hpa["metadata"].get("namespace") or "default")

    # --- per-metric replica calculation (replica_calculator.go) ---

    def _unready(self, pod: PodState, sample: PodSample, now: float) -> bool:
        if not self.readiness_for_custom_metrics:
            return False
        if pod.ready_transition_time is None or pod.start_time is None:
            return True
        if pod.start_time + self.cpu_initialization_period_seconds > now:
            # Within the initialisation period: set aside unless ready and sampled since.
            return (not pod.ready) or (
                sample.timestamp < pod.ready_transition_time + sample.window_seconds
            )
        # Later: set aside only a pod that has never been ready.
        return (not pod.ready) and (
            pod.start_time + self.initial_readiness_delay_seconds > pod.ready_transition_time
        )

    def pods_metric_replicas(
        self,
        current_replicas: int,
        target_milli: int,
        samples: Mapping[str, PodSample],
        pods: Sequence[PodState],
        now: float,
    ) -> tuple[int, int]:
        """calcPlainMetricReplicas: (proposed replicas, mean usage in milli-units)."""
        if not pods:
            raise MetricUnavailable("no pods returned by selector while calculating replicas")
        ready_count = 0
        unready: set[str] = set()
        missing: set[str] = set()
        values: dict[str, int] = {}
        for pod in pods:
            if pod.deleting or pod.phase == "Failed":
                continue
            if pod.phase == "Pending":
                unready.add(pod.name)
                continue
            sample = samples.get(pod.name)
            if sample is None:
                missing.add(pod.name)
                continue
            if self._unready(pod, sample, now):
                unready.add(pod.name)
                continue
            ready_count += 1
            values[pod.name] = milli_value(sample.value)
        if not values:
            raise MetricUnavailable(
                "did not receive metrics for targeted pods (pods might be unready)"
            )
        usage = sum(values.values()) // len(values)
        ratio = usage / target_milli
        scale_up_with_unready = bool(unready) and ratio > 1.0
        if not scale_up_with_unready and not missing:
            if abs(1.0 - ratio) <= self.tolerance:
                return current_replicas, usage
            return math.ceil(ratio * ready_count), usage
        if missing:
            # Conservative: a missing pod holds the count on a scale-down, damps a scale-up.
            for name in missing:
                values[name] = target_milli if ratio < 1.0 else 0
        if scale_up_with_unready:
            for name in unready:
                values[name] = 0
        new_ratio = (sum(values.values()) // len(values)) / target_milli
        if (
            abs(1.0 - new_ratio) <= self.tolerance
            or (ratio < 1.0 < new_ratio)
            or (new_ratio < 1.0 < ratio)
        ):
            return current_replicas, usage
        proposed = math.ceil(new_ratio * len(values))
        if (new_ratio < 1.0 and proposed > current_replicas) or (
            new_ratio > 1.0 and proposed < current_replicas
        ):
            return current_replicas, usage
        return proposed, usage

    def _value_replicas(
        self, current_replicas: int, usage: int, target: int, pods: Sequence[PodState]
    ) -> int:
        """Object/External metrics with a Value target: ratio times the ready pods."""
        ratio = usage / target
        if abs(1.0 - ratio) <= self.tolerance:
            return current_replicas
        ready = sum(1 for p in pods if p.phase == "Running" and p.ready and not p.deleting)
        if ready == 0:
            raise MetricUnavailable("no ready pods for a Value target")
        return math.ceil(ratio * ready)

    def _average_value_replicas(self, status_replicas: int, usage: int, target: int) -> int:
        """Object/External metrics with an AverageValue target: usage over the per-pod target."""
        if status_replicas > 0 and abs(1.0 - usage / (target * status_replicas)) <= self.tolerance:
            return status_replicas
        return math.ceil(usage / target)

    def _metric_replicas(
        self,
        metric: Mapping[str, Any],
        scale: Scale,
        pods: Sequence[PodState],
        source: MetricsSource,
        now: float,
    ) -> MetricProposal:
        kind = metric["type"]
        body = metric[{"Pods": "pods", "Object": "object", "External": "external"}.get(kind, "")]
        name = body["metric"]["name"]
        # The custom metrics API is asked for the pods of the target's selector.
        selector = scale.selector
        target = body["target"]
        try:
            if kind == "Pods":
                if target["type"] != "AverageValue":
                    raise MetricUnavailable(f"Pods metric {name} needs an AverageValue target")
                samples = source.pod_metric(self.namespace, name, selector)
                replicas, usage = self.pods_metric_replicas(
                    scale.spec_replicas, milli_value(target["averageValue"]), samples, pods, now
                )
                return MetricProposal(name, replicas, usage)
            if kind == "Object":
                value = source.object_metric(
                    self.namespace, name, body["describedObject"], selector
                )
                usage = milli_value(value)
            elif kind == "External":
                usage = sum(
                    milli_value(v) for v in source.external_metric(self.namespace, name, selector)
                )
            else:
                raise MetricUnavailable(f"metric type {kind} is not emulated")
            if target["type"] == "Value":
                replicas = self._value_replicas(
                    scale.spec_replicas, usage, milli_value(target["value"]), pods
                )
            elif target["type"] == "AverageValue":
                replicas = self._average_value_replicas(
                    scale.status_replicas, usage, milli_value(target["averageValue"])
                )
            else:
                raise MetricUnavailable(f"{kind} metric {name}: target {target['type']}")
            return MetricProposal(name, replicas, usage)
        except MetricUnavailable as error:
            return MetricProposal(name, None, None, str(error))

    # --- the sync (horizontal.go reconcileAutoscaler) ---

    def sync(
        self, scale: Scale, pods: Sequence[PodState], source: MetricsSource, now: float
    ) -> Decision:
        spec = self.spec
        current = scale.spec_replicas
        min_replicas = int(spec.get("minReplicas", 1))
        max_replicas = int(spec["maxReplicas"])
        if current == 0 and min_replicas != 0:
            return Decision(current, 0, "ScalingDisabled")
        if current > max_replicas:
            decision = Decision(current, max_replicas, "TooManyReplicas")
        elif current < min_replicas:
            decision = Decision(current, min_replicas, "TooFewReplicas")
        else:
            proposals = tuple(
                self._metric_replicas(m, scale, pods, source, now) for m in spec["metrics"]
            )
            valid = [p.replicas for p in proposals if p.replicas is not None]
            if not valid:
                return Decision(current, current, "FailedGetMetrics", proposals)
            metric_replicas = max(valid)
            if len(valid) < len(proposals) and metric_replicas < current:
                # Some metric failed and the rest would scale down: hold, as the controller does.
                return Decision(current, current, "InvalidMetricsHoldScaleDown", proposals)
            decision = self._with_behavior(
                current, metric_replicas, min_replicas, max_replicas, now
            )
            decision = Decision(
                current,
                decision.desired_replicas,
                decision.reason,
                proposals,
                metric_replicas,
                decision.stabilized_replicas,
            )
        self._record(current, decision.desired_replicas, now)
        return decision

    def _with_behavior(
        self, current: int, desired: int, min_replicas: int, max_replicas: int, now: float
    ) -> Decision:
        up, down = behavior_with_defaults(self.spec, self.downscale_stabilization_seconds)
        if not self._initialized:
            # maybeInitScaleDownStabilizationWindow: the count at start is the first sample.
            self._initialized = True
            self._recommendations.append(_Recommendation(current, now))
        stabilized = self._stabilize(current, desired, up, down, now)
        if stabilized > current:
            limit = max(
                scale_up_limit(current, self._up_events, self._down_events, up, now), current
            )
            allowed = min(max_replicas, limit)
            if stabilized > allowed:
                reason = "ScaleUpLimit" if allowed == limit else "TooManyReplicas"
                return Decision(current, allowed, reason, stabilized_replicas=stabilized)
        elif stabilized < current:
            limit = min(
                scale_down_limit(current, self._up_events, self._down_events, down, now), current
            )
            allowed = max(min_replicas, limit)
            if stabilized < allowed:
                reason = "ScaleDownLimit" if allowed == limit else "TooFewReplicas"
                return Decision(current, allowed, reason, stabilized_replicas=stabilized)
        return Decision(current, stabilized, "DesiredWithinRange", stabilized_replicas=stabilized)

    def _stabilize(
        self,
        current: int,
        desired: int,
        up: Mapping[str, Any],
        down: Mapping[str, Any],
        now: float,
    ) -> int:
        up_cutoff = now - float(up["stabilizationWindowSeconds"])
        down_cutoff = now - float(down["stabilizationWindowSeconds"])
        up_rec = desired
        down_rec = desired
        old_index: int | None = None
        for index, rec in enumerate(self._recommendations):
            if rec.timestamp > up_cutoff:
                up_rec = min(rec.replicas, up_rec)
            if rec.timestamp > down_cutoff:
                down_rec = max(rec.replicas, down_rec)
            if rec.timestamp < up_cutoff and rec.timestamp < down_cutoff:
                old_index = index
        recommendation = max(current, up_rec)
        recommendation = min(recommendation, down_rec)
        if old_index is not None:
            self._recommendations[old_index] = _Recommendation(desired, now)
        else:
            self._recommendations.append(_Recommendation(desired, now))
        return recommendation

    def _record(self, current: int, desired: int, now: float) -> None:
        if desired == current:
            return
        up, down = behavior_with_defaults(self.spec, self.downscale_stabilization_seconds)
        longest = max(
            [p["periodSeconds"] for p in (up.get("policies") or []) + (down.get("policies") or [])]
            or [0]
        )
        events = self._up_events if desired > current else self._down_events
        events.append(_ScaleEvent(abs(desired - current), now))
        for bucket in (self._up_events, self._down_events):
            bucket[:] = [e for e in bucket if e.timestamp > now - longest]
