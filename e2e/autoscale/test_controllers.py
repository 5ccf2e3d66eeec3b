"""The HPA controller loop on live objects (a recorded kubectl, no cluster): it scales a pool
Deployment with `kubectl scale` and a TTSVoice through `spec.replicas`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxfleet_operator.plan import Voice, plan_pool
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.pool import build_pool_hpa
from voxfleet_operator.render.voice_scaling import build_voice_hpa
from voxfleet_operator.spec import TTSVoiceSpec

from autoscale.cluster_objects import pool_pod
from autoscale.controllers import AutoscalingControllers, parse_selector
from autoscale.hpa import HorizontalPodAutoscaler, PodSample
from autoscale.prometheus import PrometheusServer

POOL = Pool(name="cpu", max_pods=4)
SPEC = TTSVoiceSpec.model_validate(
    {
        "source": {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32},
        "replicas": 1,
        "autoscaling": {"perVoice": True, "targetFirstAudioP95Ms": 500, "maxReplicas": 3},
    }
)
JOE = Voice("joe", "speech", SPEC)


class RecordedKubectl:
    def __init__(self, objects: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        self.objects = objects
        self.pods = pods
        self.commands: list[tuple[str, ...]] = []

    def get(self, *args: str) -> Any:
        return self.objects.get("/".join(args))

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        return self.pods if kind == "pods" else []

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> Any:
        self.commands.append(args)


class Slow:
    """Every pod and voice at 1.2 s first audio."""

    def pod_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> dict[str, PodSample]:
        return {"a": PodSample(1.2)}

    def object_metric(
        self,
        namespace: str,
        metric: str,
        described_object: Mapping[str, str],
        selector: Mapping[str, str] | None,
    ) -> float:
        return 1.2

    def external_metric(
        self, namespace: str, metric: str, selector: Mapping[str, str] | None
    ) -> list[float]:
        return []


def controllers(kubectl: RecordedKubectl) -> AutoscalingControllers:
    loop = AutoscalingControllers(kubectl, "speech", PrometheusServer(), [], sync_period_s=15)
    loop.refresh_targets = lambda: None  # type: ignore[method-assign]
    loop._pods = kubectl.pods
    return loop


def test_pool_deployment_is_scaled_with_kubectl_scale() -> None:
    pod = pool_pod("a", "speech", "cpu", 8002)
    deployment = {
        "spec": {"selector": {"matchLabels": pod["metadata"]["labels"]}},
        "status": {"replicas": 1},
    }
    kubectl = RecordedKubectl({"deployment/voxfleet-triton-cpu": deployment}, [pod])
    loop = controllers(kubectl)
    hpa = build_pool_hpa(plan_pool(POOL, "speech", [JOE]))
    # Without the rendered 15 s window, so that one sync shows the scale.
    hpa["spec"]["behavior"]["scaleUp"]["stabilizationWindowSeconds"] = 0
    loop.sync_one(HorizontalPodAutoscaler(hpa), Slow())
    # ceil(1 x 1.2 / 0.5) = 3 pods, within the policy's 2 more a minute and maxReplicas 3.
    assert kubectl.commands == [("scale", "deployment", "voxfleet-triton-cpu", "--replicas=3")]
    (event,) = loop.events
    assert (event.target, event.from_replicas, event.to_replicas) == (
        "Deployment/voxfleet-triton-cpu",
        1,
        3,
    )


def test_voice_is_scaled_through_its_spec_replicas() -> None:
    pod = pool_pod("a", "speech", "cpu", 8002, labels={"serving.voxfleet.io/joe": "true"})
    voice = {
        "spec": {"replicas": 1},
        "status": {
            "replicas": 1,
            "selector": "app.kubernetes.io/name=voxfleet-triton,serving.voxfleet.io/joe=true",
        },
    }
    kubectl = RecordedKubectl({"ttsv/joe": voice}, [pod])
    loop = controllers(kubectl)
    # The per-voice HPA scales up at once (no window): ceil(1 x 1.2 / 0.5) = 3, 1 pod per 30 s.
    loop.sync_one(HorizontalPodAutoscaler(build_voice_hpa(JOE, POOL)), Slow())
    assert kubectl.commands == [("scale", "ttsv", "joe", "--replicas=2")]


def test_selector_strings_are_read_as_labels() -> None:
    assert parse_selector("a=1,b=x") == {"a": "1", "b": "x"}
    assert parse_selector(None) == {}
