"""The operator end to end: TTSVoices in, children and status out, against a Kubernetes API.

Runs against a real kube-apiserver (operator_harness.py); the same tests run on kind with
VOXFLEET_E2E_KUBECONFIG (request counting and injected faults need the fault proxy).
"""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path
from typing import Any

import pytest
from operator_harness import NAMESPACE, REAL_CLUSTER, Api, eventually

pytestmark = pytest.mark.kube

VOICES = ("voxfleet.io/v1alpha1", "ttsvoices")
CHILDREN = {
    ("v1", "secrets"): "voxfleet-repository-key",
    ("apps/v1", "deployments"): "voxfleet-triton-t4",
    ("v1", "services"): "voxfleet-triton-t4-metrics",
    ("autoscaling/v2", "horizontalpodautoscalers"): "voxfleet-triton-t4",
    ("policy/v1", "poddisruptionbudgets"): "voxfleet-triton-t4",
}


def voice(name: str, **spec: Any) -> dict[str, Any]:
    source = {"url": f"https://voices.example.com/{name}.onnx", "sha256": "ab" * 32}
    return {
        "apiVersion": "voxfleet.io/v1alpha1",
        "kind": "TTSVoice",
        "metadata": {"name": name},
        "spec": {"source": source, **spec},
    }


async def status_of(api: Api, name: str) -> dict[str, Any]:
    obj = await api.get(*VOICES, name)
    return (obj or {}).get("status") or {}


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


async def jobs_of(api: Api, name: str) -> list[dict[str, Any]]:
    return [
        j
        for j in await api.list("batch/v1", "jobs")
        if j["metadata"]["labels"].get("voxfleet.io/voice") == name
    ]


