"""Pods of a Deployment run as real processes with their own IP, probes and status."""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
from cluster import LocalCluster
from cluster.api import KubeApi
from cluster.waiting import eventually
from workloads import pods_of, web_deployment


async def test_a_deployment_pod_serves_on_its_own_ip(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    # No spec.replicas: one pod, as the API server defaults it.
    await kube.create("Deployment", "default", web_deployment("web", replicas=None))

    async def ready_pod() -> dict | None:
        pods = await pods_of(kube, "web")
        ready = [p for p in pods if any(c["type"] == "Ready" and c["status"] == "True"
                                        for c in (p.get("status") or {}).get("conditions", []))]
        return ready[0] if len(pods) == 1 and ready else None

    pod = await eventually(ready_pod)
    name = pod["metadata"]["name"]
    assert name.startswith("web-") and pod["metadata"]["labels"]["pod-template-hash"] in name
    status = pod["status"]
    assert status["phase"] == "Running"
    assert status["podIP"].startswith("10.213.")
    assert status["containerStatuses"][0]["ready"] is True
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://{status['podIP']}:8080/index.html") as response:
            assert (await response.text()).strip() == f"v1 from {name}"

    async def deployment_status() -> dict | None:
        deployment = await kube.get("Deployment", "default", "web")
        status = (deployment or {}).get("status") or {}
        return status if status.get("readyReplicas") == 1 else None

    status = await eventually(deployment_status)
    assert status["replicas"] == status["updatedReplicas"] == status["availableReplicas"] == 1
    # The emptyDir at /srv is the pod's own: the host's /srv has no such file.
    assert not os.path.exists("/srv/site/index.html")


async def test_a_volume_above_the_image_files_leaves_them_in_place(
    api: tuple[KubeApi, str], tmp_path: Path
) -> None:
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
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", f"{hello} > /events/said"],
                "volumeMounts": [{"name": "events", "mountPath": "/events"},
                                 {"name": "scratch", "mountPath": str(covered)}],
            }],
            "volumes": [{"name": "events", "persistentVolumeClaim": {"claimName": "events"}},
                        {"name": "scratch", "emptyDir": {}}],
        },
    }
    kube = api[0]
    workdir = tmp_path / "cluster"
    async with LocalCluster(api[1], workdir, tick_s=0.1, image_paths=[str(image)]):
        await kube.create("Pod", "default", pod)

        async def finished() -> str | None:
            current = await kube.get("Pod", "default", "hello")
            phase = ((current or {}).get("status") or {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = await eventually(finished, timeout=30)
    events = workdir / "claims" / "default" / "events"
    assert phase == "Succeeded", (workdir / "logs" / "hello_main.log").read_text()
    assert (events / "said").read_text() == "from the image\n"
    assert (events / "listing").read_text().split() == ["project"]  # not the host's file
