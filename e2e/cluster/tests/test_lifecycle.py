"""Container restarts (exit, liveness) and graceful deletion (preStop, SIGTERM, grace)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from cluster import LocalCluster
from cluster.kube import Kube
from cluster.objects import condition, is_deleting, is_ready
from cluster.waiting import eventually
from workloads import claim, fetch, ready_pods, web_deployment


def bare_pod(name: str, script: str, **extra: object) -> dict:
    container: dict[str, Any] = {
        "name": "main",
        "image": "busybox",
        "command": ["sh", "-c", script],
        "volumeMounts": [
            {"name": "events", "mountPath": "/events"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    container.update(extra)
    return {
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [container],
            "volumes": [
                {"name": "events", "persistentVolumeClaim": {"claimName": "events"}},
                {"name": "tmp", "emptyDir": {}},
            ],
        },
    }


async def container_status(kube: Kube, ns: str, name: str) -> dict:
    pod = await kube.get("Pod", ns, name)
    statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0])


async def test_a_killed_container_is_restarted_and_serves_again(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    await kube.create("Deployment", ns, web_deployment("web", replicas=1))
    (pod,) = await eventually(lambda: ready_pods(kube, ns, "web", 1), timeout=60)
    name = pod["metadata"]["name"]
    pid = cluster.container_pid(ns, name, "web")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)

    async def restarted() -> dict | None:
        status = await container_status(kube, ns, name)
        return status if status.get("restartCount") == 1 and status.get("ready") else None

    status = await eventually(restarted, timeout=30)
    assert status["lastState"]["terminated"]["exitCode"] == 137
    assert "running" in status["state"]
    assert cluster.container_pid(ns, name, "web") not in (None, pid)
    assert (await fetch(f"{pod['status']['podIP']}:8080")) == f"v1 from {name}"


async def test_a_container_failing_liveness_is_restarted(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    # Healthy for about a second after each start, then the liveness probe fails.
    script = "touch /tmp/healthy; sleep 1; rm /tmp/healthy; exec sleep 60"
    liveness = {
        "exec": {"command": ["test", "-f", "/tmp/healthy"]},
        "periodSeconds": 1,
        "failureThreshold": 2,
    }
    await kube.create("PersistentVolumeClaim", ns, claim("events"))
    await kube.create("Pod", ns, bare_pod("sick", script, livenessProbe=liveness))

    async def restarted() -> dict | None:
        status = await container_status(kube, ns, "sick")
        return status if status.get("restartCount", 0) >= 1 else None

    status = await eventually(restarted, timeout=60)
    terminated = status["lastState"]["terminated"]
    assert "Liveness probe failed" in terminated["message"]
    assert terminated["exitCode"] == 143  # SIGTERM after the failure, as the kubelet sends


async def test_deletion_runs_pre_stop_then_sigterm_then_sigkill_after_the_grace_period(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    # The container ignores SIGTERM (its trap only records it), so SIGKILL ends it.
    script = (
        "trap 'echo term >> /events/log' TERM; echo started >> /events/log; "
        "while true; do sleep 0.1; done"
    )
    pre_stop = {"preStop": {"exec": {"command": ["sh", "-c", "echo pre-stop >> /events/log"]}}}
    readiness = {"exec": {"command": ["grep", "-q", "started", "/events/log"]}, "periodSeconds": 1}
    await kube.create("PersistentVolumeClaim", ns, claim("events"))
    await kube.create(
        "Pod", ns, bare_pod("graceful", script, lifecycle=pre_stop, readinessProbe=readiness)
    )

    async def ready() -> bool:
        pod = await kube.get("Pod", ns, "graceful")
        return bool(pod and is_ready(pod))

    await eventually(ready, timeout=60)
    pid = cluster.container_pid(ns, "graceful", "main")
    assert pid is not None
    deleted_at = time.monotonic()
    await kube.delete("Pod", ns, "graceful")

    # At once: still there, being deleted, no longer Ready (so out of every Service).
    pod = await kube.get("Pod", ns, "graceful")
    assert pod is not None and is_deleting(pod)

    async def not_ready() -> bool:
        pod = await kube.get("Pod", ns, "graceful")
        assert pod is not None, "the pod went before its grace period"
        return (condition(pod, "Ready") or {}).get("status") == "False"

    await eventually(not_ready, timeout=2)

    # Gone from the API only through the node agent's final delete, after SIGKILL.
    async def gone() -> bool:
        return await kube.get("Pod", ns, "graceful") is None

    await eventually(gone, timeout=15)
    elapsed = time.monotonic() - deleted_at
    assert 1.8 <= elapsed < 6, elapsed  # the 2 s grace period, then SIGKILL
    log = (cluster.claim_path(ns, "events") / "log").read_text().split()
    assert log == ["started", "pre-stop", "term"]
    assert not os.path.exists(f"/proc/{pid}")


async def test_a_sleep_pre_stop_delays_sigterm_and_a_prompt_exit_ends_the_grace_early(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    # As the Triton pods: `preStop: sleep`, then a process that exits on SIGTERM.
    script = (
        "trap 'date +%s.%N >> /events/term; exit 0' TERM; echo started >> /events/log; "
        "while true; do sleep 0.1; done"
    )
    pre_stop = {"preStop": {"sleep": {"seconds": 1}}}
    readiness = {"exec": {"command": ["grep", "-q", "started", "/events/log"]}, "periodSeconds": 1}
    pod = bare_pod("sleeper", script, lifecycle=pre_stop, readinessProbe=readiness)
    pod["spec"]["terminationGracePeriodSeconds"] = 10
    await kube.create("PersistentVolumeClaim", ns, claim("events"))
    await kube.create("Pod", ns, pod)

    async def ready() -> bool:
        current = await kube.get("Pod", ns, "sleeper")
        return bool(current and is_ready(current))

    await eventually(ready, timeout=60)
    deleted_at = time.time()
    await kube.delete("Pod", ns, "sleeper")

    async def gone() -> bool:
        return await kube.get("Pod", ns, "sleeper") is None

    await eventually(gone, timeout=15)
    elapsed = time.time() - deleted_at
    term_at = float((cluster.claim_path(ns, "events") / "term").read_text())
    assert term_at - deleted_at >= 1.0  # SIGTERM only after the preStop sleep
    assert elapsed < 5, elapsed  # gone once the process exited, well before 10 s
