"""The operator under pressure: drift repaired on events, outages, caches, keys, bad edits.

The drift timer is set to 600 s in the tests that time a repair or a recovery, so that what
is measured is the event-driven path and the back-off, never the timer.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import (
    ENGINE_CACHE_CLAIM,
    NAMESPACE,
    REAL_CLUSTER,
    Api,
    engine_cache_claim,
    eventually,
    running_operator,
)
from test_operator import VOICES, condition, finish_job, jobs_of, status_of, voice

pytestmark = [
    pytest.mark.kube,
    pytest.mark.skipif(REAL_CLUSTER, reason="needs the fault proxy"),
]

DEPLOYMENT = ("apps/v1", "deployments", "voxfleet-triton-t4")
KEY_SECRET = "voxfleet-repository-key"
HPA = ("autoscaling/v2", "horizontalpodautoscalers", "voxfleet-triton-t4")


async def _with_claim(api: Api) -> None:
    if await api.get("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM) is None:
        await api.create("v1", "persistentvolumeclaims", engine_cache_claim())


async def _converged(api: Api, name: str, generation: int = 1) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        status = await status_of(api, name)
        return status if status.get("observedGeneration") == generation else None

    result: dict[str, Any] = await eventually(done, timeout=15)
    return result


@pytest.fixture()
async def slow_timer(api: Api, tmp_path: Path) -> AsyncIterator[None]:
    await _with_claim(api)
    async with running_operator(tmp_path, resync_seconds=600):
        yield


async def _timed(check: Any, timeout: float = 10.0) -> float:
    started = time.monotonic()
    await eventually(check, timeout=timeout, interval=0.02)
    return time.monotonic() - started


async def test_added_fields_and_deleted_children_are_repaired_on_events(
    api: Api, slow_timer: None
) -> None:
    await api.create(*VOICES, voice("joe"))
    await _converged(api, "joe")
    await eventually(lambda: api.get(*DEPLOYMENT))

    # What a hostile or careless edit adds to the GPU pods: all of it is reverted.
    live = await api.get(*DEPLOYMENT)
    assert live is not None
    pod = live["spec"]["template"]["spec"]
    triton = {**pod["containers"][0]}
    triton["securityContext"] = {
        **triton["securityContext"],
        "privileged": True,
        "allowPrivilegeEscalation": True,
    }
    sidecar = {"name": "sidecar", "image": "busybox"}
    edit = {
        "hostNetwork": True,
        "serviceAccountName": "admin",
        "containers": [triton, sidecar],
    }
    await api.patch(*DEPLOYMENT, {"spec": {"template": {"spec": edit}, "replicas": 3}})

    async def reverted() -> bool:
        pod = (await api.get(*DEPLOYMENT) or {})["spec"]["template"]["spec"]
        containers = pod["containers"]
        return (
            "hostNetwork" not in pod
            and "serviceAccountName" not in pod
            and len(containers) == 1
            and "privileged" not in containers[0]["securityContext"]
            and containers[0]["securityContext"]["allowPrivilegeEscalation"] is False
        )

    edited = await _timed(reverted)
    deployment = await api.get(*DEPLOYMENT)
    assert deployment is not None and deployment["spec"]["replicas"] == 3  # the HPA's field

    await api.delete("v1", "services", "joe-tts")
    deleted_service = await _timed(lambda: api.get("v1", "services", "joe-tts"))
    await api.delete(*HPA)
    deleted_hpa = await _timed(lambda: api.get(*HPA))
    await api.delete(*DEPLOYMENT)
    deleted_deployment = await _timed(lambda: api.get(*DEPLOYMENT))
    print(
        f"\nrestored with a 600 s drift timer: added fields {edited:.2f} s, deleted Service "
        f"{deleted_service:.2f} s, deleted HPA {deleted_hpa:.2f} s, deleted Deployment "
        f"{deleted_deployment:.2f} s"
    )
    assert max(edited, deleted_service, deleted_hpa, deleted_deployment) < 2.0


async def test_a_deleted_build_job_and_key_secret_come_back_on_events(
    api: Api, slow_timer: None
) -> None:
    """Until they are back, the voice's engines are not built and new pool pods cannot start
    (their Triton takes the key from the Secret): they come back as fast as other children."""
    await api.create(*VOICES, voice("joe"))
    (job,) = await eventually(lambda: jobs_of(api, "joe"))  # building: no Job controller here
    await eventually(lambda: api.get("v1", "secrets", KEY_SECRET))

    async def replaced(plural: str, name: str, uid: str) -> bool:
        live = await api.get("v1" if plural == "secrets" else "batch/v1", plural, name)
        return live is not None and live["metadata"]["uid"] != uid

    name = job["metadata"]["name"]
    await api.delete("batch/v1", "jobs", name)
    deleted_job = await _timed(lambda: replaced("jobs", name, job["metadata"]["uid"]))
    secret = await api.get("v1", "secrets", KEY_SECRET)
    assert secret is not None
    await api.delete("v1", "secrets", KEY_SECRET)
    deleted_secret = await _timed(
        lambda: replaced("secrets", KEY_SECRET, secret["metadata"]["uid"])
    )
    print(
        f"\nrestored with a 600 s drift timer: deleted build Job {deleted_job:.2f} s, "
        f"deleted key Secret {deleted_secret:.2f} s"
    )
    assert max(deleted_job, deleted_secret) < 2.0


async def test_a_converged_operator_reads_no_watched_child_again(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the operator watches stays fresh through its events: not read again when the
    cache's time-to-live (5 minutes, here 0.5 s) runs out. Pool pods are listed again."""
    from voxfleet_operator import cache

    assert api.faults is not None
    monkeypatch.setattr(cache, "DEFAULT_TTL_SECONDS", 0.5)
    await _with_claim(api)
    async with running_operator(tmp_path, resync_seconds=0.5):
        await api.create(*VOICES, voice("joe"))
        (job,) = await eventually(lambda: jobs_of(api, "joe"))
        await finish_job(api, job, succeeded=True)
        await eventually(lambda: _engines_built(api, "joe"))
        await asyncio.sleep(1.0)
        served_before = len(api.faults.served)
        await asyncio.sleep(3.0)  # six drift passes, six times the time-to-live
        served = api.faults.served[served_before:]
    reads = [s for s in served if not s.endswith("/pods")]
    assert reads == [], f"a converged operator read {reads}"