async def finish_job(api: Api, job: dict[str, Any], succeeded: bool, message: str = "") -> None:
    """Play the Job controller (the tests' control plane runs none): mark the Job done, with
    the fields the API server requires of a finished Job's status."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if succeeded:
        status: dict[str, Any] = {
            "startTime": now,
            "completionTime": now,
            "succeeded": 1,
            "conditions": [
                {
                    "type": "SuccessCriteriaMet",
                    "status": "True",
                    "reason": "CompletionsReached",
                    "message": "Reached expected number of succeeded pods",
                },
                {
                    "type": "Complete",
                    "status": "True",
                    "reason": "CompletionsReached",
                    "message": message or "Reached expected number of succeeded pods",
                },
            ],
        }
    else:
        status = {
            "startTime": now,
            "failed": 1,
            "conditions": [
                {
                    "type": "FailureTarget",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": message,
                },
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": message,
                },
            ],
        }
    await api.patch("batch/v1", "jobs", job["metadata"]["name"], {"status": status}, "status")


async def test_apply_creates_every_child_and_reports_status(api: Api, operator: None) -> None:
    started = time.monotonic()
    created = await api.create(*VOICES, voice("joe"))

    async def all_children() -> bool:
        for (group, plural), name in CHILDREN.items():
            if await api.get(group, plural, name) is None:
                return False
        return bool(await api.get("v1", "services", "joe-tts")) and bool(await jobs_of(api, "joe"))

    await eventually(all_children, timeout=10)
    elapsed = time.monotonic() - started
    print(f"apply -> all children: {elapsed:.2f} s")
    # A bound, not a benchmark: a real API server on a shared machine takes about 2 s.
    assert elapsed < 5.0, f"children took {elapsed:.2f} s"

    uid = created["metadata"]["uid"]
    service = await api.get("v1", "services", "joe-tts")
    assert service is not None
    assert service["spec"]["selector"]["serving.voxfleet.io/joe"] == "true"
    assert [r["uid"] for r in service["metadata"]["ownerReferences"]] == [uid]
    deployment = await api.get("apps/v1", "deployments", "voxfleet-triton-t4")
    assert deployment is not None
    assert deployment["metadata"]["ownerReferences"][0]["uid"] == uid
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    (job,) = await jobs_of(api, "joe")
    assert job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "Tesla-T4"
    # No ServiceMonitor: the monitoring.coreos.com API is not served here.
    assert not [w for w in (api.writes() if api.faults else []) if "servicemonitors" in w]

    status = await eventually(lambda: status_of(api, "joe"))
    assert status["phase"] == "Building"
    assert status["observedGeneration"] == 1
    assert status["endpoint"] == f"joe-tts.{NAMESPACE}.svc:8001"
    assert condition(status, "EngineReady")["reason"] == "Building"
    assert condition(status, "Scheduled")["status"] == "False"
    assert condition(status, "Available")["status"] == "False"


@pytest.mark.skipif(REAL_CLUSTER, reason="plays the Job controller")
async def test_engine_job_success_then_failure_on_a_new_key(api: Api, operator: None) -> None:
    await api.create(*VOICES, voice("joe"))
    (job,) = await eventually(lambda: jobs_of(api, "joe"))
    await finish_job(api, job, succeeded=True)

    async def engine_ready() -> dict[str, Any] | None:
        status = await status_of(api, "joe")
        return status if condition(status, "EngineReady").get("status") == "True" else None

    status = await eventually(engine_ready)
    assert status["phase"] == "Pending"  # engines built, no pool pod yet
    assert status["engineKey"] in job["metadata"]["name"] or job["metadata"]["name"].endswith(
        status["engineKey"][:10]
    )
    # The cache entry's key is recorded: deleting the finished Job builds nothing again.
    await api.delete("batch/v1", "jobs", job["metadata"]["name"])
    await asyncio.sleep(1.5)
    assert await jobs_of(api, "joe") == []

    # A new precision is a new engine key: a new Job, whose failure is reported, not retried.
    await api.patch(*VOICES, "joe", {"spec": {"precision": "fp32"}})
    (job2,) = await eventually(lambda: jobs_of(api, "joe"))
    assert job2["metadata"]["name"] != job["metadata"]["name"]
    await finish_job(api, job2, succeeded=False, message="TensorRT: out of memory")

    async def failed() -> dict[str, Any] | None:
        status = await status_of(api, "joe")
        return status if status.get("phase") == "Failed" else None

    status = await eventually(failed)
    engine = condition(status, "EngineReady")
    assert engine["status"] == "False"
    assert engine["reason"] == "BuildFailed"
    assert "TensorRT: out of memory" in engine["message"]
    assert status["observedGeneration"] == 2
    await asyncio.sleep(1.5)
    assert [j["metadata"]["name"] for j in await jobs_of(api, "joe")] == [job2["metadata"]["name"]]


async def test_spec_change_updates_children_and_observed_generation(
    api: Api, operator: None
) -> None:
    await api.create(*VOICES, voice("joe", autoscaling={"maxReplicas": 3}))

    async def hpa_max(expected: int) -> bool:
        hpa = await api.get("autoscaling/v2", "horizontalpodautoscalers", "voxfleet-triton-t4")
        return bool(hpa) and hpa["spec"]["maxReplicas"] == expected

    await eventually(lambda: hpa_max(3))
    await api.patch(
        *VOICES, "joe", {"spec": {"autoscaling": {"maxReplicas": 9, "targetLoadPercent": 50}}}
    )
    # The pool's maxPods (4) caps the voice's wish (9).
    await eventually(lambda: hpa_max(4))
    hpa = await api.get("autoscaling/v2", "horizontalpodautoscalers", "voxfleet-triton-t4")
    assert hpa is not None
    targets = {m["pods"]["metric"]["name"]: m["pods"]["target"] for m in hpa["spec"]["metrics"]}
    assert targets["voxfleet_load_ratio"]["averageValue"] == "500m"

    async def observed(generation: int) -> bool:
        return (await status_of(api, "joe")).get("observedGeneration") == generation

    await eventually(lambda: observed(2))

    # Moving the voice to another pool moves its Service's selector and builds for that GPU.
    await api.patch(*VOICES, "joe", {"spec": {"pool": "l4"}})
    await eventually(lambda: observed(3))
    service = await api.get("v1", "services", "joe-tts")
    assert service is not None and service["spec"]["selector"]["voxfleet.io/pool"] == "l4"
    assert await api.get("apps/v1", "deployments", "voxfleet-triton-l4") is not None
    # joe was the t4 pool's only voice: that pool's objects go with it.
    await eventually(lambda: _gone(api, "apps/v1", "deployments", "voxfleet-triton-t4"))
    await eventually(
        lambda: _gone(api, "autoscaling/v2", "horizontalpodautoscalers", "voxfleet-triton-t4")
    )
    (job,) = await eventually(lambda: jobs_of(api, "joe"))
    assert job["spec"]["template"]["spec"]["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-L4"


async def test_existing_child_is_adopted_and_patched_not_duplicated(
    api: Api, operator: None
) -> None:
    stale = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "joe-tts", "labels": {"keep": "me"}},
        "spec": {"selector": {"app": "something-else"}, "ports": [{"name": "grpc", "port": 8001}]},
    }
    await api.create("v1", "services", stale)
    created = await api.create(*VOICES, voice("joe"))

    async def adopted() -> dict[str, Any] | None:
        service = await api.get("v1", "services", "joe-tts")
        refs = (service or {}).get("metadata", {}).get("ownerReferences") or []
        return service if [r["uid"] for r in refs] == [created["metadata"]["uid"]] else None

    service = await eventually(adopted)
    assert service["spec"]["selector"]["serving.voxfleet.io/joe"] == "true"
    assert "app" not in service["spec"]["selector"]  # merge patch: ours replaces the map
    names = [s["metadata"]["name"] for s in await api.list("v1", "services")]
    assert names.count("joe-tts") == 1


async def test_deleted_or_edited_child_comes_back(api: Api, operator: None) -> None:
    await api.create(*VOICES, voice("joe"))
    await eventually(lambda: api.get("v1", "services", "joe-tts"))
    await eventually(lambda: api.get("apps/v1", "deployments", "voxfleet-triton-t4"))

    await api.delete("v1", "services", "joe-tts")
    await api.patch(
        "apps/v1",
        "deployments",
        "voxfleet-triton-t4",
        {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 10}}}},
    )

    async def restored() -> bool:
        deployment = await api.get("apps/v1", "deployments", "voxfleet-triton-t4")
        grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        return bool(await api.get("v1", "services", "joe-tts")) and grace > 30

    await eventually(restored, timeout=5)


async def test_an_invalid_voice_is_refused_by_the_crd_or_fails_with_a_reason(
    api: Api, operator: None
) -> None:
    # What the CRD's CEL rules can tell, the API server refuses at once, with the rule's
    # message (a default of {} once failed these rules and kept the CRD out altogether).
    bad = voice("bad", autoscaling={"minReplicas": 5, "maxReplicas": 2})
    with pytest.raises(AssertionError, match=r"422 .*minReplicas must not exceed .*maxReplicas"):
        await api.create(*VOICES, bad)
    # What only the operator knows (its pools) ends in a Failed voice with a reason, and no
    # retry storm.
    await api.create(*VOICES, voice("lost", pool="a100"))

    async def failed() -> dict[str, Any] | None:
        status = await status_of(api, "lost")
        return status if status.get("phase") == "Failed" else None

    status = await eventually(failed)
    assert condition(status, "Scheduled")["reason"] == "UnknownPool"
    assert "known pools: t4, l4" in condition(status, "Scheduled")["message"]
    assert await jobs_of(api, "lost") == []
    if api.faults is None:
        return

    async def create_handled() -> bool:
        # kopf records a handled create in an annotation, written after the handler's status.
        body = await api.get(*VOICES, "lost")
        annotations = (body or {}).get("metadata", {}).get("annotations") or {}
        return "voxfleet.io/last-handled-configuration" in annotations

    await eventually(create_handled)
    writes_before = api.writes()
    await asyncio.sleep(2.0)  # four drift-correction ticks
    assert api.writes() == writes_before, "an invalid voice keeps being written"


async def test_delete_clears_finalizer_and_releases_the_pool(api: Api, operator: None) -> None:
    await api.create(*VOICES, voice("joe", autoscaling={"minReplicas": 2}))
    await api.create(*VOICES, voice("amy"))

    async def hpa_min(expected: int) -> bool:
        hpa = await api.get("autoscaling/v2", "horizontalpodautoscalers", "voxfleet-triton-t4")
        return bool(hpa) and hpa["spec"]["minReplicas"] == expected

    async def shared_by_both() -> bool:
        deployment = await api.get("apps/v1", "deployments", "voxfleet-triton-t4")
        return bool(deployment) and len(deployment["metadata"]["ownerReferences"]) == 2

    await eventually(shared_by_both)
    await eventually(lambda: hpa_min(2))
    joe = await api.get(*VOICES, "joe")
    assert joe is not None and joe["metadata"]["finalizers"] == ["voxfleet.io/finalizer"]

    await api.delete(*VOICES, "joe")
    await eventually(lambda: _gone(api, *VOICES, "joe"))
    await eventually(lambda: _gone(api, "v1", "services", "joe-tts"), timeout=20)
    deployment = await api.get("apps/v1", "deployments", "voxfleet-triton-t4")
    assert deployment is not None
    assert [r["name"] for r in deployment["metadata"]["ownerReferences"]] == ["amy"]
    await eventually(lambda: hpa_min(1))  # the pool now follows amy's bounds alone

    await api.delete(*VOICES, "amy")
    await eventually(lambda: _gone(api, *VOICES, "amy"))
    for (group, plural), name in CHILDREN.items():
        await eventually(lambda g=group, p=plural, n=name: _gone(api, g, p, n))


async def _gone(api: Api, group: str, plural: str, name: str) -> bool:
    return await api.get(group, plural, name) is None


@pytest.mark.skipif(REAL_CLUSTER, reason="counts the operator's requests (fault proxy)")
async def test_no_writes_once_converged(api: Api, operator: None, tmp_path: Path) -> None:
    from voxfleet_operator.config import load_config
    from voxfleet_operator.context import Runtime, peer_entry
    from voxfleet_operator.kube import KubeClient
    from voxfleet_operator.reconcile import reconcile_voice

    await api.create(*VOICES, voice("joe"))
    await api.create(*VOICES, voice("amy", pool="l4"))
    (job,) = await eventually(lambda: jobs_of(api, "joe"))
    await finish_job(api, job, succeeded=True)

    async def converged() -> bool:
        status = await status_of(api, "joe")
        return condition(status, "EngineReady").get("status") == "True"

    await eventually(converged)
    await asyncio.sleep(1.0)  # let the timers of both voices settle too
    assert api.faults is not None
    writes_before = api.writes()

    import aiohttp

    client = await KubeClient.connect()
    async with aiohttp.ClientSession() as http:
        runtime = Runtime(config=load_config(), client=client, http=http)
        try:
            for _ in range(20):
                bodies = [await api.get(*VOICES, n) for n in ("joe", "amy")]
                entries = [e for e in (peer_entry(b) for b in bodies if b) if e]
                for body in bodies:
                    assert body is not None
                    await reconcile_voice(runtime, body, lambda e=entries: list(e))
        finally:
            await client.close()
    await asyncio.sleep(1.0)  # and two more timer ticks of the running operator
    writes = api.writes()[len(writes_before) :]
    print(f"requests by 20 no-op reconciles x 2 voices: {client.requests}; writes: {len(writes)}")
    assert writes == []


@pytest.mark.skipif(REAL_CLUSTER, reason="needs the fault proxy")
async def test_conflicts_are_retried_and_service_monitor_follows_its_crd(
    api: Api, tmp_path: Path
) -> None:
    from operator_harness import install_service_monitor_crd, running_operator

    assert api.faults is not None
    await install_service_monitor_crd(api)
    # A Secret of that name that the operator does not manage (Helm's) is left alone.
    await api.create(
        "v1",
        "secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "voxfleet-repository-key",
                "labels": {"app.kubernetes.io/managed-by": "Helm"},
            },
            "data": {"repository-key": "aGVsbQ=="},
        },
    )
    async with running_operator(tmp_path, resync_seconds=0.5):
        await api.create(*VOICES, voice("joe"))
        monitor = await eventually(
            lambda: api.get("monitoring.coreos.com/v1", "servicemonitors", "voxfleet-triton-t4")
        )
        assert monitor["spec"]["endpoints"][0]["port"] == "metrics"

        # The operator's next two patches of it are refused with 409 Conflict. Set before the
        # drift: the operator answers it on a thread of its own, through the proxy, and its
        # first patch may be served while the test's own patch is still being answered.
        path = Api.path("apps/v1", "deployments", "voxfleet-triton-t4")
        api.faults.conflicts[path] = 2
        await api.patch(
            "apps/v1",
            "deployments",
            "voxfleet-triton-t4",
            {"spec": {"template": {"spec": {"terminationGracePeriodSeconds": 10}}}},
        )

        async def restored() -> bool:
            deployment = await api.get("apps/v1", "deployments", "voxfleet-triton-t4")
            return bool(deployment) and (
                deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > 30
            )

        await eventually(restored, timeout=5)
        assert api.faults.conflicts[path] == 0  # both conflicts were met and retried
        secret = await api.get("v1", "secrets", "voxfleet-repository-key")
        assert secret is not None and secret["data"] == {"repository-key": "aGVsbQ=="}
        assert "ownerReferences" not in secret["metadata"]


@pytest.mark.skipif(REAL_CLUSTER, reason="plays the kubelet with a local tritonserver")
@pytest.mark.triton
async def test_voice_is_loaded_onto_ready_pool_pods_through_the_keyed_api(
    api: Api, tmp_path: Path
) -> None:
    """A real tritonserver with the pool's flags stands in as the pool pod's container.

    The engines the load points at (`/engines/<key>`, TensorRT) cannot exist here, so Triton
    refuses the model; what is checked is the operator's side: it finds the ready pool pod,
    calls the repository API with the key (a wrong key would be HTTP 403, not a model
    error), reports Triton's own message, and does not label the pod as serving. The drift
    timer is set to a minute: the finished Job and the ready pod are acted on as their
    events arrive.
    """
    from operator_harness import REPOSITORY_KEY, running_operator
    from voxfleet_operator.render.pool import KEY_ENV, triton_args

    from engines.pod.triton_server import TritonServer

    own = ("--model-repository", "--grpc-port", "--http-port", "--metrics-port", "--exit-timeout")
    args = [
        a.replace(f"$({KEY_ENV})", REPOSITORY_KEY) for a in triton_args() if not a.startswith(own)
    ]
    (tmp_path / "models").mkdir()
    (tmp_path / "triton").mkdir()
    triton = TritonServer(tmp_path / "models", extra_args=args, work_dir=tmp_path / "triton")
    # The namespace's key, as the operator made it earlier: it keeps an existing key.
    encoded = base64.b64encode(REPOSITORY_KEY.encode()).decode()
    await api.create(
        "v1",
        "secrets",
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": "voxfleet-repository-key",
                "labels": {"app.kubernetes.io/managed-by": "voxfleet-operator"},
            },
            "data": {"repository-key": encoded},
        },
    )
    with triton:
        async with running_operator(tmp_path, resync_seconds=60):
            await api.create(*VOICES, voice("joe"))
            (job,) = await eventually(lambda: jobs_of(api, "joe"))
            await finish_job(api, job, succeeded=True)

            async def engine_ready() -> bool:
                status = await status_of(api, "joe")
                return condition(status, "EngineReady").get("status") == "True"

            await eventually(engine_ready, timeout=15)
            for name, ready in (("pod-ready", True), ("pod-starting", False)):
                await api.create("v1", "pods", pool_pod(name, triton.http_port, ready))

            async def load_failed() -> dict[str, Any] | None:
                status = await status_of(api, "joe")
                available = condition(status, "Available")
                return status if available.get("reason") == "LoadFailed" else None

            status = await eventually(load_failed, timeout=15)
            pod = await api.get("v1", "pods", "pod-ready")
    message = condition(status, "Available")["message"]
    assert message.startswith("pod pod-ready: ")
    assert "HTTP 400" in message and "HTTP 403" not in message  # the key was accepted
    assert "load failed for model 'joe'" in message  # Triton's own words
    assert "pod-starting" not in message  # a pod that is not ready is left alone
    assert condition(status, "Scheduled")["status"] == "True"
    assert pod is not None and "serving.voxfleet.io/joe" not in pod["metadata"]["labels"]
    # A refused load is retried with back-off, not on every event or pass.
    log = Path(triton.log_path).read_text(errors="replace")
    assert log.count("loading: joe:1") == 1


def pool_pod(name: str, http_port: int, ready: bool) -> dict[str, Any]:
    """A pool pod as the kubelet would report it, its Triton at 127.0.0.1:`http_port`."""
    status: dict[str, Any] = {"phase": "Pending"}
    if ready:
        status = {
            "phase": "Running",
            "podIP": "127.0.0.1",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "voxfleet-triton", "voxfleet.io/pool": "t4"},
        },
        "spec": {
            "containers": [
                {
                    "name": "triton",
                    "image": "triton",
                    "ports": [{"name": "http", "containerPort": http_port}],
                }
            ]
        },
        "status": status,
    }
