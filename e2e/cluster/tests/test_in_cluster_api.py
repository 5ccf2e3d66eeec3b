"""Pods reach the API server in-cluster, as rendered workloads do: kopf's service-account
login (https://kubernetes.default.svc, the token the TokenRequest API issued for the pod and
the kube-root-ca.crt the controller manager publishes) verifies the server's certificate,
and RBAC decides what the pod's ServiceAccount may read."""

from __future__ import annotations

from cluster import LocalCluster
from cluster.kube import Kube
from cluster.waiting import eventually
from workloads import finished

CLIENT = """
import json, ssl, urllib.error, urllib.request, kopf
info = kopf.login_with_service_account(settings=kopf.OperatorSettings())
assert info.server.startswith("https://"), info.server
context = ssl.create_default_context(cafile=info.ca_path)

def get(path):
    request = urllib.request.Request(f"https://kubernetes.default.svc{path}",
                                     headers={"Authorization": f"Bearer {info.token}"})
    try:
        return json.load(urllib.request.urlopen(request, context=context, timeout=10))
    except urllib.error.HTTPError as error:
        return {"code": error.code}

pod = get(f"/api/v1/namespaces/{info.default_namespace}/pods/$(POD_NAME)")
print("I am", pod["metadata"]["name"], "on", pod["status"]["podIP"])
print("secrets:", get(f"/api/v1/namespaces/{info.default_namespace}/secrets").get("code"))
"""


async def test_a_pod_logs_in_with_its_service_account(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    await kube.call(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}],
        },
    )
    await kube.call(
        "POST",
        f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "pod-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
        },
    )
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
                        "command": ["python", "-c", CLIENT],
                        "env": [
                            {
                                "name": "POD_NAME",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                            }
                        ],
                    }
                ],
            },
        },
    )
    pod = await eventually(lambda: finished(kube, ns, "client"), timeout=60)
    output = cluster.logs("client", "main")
    assert pod["status"]["phase"] == "Succeeded", output
    assert f"I am client on {pod['status']['podIP']}" in output
    assert "secrets: 403" in output  # RBAC: the Role grants pods, not secrets
