"""Deployments: rolling updates within maxSurge/maxUnavailable, scaling, CPU sets."""

from __future__ import annotations

import asyncio
import copy
import json
import os

import pytest
from cluster import LocalCluster
from cluster.api import KubeApi
from cluster.objects import is_deleting, is_ready
from cluster.waiting import eventually
from workloads import fetch, pods_of, ready_pods, web_deployment


async def test_a_rolling_update_keeps_every_replica_ready(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    deployment = web_deployment("web", replicas=2)
    await kube.create("Deployment", "default", copy.deepcopy(deployment))
    old = await eventually(lambda: ready_pods(kube, "web", 2), timeout=30)
    old_names = {p["metadata"]["name"] for p in old}

    seen = {"min_ready": 2, "max_live": 2}

    async def watch() -> None:
        while True:
            pods = [p for p in await pods_of(kube, "web") if not is_deleting(p)]
            seen["min_ready"] = min(seen["min_ready"], sum(is_ready(p) for p in pods))
            seen["max_live"] = max(seen["max_live"], len(pods))
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        template = deployment["spec"]["template"]
        template["spec"]["containers"][0]["env"][0]["value"] = "v2"
        await kube.patch("Deployment", "default", "web", {"spec": {"template": template}})

        async def rolled() -> list[dict] | None:
            pods = await ready_pods(kube, "web", 2)
            if pods and not old_names & {p["metadata"]["name"] for p in pods}:
                return pods
            return None

        new = await eventually(rolled, timeout=60)
    finally:
        watcher.cancel()
    # maxUnavailable 0: never fewer than 2 ready pods; maxSurge 1: never more than 3 pods.
    assert seen["min_ready"] == 2 and seen["max_live"] == 3, seen
    for pod in new:
        assert (await fetch(f"{pod['status']['podIP']}:8080")).startswith("v2 from ")

    async def status_done() -> dict | None:
        current = await kube.get("Deployment", "default", "web")
        status = (current or {}).get("status") or {}
        done = status.get("updatedReplicas") == status.get("readyReplicas") == 2
        return current if done and status.get("replicas") == 2 else None

    current = await eventually(status_done)
    assert current["status"]["observedGeneration"] == current["metadata"]["generation"] == 2


async def test_scaling_up_and_down_follows_spec_replicas(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await kube.create("Deployment", "default", web_deployment("web", replicas=1))
    await eventually(lambda: ready_pods(kube, "web", 1), timeout=30)
    # Up through the scale subresource, as the HPA scales; down through spec.replicas.
    await kube.patch("Deployment", "default", "web", {"spec": {"replicas": 3}}, "scale")
    pods = await eventually(lambda: ready_pods(kube, "web", 3), timeout=30)
    assert len({p["status"]["podIP"] for p in pods}) == 3
    await kube.patch("Deployment", "default", "web", {"spec": {"replicas": 1}})
    await eventually(lambda: ready_pods(kube, "web", 1), timeout=30)


async def test_pods_requesting_one_cpu_get_distinct_cores(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: nothing to spread")
    await kube.create("Deployment", "default", web_deployment("web", replicas=2, cpu="1"))
    pods = await eventually(lambda: ready_pods(kube, "web", 2), timeout=30)
    sets = [await fetch(f"{p['status']['podIP']}:8080", "/cpus") for p in pods]
    first, second = (set(json.loads(text)) for text in sets)  # "[0]", "[1]"
    assert len(first) == len(second) == 1 and not first & second, sets


async def test_recreate_stops_the_old_pod_before_starting_the_new_one(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    deployment = web_deployment("web", replicas=1)
    deployment["spec"]["strategy"] = {"type": "Recreate"}
    await kube.create("Deployment", "default", copy.deepcopy(deployment))
    (old,) = await eventually(lambda: ready_pods(kube, "web", 1), timeout=30)
    most = {"pods": 1}

    async def watch() -> None:
        while True:
            most["pods"] = max(most["pods"], len(await pods_of(kube, "web")))
            await asyncio.sleep(0.05)

    watcher = asyncio.ensure_future(watch())
    try:
        template = deployment["spec"]["template"]
        template["spec"]["containers"][0]["env"][0]["value"] = "v2"
        await kube.patch("Deployment", "default", "web", {"spec": {"template": template}})

        async def replaced() -> list[dict] | None:
            pods = await ready_pods(kube, "web", 1)
            return pods if pods and pods[0]["metadata"]["name"] != old["metadata"]["name"] \
                else None

        (new,) = await eventually(replaced, timeout=30)
    finally:
        watcher.cancel()
    assert most["pods"] == 1  # the old pod, terminating included, was gone first
    assert (await fetch(f"{new['status']['podIP']}:8080")).startswith("v2 from ")
