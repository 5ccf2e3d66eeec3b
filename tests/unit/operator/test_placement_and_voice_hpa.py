"""Per-voice scaling: where a scaled voice is placed, its HPA, and the pool HPA's floor."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
from voxfleet_operator.placement import place_voice, scale_status, voice_selector
from voxfleet_operator.pool_plan import Voice, plan_pool
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.render import build_pool_hpa, render_voice
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


def test_scale_status_reports_the_serving_pods_and_their_selector() -> None:
    assert scale_status("joe", "t4", 2) == {
        "replicas": 2,
        "selector": "app.kubernetes.io/name=voxfleet-triton,serving.voxfleet.io/joe=true,"
        "voxfleet.io/pool=t4",
    }
    assert voice_selector("joe", "t4") == scale_status("joe", "t4", 0)["selector"]


def test_per_voice_hpa_scales_the_ttsvoice_on_its_own_p95_and_queue_time() -> None:
    joe = voice(
        replicas=1,
        autoscaling={
            "perVoice": True,
            "minReplicas": 1,
            "maxReplicas": 8,
            "targetFirstAudioP95Ms": 250,
            "targetQueueMs": 40,
        },
    )
    hpa = build_voice_hpa(joe, POOL)
    kubernetes_validate.validate(hpa, "1.30", strict=True)
    target = {"apiVersion": "voxfleet.io/v1alpha1", "kind": "TTSVoice", "name": "joe"}
    assert hpa["spec"]["scaleTargetRef"] == target
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 3)  # pool maxPods 3
    p95, queue = hpa["spec"]["metrics"]
    assert p95 == {
        "type": "Object",
        "object": {
            "metric": {"name": "voxfleet_voice_first_audio_p95_seconds"},
            "describedObject": target,
            "target": {"type": "Value", "value": "250m"},
        },
    }
    assert queue["object"]["metric"] == {"name": "voxfleet_voice_queue_seconds"}
    assert queue["object"]["describedObject"] == target
    assert queue["object"]["target"] == {"type": "Value", "value": "40m"}
    kinds = [o["kind"] for o in render_voice(joe, POOLS, "cache")]
    assert kinds == ["Job", "Service", "Service", "HorizontalPodAutoscaler"]
    assert "HorizontalPodAutoscaler" not in [o["kind"] for o in render_voice(voice(), POOLS, "c")]


def test_pool_keeps_enough_pods_for_its_most_replicated_voice() -> None:
    plan = plan_pool(POOL, "tts", [voice("joe", replicas=2), voice("amy")])
    assert build_pool_hpa(plan)["spec"]["minReplicas"] == 2
    # Never above the pool's own maximum.
    plan = plan_pool(POOL, "tts", [voice("joe", replicas=7, autoscaling={"maxReplicas": 8})])
    assert build_pool_hpa(plan)["spec"]["minReplicas"] == 3
    plan = plan_pool(POOL, "tts", [voice("amy")])
    assert build_pool_hpa(plan)["spec"]["minReplicas"] == 1