async def _engines_built(api: Api, name: str) -> bool:
    return condition(await status_of(api, name), "EngineReady").get("status") == "True"


WRITES = frozenset({"POST", "PATCH", "PUT", "DELETE"})


@pytest.mark.parametrize(
    ("resync_seconds", "failing"),
    [(2.0, WRITES), (600.0, WRITES), (600.0, WRITES | {"GET"})],
    ids=["writes-timer-2s", "writes-timer-600s", "everything-timer-600s"],
)
async def test_operator_converges_right_after_an_api_outage(
    api: Api, tmp_path: Path, resync_seconds: float, failing: frozenset[str]
) -> None:
    assert api.faults is not None
    await _with_claim(api)
    async with running_operator(tmp_path, resync_seconds=resync_seconds):
        await _outage_then_recovery(api, resync_seconds, failing)


async def _outage_then_recovery(api: Api, resync_seconds: float, failing: frozenset[str]) -> None:
    assert api.faults is not None
    await api.create(*VOICES, voice("joe", autoscaling={"maxReplicas": 2}))
    await _converged(api, "joe")

    # The operator's requests (`failing`: its writes, or all of them, its watches too) fail
    # with 503 for 20 s; a spec change arrives meanwhile.
    api.faults.outage_methods = failing
    served_before = len(api.faults.served)
    await api.patch(*VOICES, "joe", {"spec": {"autoscaling": {"maxReplicas": 3}}})
    await asyncio.sleep(20)
    attempts = len(api.faults.served) - served_before
    api.faults.outage_methods = frozenset()
    recovered = time.monotonic()

    async def applied() -> bool:
        hpa = await api.get(*HPA)
        status = await status_of(api, "joe")
        return (
            bool(hpa)
            and hpa["spec"]["maxReplicas"] == 3
            and (status.get("observedGeneration") == 2)
        )

    await eventually(applied, timeout=30, interval=0.05)
    converged = time.monotonic() - recovered
    what = "everything" if "GET" in failing else "writes"
    print(
        f"\n20 s outage of {what}: {attempts} requests during it; converged {converged:.2f} s "
        f"after the API recovered (drift timer {resync_seconds:g} s)"
    )
    assert converged < 10.0
    # Backed off, not a retry storm: a flat 0.2 s retry would make ~100 per request kind.
    assert attempts < 100


