"""Jobs: pods from exit codes, back-off limit, deadline, and a claim shared between pods."""

from __future__ import annotations

import asyncio
import base64

from cluster import LocalCluster
from cluster.api import KubeApi
from cluster.waiting import eventually


def job(name: str, script: str, **spec: object) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            **spec,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "main",
                        "image": "busybox",
                        "command": ["sh", "-c", script],
                        "env": [{"name": "TOKEN", "valueFrom": {
                            "secretKeyRef": {"name": "creds", "key": "token"}}}],
                        "volumeMounts": [{"name": "cache", "mountPath": "/cache",
                                          "readOnly": name == "reader"}],
                    }],
                    "volumes": [{"name": "cache",
                                 "persistentVolumeClaim": {"claimName": "shared-cache"}}],
                },
            },
        },
    }


async def finished(kube: KubeApi, name: str) -> dict | None:
    current = await kube.get("Job", "default", name)
    for item in ((current or {}).get("status") or {}).get("conditions") or []:
        if item["type"] in ("Complete", "Failed") and item["status"] == "True":
            return current
    return None


async def job_pods(kube: KubeApi, name: str) -> list[dict]:
    return [p for p in await kube.list("Pod", "default")
            if (p["metadata"].get("labels") or {}).get("job-name") == name]


async def create_secret(kube: KubeApi) -> None:
    await kube.create("Secret", "default", {
        "metadata": {"name": "creds"},
        "data": {"token": base64.b64encode(b"s3cret").decode()},
    })


async def test_a_failing_job_stops_at_its_backoff_limit(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await create_secret(kube)
    await kube.create("Job", "default", job("fails", "echo trying; exit 3", backoffLimit=1))
    done = await eventually(lambda: finished(kube, "fails"), timeout=30)
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "BackoffLimitExceeded"
    assert failed["message"] == "Job has reached the specified backoff limit"
    assert done["status"]["failed"] == 2 and done["status"].get("succeeded", 0) == 0
    await asyncio.sleep(1.5)  # longer than the back-off: no third attempt comes
    pods = await job_pods(kube, "fails")
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Failed"
        assert pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        assert "trying" in cluster.logs(pod["metadata"]["name"], "main")


async def test_a_job_writes_a_claim_that_the_next_pod_reads(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await create_secret(kube)
    await kube.create("Job", "default", job("writer", 'echo "$(TOKEN)" > /cache/token'))
    done = await eventually(lambda: finished(kube, "writer"), timeout=30)
    assert [c["type"] for c in done["status"]["conditions"]][-1] == "Complete"
    assert done["status"]["succeeded"] == 1 and done["status"]["active"] == 0
    # The second pod sees the first one's file at the same path, and its mount is read-only.
    check = 'test "$(cat /cache/token)" = s3cret && ! touch /cache/other 2>/dev/null'
    await kube.create("Job", "default", job("reader", check, backoffLimit=0))
    done = await eventually(lambda: finished(kube, "reader"), timeout=30)
    assert done["status"].get("succeeded") == 1, cluster.logs(
        (await job_pods(kube, "reader"))[0]["metadata"]["name"], "main")


async def test_a_job_past_its_deadline_fails_and_its_pod_stops(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await create_secret(kube)
    await kube.create("Job", "default", job("slow", "exec sleep 60", activeDeadlineSeconds=1))
    done = await eventually(lambda: finished(kube, "slow"), timeout=30)
    failed = next(c for c in done["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "DeadlineExceeded"

    async def pod_gone() -> bool:
        return not await job_pods(kube, "slow")

    await eventually(pod_gone, timeout=15)
