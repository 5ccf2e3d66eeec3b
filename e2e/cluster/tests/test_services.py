"""Services: a proxy per port spreading connections over the ready pods of the selector."""

from __future__ import annotations

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

    async def both_serve() -> bool:
        answers = {(await fetch(address)).split(" from ")[1] for _ in range(4)}
        return answers == names

    await eventually(both_serve, timeout=10)

    # A pod being deleted leaves the Service at once; its replacement joins when Ready.
    gone = sorted(names)[0]
    await kube.delete("Pod", "default", gone)

    async def without_deleted() -> set[str] | None:
        answers = {(await fetch(address)).split(" from ")[1] for _ in range(6)}
        return answers if gone not in answers and len(answers) == 2 else None

    answers = await eventually(without_deleted, timeout=30)
    assert sorted(names)[1] in answers


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
    assert (await fetch(address)).endswith(pods[0]["metadata"]["name"])