async def test_client_retries_throttling_and_outages_and_sees_recovery(api: Api) -> None:
    from voxfleet_operator.context import TTSVOICES
    from voxfleet_operator.kube import ApiError, KubeClient

    assert api.faults is not None
    client = await KubeClient.connect()
    try:
        path = Api.path("voxfleet.io/v1alpha1", "ttsvoices", "absent")
        api.faults.throttled[path] = 2
        started = time.monotonic()
        assert await client.get(TTSVOICES, NAMESPACE, "absent") is None
        waited = time.monotonic() - started
        assert api.faults.throttled[path] == 0
        assert waited >= 2.0, f"Retry-After: 1 twice, yet answered after {waited:.2f} s"

        api.faults.outage_methods = frozenset({"GET"})
        with pytest.raises(ApiError) as failure:
            await client.get(TTSVOICES, NAMESPACE, "absent")
        assert failure.value.status == 503
        assert client.health.down
        api.faults.outage_methods = frozenset()
        started = time.monotonic()
        assert await client.health.wait_up(10.0)
        assert time.monotonic() - started < 2.0  # the probe runs every second
    finally:
        await client.close()


async def test_a_converged_operator_reads_and_writes_nothing(
    api: Api, operator: None, tmp_path: Path
) -> None:
    assert api.faults is not None
    await api.create(*VOICES, voice("joe"))
    await api.create(*VOICES, voice("amy", pool="l4"))
    (job,) = await eventually(lambda: jobs_of(api, "joe"))
    await finish_job(api, job, succeeded=True)

    async def engines_built() -> dict[str, Any] | None:
        status = await status_of(api, "joe")
        return status if condition(status, "EngineReady").get("status") == "True" else None

    first = await eventually(engines_built)
    await asyncio.sleep(0.5)
    served_before = len(api.faults.served)
    await asyncio.sleep(3.0)  # six drift passes of each voice
    served = api.faults.served[served_before:]
    assert served == [], f"a converged operator sent {served}"
    # The EngineReady message is the same before and after status records the key.
    assert condition(await status_of(api, "joe"), "EngineReady") == condition(first, "EngineReady")


async def test_each_namespace_gets_its_own_random_key(api: Api, operator: None) -> None:
    other = "tenant-b"
    await api.call(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other}},
    )
    await api.create(*VOICES, voice("joe"))
    body = voice("amy")
    body["metadata"]["namespace"] = other
    await api.call("POST", Api.path(*VOICES, ns=other), body)

    async def key_of(namespace: str) -> str | None:
        path = Api.path("v1", "secrets", "voxfleet-repository-key", ns=namespace)
        secret = await api.call("GET", path)
        if not secret:
            return None
        return base64.b64decode(secret["data"]["repository-key"]).decode()

    here = await eventually(lambda: key_of(NAMESPACE))
    there = await eventually(lambda: key_of(other))
    assert here != there
    assert len(here) >= 40 and len(there) >= 40  # 32 random bytes, URL-safe base64
    await asyncio.sleep(1.5)  # drift passes keep the key they made
    assert await key_of(NAMESPACE) == here and await key_of(other) == there
    deployment = await api.call("GET", Api.path("apps/v1", "deployments", "voxfleet-triton-t4"))
    env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    (key_env,) = [e for e in env if "secretKeyRef" in e.get("valueFrom", {})]
    assert key_env["valueFrom"]["secretKeyRef"]["name"] == "voxfleet-repository-key"


