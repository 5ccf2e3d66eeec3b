"""Per-voice scaling: where a scaled voice is placed, its HPA, and the pool HPA's floor."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from voxfleet_operator.placement import place_voice, scale_status, voice_selector
from voxfleet_operator.pool_plan import Voice, plan_pool
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.render import build_pool_deployment, build_pool_hpa, render_voice
from voxfleet_operator.render.voice_scaling import build_voice_hpa
from voxfleet_operator.spec import TTSVoiceSpec

POOL = Pool(name="t4", max_pods=3)
POOLS = PoolsConfig(default_pool="t4", pools=[POOL])
SOURCE = {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32}


def voice(name: str = "joe", **spec: Any) -> Voice:
    return Voice(name, "tts", TTSVoiceSpec.model_validate({"source": SOURCE, **spec}))


def pod(name: str, *voices: str) -> dict[str, Any]:
    labels = {"voxfleet.io/pool": "t4", **{f"serving.voxfleet.io/{v}": "true" for v in voices}}
    return {"metadata": {"name": name, "labels": labels}}


def test_without_replicas_a_voice_goes_on_every_ready_pod() -> None:
    placement = place_voice("joe", [pod("b"), pod("a", "amy")], None)
    assert (placement.serve, placement.release) == (("a", "b"), ())


def test_scaling_up_adds_the_least_loaded_pods() -> None:
    pods = [pod("a", "joe", "amy"), pod("b", "amy", "kim"), pod("c", "kim"), pod("d")]
    # joe stays on `a`; `d` serves nothing, `c` one voice, `b` two.
    assert place_voice("joe", pods, 2).serve == ("a", "d")
    assert place_voice("joe", pods, 3).serve == ("a", "d", "c")
    assert place_voice("joe", pods, 10).serve == ("a", "d", "c", "b")


def test_scaling_down_leaves_the_busiest_pods_and_keeps_the_rest() -> None:
    pods = [pod("a", "joe", "amy", "kim"), pod("b", "joe"), pod("c", "joe", "amy")]
    placement = place_voice("joe", pods, 1)
    assert placement.serve == ("b",)
    assert sorted(placement.release) == ["a", "c"]
    assert place_voice("joe", pods, 3).release == ()


def test_a_measured_load_overrides_the_voice_count() -> None:
    pods = [pod("a", "amy"), pod("b")]
    assert place_voice("joe", pods, 1, load={"a": 0.0, "b": 12.0}).serve == ("a",)


def test_scale_status_reports_the_serving_pods_and_a_selector_of_no_pod() -> None:
    assert scale_status("joe", "t4", 2) == {
        "replicas": 2,
        "selector": "voxfleet.io/scaled-voice=joe",
        "podSelector": "app.kubernetes.io/name=voxfleet-triton,serving.voxfleet.io/joe=true,"
        "voxfleet.io/pool=t4",
    }
    assert voice_selector("joe", "t4") == scale_status("joe", "t4", 0)["podSelector"]


def _selects(selector: str, labels: dict[str, str]) -> bool:
    wanted = dict(part.split("=", 1) for part in selector.split(","))
    return all(labels.get(k) == v for k, v in wanted.items())


def test_no_pool_pod_is_selected_by_two_hpas() -> None:
    """Kubernetes' HPA controller refuses every HPA whose pods another HPA selects too
    (AmbiguousSelector). The pool HPA selects its Deployment's pods; a voice's HPA selects what
    the TTSVoice's scale subresource says: so that selector must select no pod, whatever
    voices a pod serves."""
    pool_pod = build_pool_deployment(POOL, "tts", "cache")["spec"]["template"]["metadata"]
    labels = {**pool_pod["labels"], "serving.voxfleet.io/joe": "true"}
    labels["serving.voxfleet.io/amy"] = "true"
    deployment_selector = ",".join(f"{k}={v}" for k, v in pool_pod["labels"].items())
    assert _selects(deployment_selector, labels)
    for name in ("joe", "amy"):
        assert not _selects(scale_status(name, "t4", 1)["selector"], labels)
        assert _selects(scale_status(name, "t4", 1)["podSelector"], labels)


def test_per_voice_hpa_scales_the_ttsvoice_on_its_streams_in_pods() -> None:
    joe = voice(
        replicas=1,
        autoscaling={
            "perVoice": True,
            "minReplicas": 1,
            "maxReplicas": 8,
            "targetFirstAudioP95Ms": 250,
            "targetLoadPercent": 60,
        },
    )
    hpa = build_voice_hpa(joe, POOL)
    kubernetes_validate.validate(hpa, "1.30", strict=True)
    target = {"apiVersion": "voxfleet.io/v1alpha1", "kind": "TTSVoice", "name": "joe"}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)  # pool maxPods 3
    # AverageValue: ceil(streams in pods / 0.6) pods, computed with no pod list (the scale
    # selector selects none).
    assert hpa["spec"]["metrics"] == [
        {
            "type": "Object",
            "object": {
                "metric": {"name": "voxfleet_voice_load_pods"},
                "describedObject": target,
                "target": {"type": "AverageValue", "averageValue": "600m"},
            },
        }
    ]
    kinds = [o["kind"] for o in render_voice(joe, POOLS, "cache")]
    assert kinds == ["Job", "Service", "Service", "HorizontalPodAutoscaler"]
    assert "HorizontalPodAutoscaler" not in [o["kind"] for o in render_voice(voice(), POOLS, "c")]


def test_pool_hpa_scales_on_the_pods_load_and_first_audio() -> None:
    plan = plan_pool(
        POOL,
        "tts",
        [
            voice("joe", autoscaling={"targetLoadPercent": 80, "targetFirstAudioP95Ms": 900}),
            voice("amy", autoscaling={"targetLoadPercent": 60, "targetFirstAudioP95Ms": 700}),
        ],
    )
    hpa = build_pool_hpa(plan)
    kubernetes_validate.validate(hpa, "1.30", strict=True)
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    # The strictest of its voices' targets.
    assert metrics == {
        "voxfleet_load_ratio": {"type": "AverageValue", "averageValue": "600m"},
        "voxfleet_first_audio_p95_seconds": {"type": "AverageValue", "averageValue": "700m"},
    }
    behavior = hpa["spec"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 300


def test_pool_keeps_enough_pods_for_its_most_replicated_voice() -> None:
    plan = plan_pool(POOL, "tts", [voice("joe", replicas=2), voice("amy")])
    assert build_pool_hpa(plan)["spec"]["minReplicas"] == 2
    # Never above the pool's own maximum.
    plan = plan_pool(POOL, "tts", [voice("joe", replicas=7, autoscaling={"maxReplicas": 8})])
    assert build_pool_hpa(plan)["spec"]["minReplicas"] == 3
    plan = plan_pool(POOL, "tts", [voice("amy")])
    assert build_pool_hpa(plan)["spec"]["minReplicas"] == 1
