"""Small real workloads for the node agent's tests."""

from __future__ import annotations

from typing import Any

import aiohttp
from cluster.kube import Kube
from cluster.objects import is_deleting, is_ready

Obj = dict[str, Any]


def web_deployment(
    name: str, replicas: int | None = 1, message: str = "v1", cpu: str | None = None
) -> Obj:
    """`python -m http.server` serving "<message> from <pod name>" at / and the process's CPU
    set at /cpus, with an httpGet readiness probe on a named port."""
    script = (
        'mkdir -p /srv/site && echo "$(MESSAGE) from $(POD_NAME)" > /srv/site/index.html && '
        "python -c 'import os; print(sorted(os.sched_getaffinity(0)))' > /srv/site/cpus && "
        "exec python -m http.server 8080 --directory /srv/site"
    )
    container: Obj = {
        "name": "web",
        "image": "python:3.11",
        "command": ["sh", "-c", script],
        "env": [
            {"name": "MESSAGE", "value": message},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        ],
        "ports": [{"name": "http", "containerPort": 8080}],
        "readinessProbe": {"httpGet": {"path": "/", "port": "http"}, "periodSeconds": 1},
        "volumeMounts": [{"name": "site", "mountPath": "/srv"}],
    }
    if cpu is not None:
        container["resources"] = {"requests": {"cpu": cpu}}
    spec: Obj = {
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "terminationGracePeriodSeconds": 5,
                "containers": [container],
                "volumes": [{"name": "site", "emptyDir": {}}],
            },
        },
    }
    if replicas is not None:
        spec["replicas"] = replicas
    return {"metadata": {"name": name}, "spec": spec}


def claim(name: str) -> Obj:
    return {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }


async def pods_of(kube: Kube, ns: str, app: str) -> list[Obj]:
    items, _ = await kube.list("Pod", ns, label_selector=f"app={app}")
    return items


async def ready_pods(kube: Kube, ns: str, app: str, count: int) -> list[Obj] | None:
    """The app's pods when exactly `count` exist, none is being deleted and all are Ready."""
    pods = await pods_of(kube, ns, app)
    if len(pods) == count and all(is_ready(p) and not is_deleting(p) for p in pods):
        return pods
    return None


async def finished(kube: Kube, ns: str, name: str) -> Obj | None:
    pod = await kube.get("Pod", ns, name)
    phase = ((pod or {}).get("status") or {}).get("phase")
    return pod if phase in ("Succeeded", "Failed") else None


async def fetch(address: str, path: str = "/") -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"http://{address}{path}", timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        return (await response.text()).strip()