async def _serving_pod(api: Api, name: str, engine_key: str) -> None:
    """A ready pool pod that already has `name` loaded, as the operator marks one after a load
    (no Triton here: the engines a GPU pool loads cannot exist on these machines)."""
    from operator_harness import POOLS
    from test_operator import pool_pod
    from voxfleet_operator import loading
    from voxfleet_operator.pods import LOADED_PREFIX, pod_load_marker
    from voxfleet_operator.pools import parse_pools
    from voxfleet_operator.voice_plan import serving_plan
    from voxfleet_operator.voices import voice_from_object

    pools = parse_pools(POOLS)
    parsed = voice_from_object(voice(name, autoscaling={"maxReplicas": 3}), pools, NAMESPACE)
    plan = serving_plan(parsed.name, parsed.spec, pools.get(None), engine_key)
    pod = pool_pod("pod-serving", 8000, ready=True)
    marker = pod_load_marker(loading.load_digest(loading.load_request(plan)), pod)
    pod["metadata"]["labels"][f"serving.voxfleet.io/{name}"] = "true"
    pod["metadata"]["annotations"] = {LOADED_PREFIX + name: marker}
    await api.create("v1", "pods", pod)


async def test_an_invalid_edit_keeps_the_last_valid_generation(api: Api, operator: None) -> None:
    await api.create(*VOICES, voice("joe", autoscaling={"maxReplicas": 3}))
    (job,) = await eventually(lambda: jobs_of(api, "joe"))
    await finish_job(api, job, succeeded=True)

    async def built() -> dict[str, Any] | None:
        status = await status_of(api, "joe")
        return status if status.get("engineKey") else None

    await _serving_pod(api, "joe", (await eventually(built))["engineKey"])

    async def ready() -> dict[str, Any] | None:
        status = await status_of(api, "joe")
        return status if status.get("phase") == "Ready" else None

    before = await eventually(ready)
    assert before["readyPods"] == 1
    assert condition(before, "SpecValid")["status"] == "True"

    # An edit the CRD's CEL rules can judge is refused by the API server: nothing changes.
    with pytest.raises(AssertionError, match=r"422 .*minReplicas must not exceed"):
        await api.patch(*VOICES, "joe", {"spec": {"autoscaling": {"minReplicas": 5}}})
    # One only the operator can judge (a pool it does not know) is reported, and the last
    # valid generation keeps serving.
    await api.patch(*VOICES, "joe", {"spec": {"pool": "a100"}})
    status = await _converged(api, "joe", generation=2)
    spec_valid = condition(status, "SpecValid")
    assert spec_valid["status"] == "False" and spec_valid["reason"] == "UnknownPool"
    assert "known pools: t4, l4" in spec_valid["message"]
    assert "still serving generation 1" in spec_valid["message"]
    # Everything else is as it was: still Ready on its pod, endpoint, engines, the pool.
    assert status["phase"] == "Ready" and status["readyPods"] == 1
    assert status["pool"] == "t4"
    assert condition(status, "Available")["status"] == "True"
    assert status["endpoint"] == before["endpoint"]
    assert status["engineKey"] == before["engineKey"]
    assert condition(status, "EngineReady")["status"] == "True"
    await asyncio.sleep(1.0)
    hpa = await api.get(*HPA)
    assert hpa is not None and hpa["spec"]["maxReplicas"] == 3
    deployment = await api.get(*DEPLOYMENT)
    assert deployment is not None
    assert [r["name"] for r in deployment["metadata"]["ownerReferences"]] == ["joe"]
    assert await api.get("v1", "services", "joe-tts") is not None

    # Fixed: the new generation applies and the condition clears.
    await api.patch(*VOICES, "joe", {"spec": {"pool": "t4", "autoscaling": {"minReplicas": 2}}})
    status = await _converged(api, "joe", generation=3)
    assert condition(status, "SpecValid")["status"] == "True"
    hpa = await api.get(*HPA)
    assert hpa is not None and hpa["spec"]["minReplicas"] == 2


