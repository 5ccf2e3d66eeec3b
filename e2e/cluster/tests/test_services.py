"""Services: a proxy per port spreading connections over the ready pods of the selector."""

from __future__ import annotations

import aiohttp
from cluster import LocalCluster
from cluster.api import KubeApi
from cluster.waiting import eventually
from workloads import fetch, ready_pods, web_deployment


def service(name: str, headless: bool = False) -> dict:
    spec: dict = {"selector": {"app": "web"},
                  "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    if headless:
        spec["clusterIP"] = "None"
    return {"metadata": {"name": name}, "spec": spec}


async def test_a_service_spreads_connections_over_its_ready_pods(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await kube.create("Service", "default", service("web"))
    await kube.create("Deployment", "default", web_deployment("web", replicas=2))
    pods = await eventually(lambda: ready_pods(kube, "web", 2), timeout=30)
    names = {p["metadata"]["name"] for p in pods}
    address = cluster.resolve("web.default.svc:80")
    assert address.startswith("127.") and address.endswith(":80")
    assert cluster.resolve("web.default.svc.cluster.local:80") == address

    async def answers(count: int) -> set[str]:
        """Who answers `count` new connections; endpoints follow pods within a round, as
        they do in Kubernetes, so a connection refused meanwhile is retried."""
        try:
            return {(await fetch(address)).split(" from ")[1] for _ in range(count)}
        except aiohttp.ClientError:
            return set()

    async def both_serve() -> bool:
        return await answers(4) == names

    await eventually(both_serve, timeout=10)

    # A pod being deleted leaves the Service at once; its replacement joins when Ready.
    gone = sorted(names)[0]
    await kube.delete("Pod", "default", gone)

    async def without_deleted() -> set[str] | None:
        seen = await answers(6)
        return seen if gone not in seen and len(seen) == 2 else None

    seen = await eventually(without_deleted, timeout=30)
    assert sorted(names)[1] in seen


async def test_a_headless_service_resolves_to_a_pod_ip(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await kube.create("Service", "default", service("web-pods", headless=True))
    await kube.create("Deployment", "default", web_deployment("web", replicas=1))
    pods = await eventually(lambda: ready_pods(kube, "web", 1), timeout=30)

    async def resolved() -> str | None:
        try:
            return cluster.resolve("web-pods.default.svc:80")
        except LookupError:
            return None

    address = await eventually(resolved)
    assert address == f"{pods[0]['status']['podIP']}:8080"
    assert cluster.endpoints("default", "web-pods", 80) == [address]
    assert (await fetch(address)).endswith(pods[0]["metadata"]["name"])


CLIENT = """
import sys, time, urllib.request
deadline = time.time() + 20
for url in sys.argv[1:]:
    while True:
        try:
            print(url, urllib.request.urlopen(url, timeout=2).read().decode().strip(), flush=True)
            break
        except OSError as error:
            if time.time() > deadline:
                raise SystemExit(f"{url}: {error}")
            time.sleep(0.2)
"""


async def test_pods_reach_services_by_name(kube: KubeApi, cluster: LocalCluster) -> None:
    await kube.create("Deployment", "default", web_deployment("web", replicas=1))
    (server,) = await eventually(lambda: ready_pods(kube, "web", 1), timeout=30)
    # The client starts before the Services exist: its /etc/hosts follows them.
    urls = ["http://web/", "http://web.default.svc.cluster.local:80/",
            "http://web-pods.default.svc:8080/"]
    await kube.create("Pod", "default", {
        "metadata": {"name": "client"},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "python:3.11",
            "command": ["python", "-c", CLIENT, *urls]}]},
    })
    await kube.create("Service", "default", service("web"))
    await kube.create("Service", "default", service("web-pods", headless=True))

    async def finished() -> dict | None:
        pod = await kube.get("Pod", "default", "client")
        phase = ((pod or {}).get("status") or {}).get("phase")
        return pod if phase in ("Succeeded", "Failed") else None

    pod = await eventually(finished, timeout=40)
    output = cluster.logs("client", "main")
    assert pod["status"]["phase"] == "Succeeded", output
    for url in urls:
        assert f"{url} v1 from {server['metadata']['name']}" in output
    assert cluster.cluster_ip("default", "web") is not None
    assert cluster.cluster_ip("default", "web-pods") is None  # headless
