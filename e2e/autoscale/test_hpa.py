"""The HPA algorithm against the examples of the Kubernetes documentation
(concepts/workloads/autoscaling/horizontal-pod-autoscale)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from autoscale.hpa import (
    HorizontalPodAutoscaler,
    MetricUnavailable,
    PodSample,
    PodState,
    Scale,
    milli_value,
    pod_state,
)

NOW = 10_000.0
LONG_AGO = 0.0


class Metrics:
    """A metrics API answering fixed values."""

    def __init__(
        self,
        pods: Mapping[str, Mapping[str, float]] | None = None,
        objects: Mapping[str, float] | None = None,
        external: Mapping[str, list[float]] | None = None,
    ) -> None:
        self.pods = dict(pods or {})
        self.objects = dict(objects or {})
        self.external = dict(external or {})

    def pod_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> dict[str, PodSample]:
        if metric not in self.pods:
            raise MetricUnavailable(f"no {metric}")
        return {p: PodSample(v, timestamp=NOW) for p, v in self.pods[metric].items()}

    def object_metric(
        self,
        namespace: str,
        metric: str,
        described_object: Mapping[str, str],
        selector: Mapping[str, str] | None,
    ) -> float:
        return self.objects[metric]

    def external_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> list[float]:
        return self.external[metric]


def pods_metric(name: str, average: str) -> dict[str, Any]:
    return {
        "type": "Pods",
        "pods": {
            "metric": {"name": name},
            "target": {"type": "AverageValue", "averageValue": average},
        },
    }


def hpa(
    *metrics: dict[str, Any],
    min_replicas: int = 1,
    max_replicas: int = 100,
    behavior: dict[str, Any] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "metrics": list(metrics) or [pods_metric("latency", "100m")],
    }
    if behavior is not None:
        spec["behavior"] = behavior
    return {"metadata": {"name": "pool", "namespace": "speech"}, "spec": spec}


# Scale-down without a window, so one sync shows the formula's own answer.
IMMEDIATE = {"scaleDown": {"stabilizationWindowSeconds": 0}}


def running(*names: str) -> list[PodState]:
    return [PodState(n, start_time=LONG_AGO, ready_transition_time=LONG_AGO + 10) for n in names]


def one_sync(controller: HorizontalPodAutoscaler, replicas: int, values: dict[str, float]) -> int:
    pods = running(*values)
    decision = controller.sync(Scale(replicas, replicas), pods, Metrics({"latency": values}), NOW)
    return decision.desired_replicas


def test_ratio_doubles_or_halves_the_replicas() -> None:
    # "if the current metric value is 200m, and the desired value is 100m, the number of
    # replicas will be doubled ... If the current value is instead 50m, you'll halve".
    assert one_sync(HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE)), 2, {"a": 0.2, "b": 0.2}) == 4
    assert (
        one_sync(HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE)), 4, dict.fromkeys("abcd", 0.05))
        == 2
    )


def test_ratio_within_the_tolerance_leaves_the_count() -> None:
    controller = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE))
    assert one_sync(controller, 4, dict.fromkeys("abcd", 0.108)) == 4
    assert one_sync(controller, 4, dict.fromkeys("abcd", 0.092)) == 4
    assert one_sync(controller, 4, dict.fromkeys("abcd", 0.115)) == 5
    loose = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE), tolerance=0.2)
    assert one_sync(loose, 4, dict.fromkeys("abcd", 0.115)) == 4


def test_largest_proposal_over_several_metrics_wins() -> None:
    controller = HorizontalPodAutoscaler(
        hpa(pods_metric("latency", "100m"), pods_metric("queue", "50m"), behavior=IMMEDIATE)
    )
    pods = running("a", "b")
    metrics = Metrics({"latency": {"a": 0.1, "b": 0.1}, "queue": {"a": 0.15, "b": 0.15}})
    decision = controller.sync(Scale(2, 2), pods, metrics, NOW)
    assert [p.replicas for p in decision.proposals] == [2, 6]
    assert decision.desired_replicas == 6


def test_missing_metric_blocks_a_scale_down_but_not_a_scale_up() -> None:
    controller = HorizontalPodAutoscaler(
        hpa(pods_metric("latency", "100m"), pods_metric("queue", "50m"), behavior=IMMEDIATE)
    )
    pods = running("a", "b", "c", "d")
    low = Metrics({"latency": dict.fromkeys("abcd", 0.01)})  # no `queue` at all
    assert controller.sync(Scale(4, 4), pods, low, NOW).desired_replicas == 4
    high = Metrics({"latency": dict.fromkeys("abcd", 0.3)})
    decision = controller.sync(Scale(4, 4), pods, high, NOW)
    # 12 asked for; the default scale-up policy allows doubling per 15 s.
    assert (decision.metric_replicas, decision.desired_replicas) == (12, 8)


def test_pods_without_a_sample_count_at_the_target_on_a_scale_down() -> None:
    controller = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE))
    pods = running("a", "b", "c")
    # Without the missing pod: mean 50m, ceil(0.5 x 2) = 1. With it at 100m: 66m -> 2.
    metrics = Metrics({"latency": {"a": 0.05, "b": 0.05}})
    assert controller.sync(Scale(3, 3), pods, metrics, NOW).desired_replicas == 2


def test_pods_without_a_sample_count_as_zero_and_a_reversed_scale_up_is_dropped() -> None:
    controller = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE))
    pods = running("a", "b", "c")
    # One pod at 200m would ask for 2 pods; with two missing at 0 the mean is 66m, a
    # scale-down: the direction reverses, so nothing changes.
    metrics = Metrics({"latency": {"a": 0.2}})
    assert controller.sync(Scale(3, 3), pods, metrics, NOW).desired_replicas == 3


def test_a_pod_that_is_not_yet_ready_is_set_aside() -> None:
    started = NOW - 5
    pods = [
        *running("a"),
        PodState("new", ready=False, start_time=started, ready_transition_time=started),
    ]
    metrics = Metrics({"latency": {"a": 0.1, "new": 0.5}})
    # The starting pod's high value is set aside: `a` alone is on target.
    controller = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE))
    assert controller.sync(Scale(2, 2), pods, metrics, NOW).desired_replicas == 2
    # As kube-controller-manager's code treats custom metrics: only pending pods are aside.
    code = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE), readiness_for_custom_metrics=False)
    assert code.sync(Scale(2, 2), pods, metrics, NOW).desired_replicas == 6


def test_unready_pods_count_as_zero_on_a_scale_up() -> None:
    controller = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE))
    pods = [*running("a"), PodState("p1", phase="Pending"), PodState("p2", phase="Pending")]
    # `a` at 250m asks for ceil(2.5 x 1) = 3, but with the pending pods at 0 the mean is
    # 83m: the direction reverses, so the count stays.
    metrics = Metrics({"latency": {"a": 0.25}})
    assert controller.sync(Scale(3, 3), pods, metrics, NOW).desired_replicas == 3
    # On a scale-down unready pods are simply ignored.
    metrics = Metrics({"latency": {"a": 0.02}})
    assert controller.sync(Scale(3, 3), pods, metrics, NOW).desired_replicas == 1


def test_deleted_and_failed_pods_are_ignored() -> None:
    controller = HorizontalPodAutoscaler(hpa(behavior=IMMEDIATE))
    pods = [
        *running("a", "b"),
        PodState("gone", deleting=True),
        PodState("dead", phase="Failed"),
    ]
    metrics = Metrics({"latency": {"a": 0.2, "b": 0.2}})
    assert controller.sync(Scale(4, 4), pods, metrics, NOW).desired_replicas == 4


def test_min_and_max_replicas_clamp() -> None:
    controller = HorizontalPodAutoscaler(hpa(min_replicas=2, max_replicas=3, behavior=IMMEDIATE))
    assert one_sync(controller, 2, {"a": 1.0, "b": 1.0}) == 3
    assert one_sync(controller, 3, dict.fromkeys("abc", 0.001)) == 2
    # Outside the bounds, the count is brought back without reading metrics.
    decision = controller.sync(Scale(7, 7), [], Metrics(), NOW)
    assert (decision.desired_replicas, decision.reason) == (3, "TooManyReplicas")
    assert controller.sync(Scale(0, 0), [], Metrics(), NOW).reason == "ScalingDisabled"


def test_scale_down_stabilization_takes_the_highest_recommendation_of_the_window() -> None:
    # "stabilizationWindowSeconds: 300": the highest desired state of the last 5 minutes.
    controller = HorizontalPodAutoscaler(
        hpa(behavior={"scaleDown": {"stabilizationWindowSeconds": 300}})
    )
    pods = running("a", "b", "c", "d")
    busy = Metrics({"latency": dict.fromkeys("abcd", 0.1)})
    idle = Metrics({"latency": dict.fromkeys("abcd", 0.01)})
    assert controller.sync(Scale(4, 4), pods, busy, 0.0).desired_replicas == 4
    for t in range(15, 300, 15):
        assert controller.sync(Scale(4, 4), pods, idle, float(t)).desired_replicas == 4
    assert controller.sync(Scale(4, 4), pods, idle, 301.0).desired_replicas == 1


def test_scale_up_stabilization_takes_the_lowest_recommendation_of_the_window() -> None:
    controller = HorizontalPodAutoscaler(
        hpa(behavior={"scaleUp": {"stabilizationWindowSeconds": 60}, **IMMEDIATE})
    )
    pods = running("a", "b")
    calm = Metrics({"latency": {"a": 0.1, "b": 0.1}})
    burst = Metrics({"latency": {"a": 0.3, "b": 0.3}})
    assert controller.sync(Scale(2, 2), pods, calm, 0.0).desired_replicas == 2
    assert controller.sync(Scale(2, 2), pods, burst, 30.0).desired_replicas == 2
    assert controller.sync(Scale(2, 2), pods, burst, 61.0).desired_replicas == 6


def test_policies_limit_the_rate_of_a_scale_down() -> None:
    # The documentation's example: Pods 4 and Percent 10 per 60 s; from 80 replicas "8
    # replicas will be reduced. In the next iteration when the number of replicas is 72, 10%
    # of the pods is 7.2 but the number is rounded up to 8. ... When the number of replicas
    # falls below 40 the first policy (Pods) is applied and 4 replicas will be reduced".
    behavior = {
        "scaleDown": {
            "stabilizationWindowSeconds": 0,
            "policies": [
                {"type": "Pods", "value": 4, "periodSeconds": 60},
                {"type": "Percent", "value": 10, "periodSeconds": 60},
            ],
        }
    }
    controller = HorizontalPodAutoscaler(hpa(min_replicas=10, behavior=behavior))
    replicas, seen = 80, [80]
    now = 0.0
    while replicas > 10:
        names = [f"p{i}" for i in range(replicas)]
        # Idle: the metric alone would go straight to minReplicas.
        metrics = Metrics({"latency": dict.fromkeys(names, 0.001)})
        decision = controller.sync(Scale(replicas, replicas), running(*names), metrics, now)
        assert decision.metric_replicas == 1
        replicas = decision.desired_replicas
        seen.append(replicas)
        # Within the same period nothing more may go.
        again = controller.sync(
            Scale(replicas, replicas),
            running(*names[:replicas]),
            Metrics({"latency": dict.fromkeys(names[:replicas], 0.001)}),
            now + 30,
        )
        assert again.desired_replicas == replicas
        now += 61
    # 10 % first (8, 8, 7, 6, 6, 5), then 4 pods a minute below 40, then minReplicas.
    assert seen == [80, 72, 64, 57, 51, 45, 40, 36, 32, 28, 24, 20, 16, 12, 10]


def test_default_scale_up_adds_four_pods_or_doubles_every_15_seconds() -> None:
    controller = HorizontalPodAutoscaler(hpa(max_replicas=50))
    replicas, now, seen = 1, 0.0, []
    for _ in range(4):
        names = [f"p{i}" for i in range(replicas)]
        metrics = Metrics({"latency": dict.fromkeys(names, 5.0)})
        replicas = controller.sync(
            Scale(replicas, replicas), running(*names), metrics, now
        ).desired_replicas
        seen.append(replicas)
        now += 16
    assert seen == [5, 10, 20, 40]


def test_select_policy_min_and_disabled() -> None:
    up = {
        "scaleUp": {
            "selectPolicy": "Min",
            "policies": [
                {"type": "Pods", "value": 1, "periodSeconds": 60},
                {"type": "Percent", "value": 900, "periodSeconds": 60},
            ],
        }
    }
    assert one_sync(HorizontalPodAutoscaler(hpa(behavior=up)), 2, {"a": 1.0, "b": 1.0}) == 3
    up["scaleUp"]["selectPolicy"] = "Max"
    assert one_sync(HorizontalPodAutoscaler(hpa(behavior=up)), 2, {"a": 1.0, "b": 1.0}) == 20
    disabled = {"scaleDown": {"selectPolicy": "Disabled", "stabilizationWindowSeconds": 0}}
    assert (
        one_sync(HorizontalPodAutoscaler(hpa(behavior=disabled)), 4, dict.fromkeys("abcd", 0.0))
        == 4
    )


def test_object_and_external_metrics() -> None:
    object_metric = {
        "type": "Object",
        "object": {
            "metric": {"name": "requests"},
            "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "joe-tts"},
            "target": {"type": "Value", "value": "10"},
        },
    }
    external = {
        "type": "External",
        "external": {
            "metric": {"name": "queue_depth"},
            "target": {"type": "AverageValue", "averageValue": "5"},
        },
    }
    controller = HorizontalPodAutoscaler(hpa(object_metric, external, behavior=IMMEDIATE))
    metrics = Metrics(objects={"requests": 20.0}, external={"queue_depth": [12.0, 10.0]})
    decision = controller.sync(Scale(2, 2), running("a", "b"), metrics, NOW)
    # Object Value: ceil(2.0 x 2 ready) = 4; External AverageValue: ceil(22 / 5) = 5.
    assert [p.replicas for p in decision.proposals] == [4, 5]
    assert decision.desired_replicas == 5


@pytest.mark.parametrize(
    ("quantity", "milli"),
    [
        ("300m", 300),
        ("0.3", 300),
        ("1", 1000),
        ("1.5k", 1_500_000),
        ("1Ki", 1_024_000),
        ("2500u", 3),
        (0.2873, 288),
    ],
)
def test_quantities_in_milli_units_rounded_up(quantity: str | float, milli: int) -> None:
    assert milli_value(quantity) == milli


def test_pod_state_reads_a_pod_object() -> None:
    pod = {
        "metadata": {"name": "triton-0", "deletionTimestamp": None},
        "status": {
            "phase": "Running",
            "startTime": "2026-11-23T03:00:00Z",
            "conditions": [
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-23T03:00:20Z"}
            ],
        },
    }
    state = pod_state(pod)
    assert (state.name, state.phase, state.ready, state.deleting) == (
        "triton-0",
        "Running",
        True,
        False,
    )
    assert state.ready_transition_time is not None and state.start_time is not None
    assert state.ready_transition_time - state.start_time == 20