async def test_a_missing_engine_cache_claim_is_named(api: Api, operator: None) -> None:
    await api.delete("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM)
    # Gone, not just being deleted: the pvc-protection controller removes its finalizer.
    await eventually(lambda: _absent(api, ENGINE_CACHE_CLAIM), timeout=30)
    await api.create(*VOICES, voice("joe"))
    reason = functools.partial(_engine_ready, api, "joe", "reason")

    await eventually(lambda: _equals(reason, "EngineCacheMissing"))
    message = await _engine_ready(api, "joe", "message")
    assert f"PersistentVolumeClaim {ENGINE_CACHE_CLAIM} does not exist in namespace" in message
    await api.create("v1", "persistentvolumeclaims", engine_cache_claim())
    await eventually(lambda: _equals(reason, "Building"))


async def test_an_engine_cache_claim_being_deleted_is_named(api: Api, operator: None) -> None:
    """A claim with a deletionTimestamp is one that no new build pod can mount."""
    hold = {"metadata": {"finalizers": ["kubernetes.io/pvc-protection", "e2e.voxfleet.io/hold"]}}
    await api.patch("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM, hold)
    await api.delete("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM)
    reason = functools.partial(_engine_ready, api, "joe", "reason")
    try:
        await api.create(*VOICES, voice("joe"))
        await eventually(lambda: _equals(reason, "EngineCacheMissing"))
        message = await _engine_ready(api, "joe", "message")
        assert f"PersistentVolumeClaim {ENGINE_CACHE_CLAIM} is being deleted in" in message
    finally:
        release = {"metadata": {"finalizers": []}}
        await api.patch("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM, release)
    await eventually(lambda: _absent(api, ENGINE_CACHE_CLAIM), timeout=30)
    await api.create("v1", "persistentvolumeclaims", engine_cache_claim())
    await eventually(lambda: _equals(reason, "Building"))


async def _engine_ready(api: Api, name: str, field: str) -> str:
    return str(condition(await status_of(api, name), "EngineReady").get(field))


async def _absent(api: Api, claim: str) -> bool:
    return await api.get("v1", "persistentvolumeclaims", claim) is None


async def _equals(read: Any, expected: str) -> bool:
    return bool(await read() == expected)


async def test_watches_that_expire_are_listed_again_and_the_operator_converges(
    api: Api, slow_timer: None
) -> None:
    """A watch resumed from a resourceVersion the server no longer holds gets 410 Gone; the
    operator lists again and goes on (the drift timer is 600 s: only events act here)."""
    assert api.faults is not None
    await api.create(*VOICES, voice("joe", autoscaling={"maxReplicas": 2}))
    await _converged(api, "joe")
    api.faults.expired_watches = 20  # every watch that resumes now is told 410 first
    assert api.faults.cut_watches() > 0
    await eventually(
        lambda: _true(api.faults is not None and api.faults.expired_served >= 3), timeout=30
    )
    await api.patch(*VOICES, "joe", {"spec": {"autoscaling": {"maxReplicas": 3}}})

    async def applied() -> bool:
        hpa = await api.get(*HPA)
        return bool(hpa) and hpa["spec"]["maxReplicas"] == 3

    await eventually(applied, timeout=30)
    status = await _converged(api, "joe", generation=2)
    assert condition(status, "SpecValid")["status"] == "True"


async def _true(value: bool) -> bool:
    return value
