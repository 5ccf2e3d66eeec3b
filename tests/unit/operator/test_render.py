"""Every child the operator renders, checked on what a cluster would do with it."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
from voxfleet_operator.pool_plan import Voice, place_voices, plan_pool
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.render import (
    build_engine_job,
    build_pool_deployment,
    build_pool_hpa,
    build_pool_pdb,
    build_pool_service_monitor,
    build_voice_service,
    render_voices,
)
from voxfleet_operator.render.pool import TRITON_EXIT_TIMEOUT_SECONDS
from voxfleet_operator.spec import TTSVoiceSpec
from voxfleet_operator.voice_plan import voice_engine_key as engine_key

from engines.contract.plan import ServingPlan

T4 = Pool(
    name="t4",
    runtime="tensorrt",
    node_selector={"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    max_pods=6,
)
L4 = Pool(name="l4", gpu_product="NVIDIA-L4", gpus_per_pod=2, max_pods=2)
POOLS = PoolsConfig(default_pool="t4", pools=[T4, L4])
URL_SOURCE = {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32}


def make_voice(name: str = "joe", namespace: str = "tts", **spec: Any) -> Voice:
    spec.setdefault("source", URL_SOURCE)
    return Voice(name, namespace, TTSVoiceSpec.model_validate(spec))


def container(obj: dict[str, Any]) -> dict[str, Any]:
    spec = obj["spec"]["template"]["spec"]
    (only,) = spec["containers"]
    return only  # type: ignore[no-any-return]


def test_engine_job_builds_on_the_pool_gpu_into_the_cache() -> None:
    voice = make_voice(precision="int8")
    key = engine_key(voice.spec, T4)
    job = build_engine_job("joe", "tts", voice.spec, T4, key, "engine-cache")
    assert job["metadata"]["name"] == f"engine-joe-{key[:10]}"
    main = container(job)
    command = main["command"]
    assert command[:4] == ["voxfleet", "build-engines", "--voice", URL_SOURCE["url"]]
    assert command[4] == "--plan"
    assert command[6:] == ["--cache", "/engines", "--publish-as", key]
    plan = ServingPlan.from_json(command[5])
    assert (plan.runtime, plan.precision) == ("tensorrt", "int8")
    assert plan.engine_dir == f"/engines/{key}"
    assert {"name": "VOXFLEET_VOICE_SHA256", "value": "ab" * 32} in main["env"]
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
        "nvidia.com/gpu.product": "Tesla-T4",
    }
    assert pod["tolerations"] == T4.tolerations
    assert pod["restartPolicy"] == "Never" and job["spec"]["backoffLimit"] == 2
    cache = next(v for v in pod["volumes"] if v["name"] == "engines")
    assert cache["persistentVolumeClaim"]["claimName"] == "engine-cache"


def test_engine_job_mounts_a_pvc_voice_read_only() -> None:
    voice = make_voice(source={"pvc": {"claimName": "voices", "path": "en/amy.onnx"}})
    job = build_engine_job("amy", "tts", voice.spec, T4, "k" * 20, "engine-cache")
    main = container(job)
    assert main["command"][3] == "/voice/en/amy.onnx"
    assert {"name": "voice", "mountPath": "/voice", "readOnly": True} in main["volumeMounts"]
    volume = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "voice")
    assert volume["persistentVolumeClaim"] == {"claimName": "voices", "readOnly": True}


def test_engine_key_changes_only_with_what_changes_the_engines() -> None:
    base = make_voice().spec
    same = make_voice(speakingRate=1.3, autoscaling={"maxReplicas": 9}).spec
    assert engine_key(base, T4) == engine_key(same, T4)
    assert engine_key(base, T4) != engine_key(make_voice(precision="fp32").spec, T4)
    assert engine_key(base, T4) != engine_key(base, L4)  # another GPU product
    assert engine_key(base, T4) != engine_key(make_voice(batching={"maxBatchSize": 4}).spec, T4)


CPU = Pool(name="cpu", runtime="onnxruntime", max_pods=4)
CPU_POOLS = PoolsConfig(default_pool="cpu", pools=[CPU])


def test_a_cpu_pool_renders_onnxruntime_builds_and_pods_without_gpus() -> None:
    (job,) = [o for o in render_voices([make_voice()], CPU_POOLS, "cache") if o["kind"] == "Job"]
    plan = ServingPlan.from_json(container(job)["command"][5])
    # The spec's default fp16 is a GPU precision: the CPU pool builds onnxruntime's fp32.
    assert (plan.runtime, plan.precision) == ("onnxruntime", "fp32")
    deployment = build_pool_deployment(CPU, "tts", "cache")
    for pod in (deployment, job):
        spec = pod["spec"]["template"]["spec"]
        assert "nvidia.com/gpu.product" not in spec["nodeSelector"]
        resources = container(pod)["resources"]
        assert "nvidia.com/gpu" not in {**resources["requests"], **resources["limits"]}
    assert container(deployment)["resources"]["requests"]["cpu"] == "1"
    assert container(deployment)["command"] == ["voxfleet", "triton"]


def test_window_edits_reach_the_build_and_rebuild_only_shaped_engines() -> None:
    def job_command(pool: Pool, frames: int) -> list[str]:
        voice = make_voice(streaming={"steadyWindowFrames": frames})
        pools = PoolsConfig(default_pool=pool.name, pools=[pool])
        (job,) = [o for o in render_voices([voice], pools, "cache") if o["kind"] == "Job"]
        return list(container(job)["command"])

    for pool in (T4, CPU):
        narrow, wide = job_command(pool, 32), job_command(pool, 64)
        assert ServingPlan.from_json(narrow[5]).windows.window_frames == 32
        assert ServingPlan.from_json(wide[5]).windows.window_frames == 64
    # TensorRT's profiles follow the windows, so its key does too; onnxruntime's do not.
    assert job_command(T4, 32)[-1] != job_command(T4, 64)[-1]
    assert job_command(CPU, 32)[-1] == job_command(CPU, 64)[-1]


@pytest.mark.parametrize(
    ("section", "field", "values", "planned"),
    [
        ("streaming", "maxLeadMs", (300, 0), "max_lead_ms"),
        ("batching", "encoderLaunch", ("beside", "inline"), "encoder_launch"),
    ],
)
def test_step_settings_reach_the_stream_model_and_rebuild_nothing(
    section: str, field: str, values: tuple[Any, Any], planned: str
) -> None:
    """A lead limit and how the encoder is launched change how steps are run, not what is
    built: the plan carries them, the engine key stays."""

    def plan_and_key(value: Any) -> tuple[ServingPlan, str]:
        voice = make_voice(**{section: {field: value}})
        pools = PoolsConfig(default_pool=T4.name, pools=[T4])
        (job,) = [o for o in render_voices([voice], pools, "cache") if o["kind"] == "Job"]
        command = container(job)["command"]
        return ServingPlan.from_json(command[5]), command[-1]

    (first, first_key), (second, second_key) = (plan_and_key(v) for v in values)
    assert (getattr(first.windows, planned), getattr(second.windows, planned)) == values
    assert first_key == second_key


def test_a_faster_encoder_reaches_only_pools_that_run_it_and_rebuilds_nothing() -> None:
    """`encoderPrecision: fp16` reaches a torch-cuda pool's stream model; a pool whose
    runtime runs the encoder only at fp32 still serves the voice, at fp32 (as `precision`
    falls back); the engines are the same either way."""

    def planned(pool: Pool, precision: str) -> tuple[str, str]:
        voice = make_voice(encoderPrecision=precision)
        pools = PoolsConfig(default_pool=pool.name, pools=[pool])
        (job,) = [o for o in render_voices([voice], pools, "cache") if o["kind"] == "Job"]
        command = container(job)["command"]
        return ServingPlan.from_json(command[5]).windows.encoder_precision, command[-1]

    assert L4.runtime == "torch-cuda"
    fast, fast_key = planned(L4, "fp16")
    own, own_key = planned(L4, "fp32")
    assert (fast, own) == ("fp16", "fp32") and fast_key == own_key
    assert planned(CPU, "fp16")[0] == "fp32"
    assert planned(T4, "bf16")[0] == "fp32"  # tensorrt


def test_a_pool_with_mps_tells_its_pods_supervisor_to_run_a_daemon() -> None:
    def mps_env(pool: Pool) -> list[dict[str, str]]:
        env = container(build_pool_deployment(pool, "tts", "engine-cache"))["env"]
        return [e for e in env if e["name"] == "VOXFLEET_MPS"]

    assert mps_env(T4) == []
    assert mps_env(T4.model_copy(update={"mps": True})) == [{"name": "VOXFLEET_MPS", "value": "1"}]


def test_triton_deployment_serves_safely_and_drains() -> None:
    deployment = build_pool_deployment(T4, "tts", "engine-cache")
    main = container(deployment)
    args = main["args"]
    assert "--model-control-mode=explicit" in args
    assert (
        "--grpc-restricted-protocol=model-repository:voxfleet-key=$(VOXFLEET_REPOSITORY_KEY)"
        in args
    )
    assert "--http-restricted-api=model-repository:voxfleet-key=$(VOXFLEET_REPOSITORY_KEY)" in args
    # onnxruntime runs as many threads as the pod requests CPUs, not one per node core; the
    # voice host places voices in the pool's GPU memory
    assert args[:2] == ["--voice-host-memory-mib=15360", "--voice-host-cpu-threads=2"]
    key_env = next(e for e in main["env"] if e["name"] == "VOXFLEET_REPOSITORY_KEY")
    assert key_env["valueFrom"]["secretKeyRef"] == {
        "name": "voxfleet-repository-key",
        "key": "repository-key",
    }
    assert {p["name"]: p["containerPort"] for p in main["ports"]} == {
        "grpc": 8001,
        "http": 8000,
        "metrics": 8002,
        "health": 8003,
    }
    # the supervisor inside `voxfleet triton` answers the probes (tests/integration/data_plane)
    health = {"port": "health", "scheme": "HTTP"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/live", **health}
    assert main["readinessProbe"]["httpGet"] == {"path": "/ready", **health}
    assert main["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert main["resources"]["limits"]["nvidia.com/gpu"] == "1"
    mounts = {m["name"]: m for m in main["volumeMounts"]}
    assert mounts["engines"]["readOnly"] is True
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["terminationGracePeriodSeconds"] > TRITON_EXIT_TIMEOUT_SECONDS + 5
    assert main["lifecycle"]["preStop"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert "replicas" not in deployment["spec"]  # the HPA owns the count
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0


def test_deployment_does_not_change_when_voices_change() -> None:
    # Adding a voice must load a model, not roll every GPU pod of the pool.
    first = render_voices([make_voice("a")], POOLS, "c")
    second = render_voices([make_voice("a"), make_voice("b")], POOLS, "c")

    def deployment(objects: list[dict[str, Any]]) -> dict[str, Any]:
        return next(o for o in objects if o["kind"] == "Deployment")

    assert deployment(first) == deployment(second)


def test_voice_service_selects_only_pods_serving_the_voice() -> None:
    service = build_voice_service("joe", "tts", T4)
    assert service["metadata"]["name"] == "joe-tts"
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "voxfleet-triton",
        "voxfleet.io/pool": "t4",
        "serving.voxfleet.io/joe": "true",
    }
    assert service["spec"]["ports"] == [
        {
            "name": "grpc",
            "port": 8001,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "grpc",
        }
    ]


def test_hpa_follows_the_strictest_voice_within_the_pool_limit() -> None:
    voices = [
        make_voice(
            "a",
            autoscaling={
                "minReplicas": 2,
                "maxReplicas": 3,
                "targetFirstAudioP95Ms": 400,
                "targetLoadPercent": 80,
            },
        ),
        make_voice(
            "b",
            autoscaling={
                "minReplicas": 1,
                "maxReplicas": 10,
                "targetFirstAudioP95Ms": 250,
                "targetLoadPercent": 65,
            },
        ),
    ]
    hpa = build_pool_hpa(plan_pool(T4, "tts", voices))
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == "voxfleet-triton-t4"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)  # maxPods 6
    metrics = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    assert metrics == {
        "voxfleet_first_audio_p95_seconds": {"type": "AverageValue", "averageValue": "250m"},
        "voxfleet_load_ratio": {"type": "AverageValue", "averageValue": "650m"},
    }


def test_minimum_is_capped_by_the_pool_too() -> None:
    voice = make_voice(pool="l4", autoscaling={"minReplicas": 5, "maxReplicas": 8})
    plan = plan_pool(L4, "tts", [voice])
    assert (plan.min_replicas, plan.max_replicas) == (2, 2)


def test_pdb_and_service_monitor_select_the_pool() -> None:
    pdb = build_pool_pdb(T4, "tts")
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {
            "matchLabels": {"app.kubernetes.io/name": "voxfleet-triton", "voxfleet.io/pool": "t4"}
        },
    }
    monitor = build_pool_service_monitor(T4, "tts")
    # Triton's metrics (the voices'), and the pod's memory gauges on its health port.
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics", "health"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["tts"]}


def test_render_groups_voices_by_namespace_and_pool() -> None:
    voices = [make_voice("a"), make_voice("b", pool="l4"), make_voice("c", namespace="other")]
    plans = place_voices(voices, POOLS)
    assert [(p.namespace, p.pool.name, [v.name for v in p.voices]) for p in plans] == [
        ("other", "t4", ["c"]),
        ("tts", "l4", ["b"]),
        ("tts", "t4", ["a"]),
    ]
    objects = render_voices(voices, POOLS, "c", repository_key="k")
    kinds = [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in objects]
    assert ("Secret", "other", "voxfleet-repository-key") in kinds
    assert ("Deployment", "tts", "voxfleet-triton-l4") in kinds
    assert len([k for k in kinds if k[0] == "Job"]) == 3


@pytest.mark.parametrize("version", ["1.30", "1.33"])
def test_rendered_core_objects_are_valid_kubernetes(version: str) -> None:
    voices = [
        make_voice("a"),
        make_voice("b", source={"pvc": {"claimName": "v", "path": "b.onnx"}}),
    ]
    for obj in render_voices(voices, POOLS, "c", service_monitor=False, repository_key="k"):
        kubernetes_validate.validate(obj, version, strict=True)


@pytest.mark.parametrize("service_monitor", [True, False])
def test_pool_deletion_names_every_object_render_makes(service_monitor: bool) -> None:
    from voxfleet_operator.kube import resource_of
    from voxfleet_operator.render import render_pool
    from voxfleet_operator.shared import pool_object_names

    rendered = render_pool(plan_pool(T4, "tts", [make_voice()]), "c", service_monitor)
    assert sorted((resource_of(o).plural, o["metadata"]["name"]) for o in rendered) == sorted(
        (resource.plural, name) for resource, name in pool_object_names("t4", service_monitor)
    )
