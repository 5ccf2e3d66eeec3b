"""The Service proxy follows the real EndpointSlices: connections spread over ready pods, a
pod being deleted leaves at once, headless Services resolve to pods, and pods reach
Services by name."""

from __future__ import annotations

import aiohttp
from cluster import LocalCluster
from cluster.kube import Kube
from cluster.waiting import eventually
from workloads import fetch, finished, ready_pods, web_deployment


def service(name: str, headless: bool = False) -> dict:
    spec: dict = {
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
    }
    if headless:
        spec["clusterIP"] = "None"
    return {"metadata": {"name": name}, "spec": spec}


async def test_a_service_spreads_connections_over_its_ready_pods(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    created = await kube.create("Service", ns, service("web"))
    await kube.create("Deployment", ns, web_deployment("web", replicas=2))
    pods = await eventually(lambda: ready_pods(kube, ns, "web", 2), timeout=60)
    names = {p["metadata"]["name"] for p in pods}
    address = cluster.resolve(f"web.{ns}.svc:80")
    assert address == f"{created['spec']['clusterIP']}:80"  # the API server's allocation
    assert cluster.resolve(f"web.{ns}.svc.cluster.local:80") == address

    async def answers(count: int) -> set[str]:
        """Who answers `count` new connections; endpoints follow pods through the
        EndpointSlices, asynchronously, so a connection refused meanwhile is retried."""
        try:
            return {(await fetch(address)).split(" from ")[1] for _ in range(count)}
        except aiohttp.ClientError:
            return set()

    async def both_serve() -> bool:
        return await answers(4) == names

    await eventually(both_serve, timeout=30)

    # A pod being deleted leaves the Service at once; its replacement joins when Ready.
    gone = sorted(names)[0]
    await kube.delete("Pod", ns, gone)

    async def without_deleted() -> set[str] | None:
        seen = await answers(6)
        return seen if gone not in seen and len(seen) == 2 else None

    seen = await eventually(without_deleted, timeout=60)
    assert sorted(names)[1] in seen


async def test_a_headless_service_resolves_to_a_pod_ip(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    await kube.create("Service", ns, service("web-pods", headless=True))
    await kube.create("Deployment", ns, web_deployment("web", replicas=1))
    pods = await eventually(lambda: ready_pods(kube, ns, "web", 1), timeout=60)

    async def resolved() -> str | None:
        try:
            return cluster.resolve(f"web-pods.{ns}.svc:80")
        except LookupError:
            return None

    address = await eventually(resolved, timeout=30)
    assert address == f"{pods[0]['status']['podIP']}:8080"
    assert cluster.endpoints(ns, "web-pods", 80) == [address]
    assert (await fetch(address)).endswith(pods[0]["metadata"]["name"])


CLIENT = """
import sys, time, urllib.request
deadline = time.time() + 30
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


async def test_pods_reach_services_by_name(kube: Kube, ns: str, cluster: LocalCluster) -> None:
    await kube.create("Deployment", ns, web_deployment("web", replicas=1))
    (server,) = await eventually(lambda: ready_pods(kube, ns, "web", 1), timeout=60)
    # The client starts before the Services exist: its /etc/hosts follows them.
    urls = [
        "http://web/",
        f"http://web.{ns}.svc.cluster.local:80/",
        f"http://web-pods.{ns}.svc:8080/",
    ]
    await kube.create(
        "Pod",
        ns,
        {
            "metadata": {"name": "client"},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": "python:3.11",
                        "command": ["python", "-c", CLIENT, *urls],
                    }
                ],
            },
        },
    )
    await kube.create("Service", ns, service("web"))
    await kube.create("Service", ns, service("web-pods", headless=True))
    pod = await eventually(lambda: finished(kube, ns, "client"), timeout=60)
    output = cluster.logs("client", "main")
    assert pod["status"]["phase"] == "Succeeded", output
    for url in urls:
        assert f"{url} v1 from {server['metadata']['name']}" in output
