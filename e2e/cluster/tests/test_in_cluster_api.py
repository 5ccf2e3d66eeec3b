"""Pods reach the API server in-cluster, as rendered workloads do: kopf's service-account
login (https://kubernetes.default.svc, the mounted token and ca.crt) verifies the server's
certificate and reads the pod's own object."""

from __future__ import annotations

from cluster import LocalCluster
from cluster.api import KubeApi
from cluster.waiting import eventually

CLIENT = """
import json, ssl, urllib.request, kopf
info = kopf.login_with_service_account(settings=kopf.OperatorSettings())
assert info.server == "https://kubernetes.default.svc", info.server
context = ssl.create_default_context(cafile=info.ca_path)
request = urllib.request.Request(
    f"{info.server}/api/v1/namespaces/{info.default_namespace}/pods/$(POD_NAME)",
    headers={"Authorization": f"Bearer {info.token}"},
)
pod = json.load(urllib.request.urlopen(request, context=context, timeout=10))
print("I am", pod["metadata"]["name"], "on", pod["status"]["podIP"])
"""


async def test_a_pod_logs_in_with_its_service_account(
    kube: KubeApi, cluster: LocalCluster
) -> None:
    await kube.create("Pod", "default", {
        "metadata": {"name": "client"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": "python:3.11",
                "command": ["python", "-c", CLIENT],
                "env": [{"name": "POD_NAME",
                         "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            }],
        },
    })

    async def finished() -> dict | None:
        pod = await kube.get("Pod", "default", "client")
        phase = ((pod or {}).get("status") or {}).get("phase")
        return pod if phase in ("Succeeded", "Failed") else None

    pod = await eventually(finished, timeout=60)
    output = cluster.logs("client", "main")
    assert pod["status"]["phase"] == "Succeeded", output
    assert f"I am client on {pod['status']['podIP']}" in output
