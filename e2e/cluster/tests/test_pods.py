"""Pods the scheduler binds to the agent's nodes run as real processes with their own IP,
probes and status; requests become CPU sets; volumes above the image's files leave them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
from cluster import LocalCluster, NodeSpec
from cluster.kube import Kube
from cluster.waiting import eventually
from workloads import claim, finished, pods_of, ready_pods, web_deployment


async def test_a_deployment_pod_serves_on_its_own_ip(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    # No spec.replicas: one pod, as the API server defaults it.
    await kube.create("Deployment", ns, web_deployment("web", replicas=None))
    (pod,) = await eventually(lambda: ready_pods(kube, ns, "web", 1), timeout=60)
    name = pod["metadata"]["name"]
    status = pod["status"]
    assert status["phase"] == "Running"
    assert status["podIP"].startswith("10.213.")
    assert status["hostIP"] == cluster.gateway
    assert pod["spec"]["nodeName"] in {spec.name for spec in cluster.node_specs}
    assert {c["type"] for c in status["conditions"]} >= {
        "PodScheduled",
        "Initialized",
        "ContainersReady",
        "Ready",
    }
    assert status["containerStatuses"][0]["ready"] is True
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{status['podIP']}:8080/index.html") as response:
            assert (await response.text()).strip() == f"v1 from {name}"

    async def deployment_status() -> dict | None:
        deployment = await kube.get("Deployment", ns, "web")
        status = (deployment or {}).get("status") or {}
        return status if status.get("availableReplicas") == 1 else None

    await eventually(deployment_status, timeout=30)
    # The emptyDir at /srv is the pod's own: the host's /srv has no such file.
    assert not os.path.exists("/srv/site/index.html")


async def test_pods_requesting_one_cpu_get_distinct_cores(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        return  # one core: nothing to spread over
    await kube.create("Deployment", ns, web_deployment("web", replicas=2, cpu="1"))
    pods = await eventually(lambda: ready_pods(kube, ns, "web", 2), timeout=60)
    async with aiohttp.ClientSession() as session:
        cores = []
        for pod in pods:
            url = f"http://{pod['status']['podIP']}:8080/cpus"
            async with session.get(url) as response:
                cores.append((await response.text()).strip())
    assert len(set(cores)) == 2 and all(len(json.loads(c)) == 1 for c in cores), cores


async def test_a_pod_no_node_can_hold_stays_pending(kube: Kube, ns: str) -> None:
    """The scheduler, not the agent, places pods: a request larger than any node's
    allocatable CPU leaves the pod unscheduled, and nothing runs it."""
    too_big = str(int(NodeSpec("x").cpu) + 1)
    await kube.create("Deployment", ns, web_deployment("big", replicas=1, cpu=too_big))

    async def unschedulable() -> dict | None:
        pods = await pods_of(kube, ns, "big")
        for condition in ((pods[0].get("status") or {}).get("conditions") or []) if pods else []:
            if condition["type"] == "PodScheduled" and condition["reason"] == "Unschedulable":
                return pods[0]
        return None

    pod = await eventually(unschedulable, timeout=60)
    assert not pod["spec"].get("nodeName") and "Insufficient cpu" in str(pod["status"])


async def test_a_volume_above_the_image_files_leaves_them_in_place(tmp_path: Path) -> None:
    """A checkout under /tmp and an emptyDir at /tmp (the operator's pod has one): the command
    that an image keeps elsewhere still runs, and the rest of the directory is the volume's."""
    covered = tmp_path / "covered"
    image = covered / "project"
    (image / "bin").mkdir(parents=True)
    (covered / "on-the-host").write_text("not the pod's\n")
    hello = image / "bin" / "hello"
    hello.write_text(f"#!/bin/sh\nls {covered} > /events/listing\necho from the image\n")
    hello.chmod(0o755)
    pod = {
        "metadata": {"name": "hello"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "command": ["sh", "-c", f"{hello} > /events/said"],
                    "volumeMounts": [
                        {"name": "events", "mountPath": "/events"},
                        {"name": "scratch", "mountPath": str(covered)},
                    ],
                }
            ],
            "volumes": [
                {"name": "events", "persistentVolumeClaim": {"claimName": "events"}},
                {"name": "scratch", "emptyDir": {}},
            ],
        },
    }
    # A cluster of its own: the image paths are the agent's setting.
    with LocalCluster(
        tmp_path / "cluster", nodes=[NodeSpec("solo")], image_paths=[str(image)]
    ) as cluster:
        kube = await Kube.connect(cluster.kubeconfig)
        try:
            await kube.create("PersistentVolumeClaim", "default", claim("events"))
            await kube.create("Pod", "default", pod)
            done = await eventually(lambda: finished(kube, "default", "hello"), timeout=60)
        finally:
            await kube.close()
        events = cluster.claim_path("default", "events")
        assert done["status"]["phase"] == "Succeeded", cluster.logs("hello", "main")
        assert (events / "said").read_text() == "from the image\n"
        assert (events / "listing").read_text().split() == ["project"]  # not the host's file
