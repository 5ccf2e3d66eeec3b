"""A pod's configuration: env from Secrets, ConfigMaps and fields, `$(VAR)` expansion, files
from Secrets, and a pod that waits for a missing Secret."""

from __future__ import annotations

import base64

from cluster.kube import Kube
from cluster.objects import is_ready
from cluster.waiting import eventually
from workloads import fetch


def configured_pod() -> dict:
    script = (
        'mkdir -p /srv && echo "$(GREETING) $(TARGET) key=$(KEY) ns=$(NS) ip=$(IP) '
        'file=$(cat /etc/app/key) host=$(hostname)" > /srv/index.html && '
        "exec python -m http.server 8080 --directory /srv"
    )
    return {
        "metadata": {"name": "configured", "labels": {"app": "configured"}},
        "spec": {
            "containers": [
                {
                    "name": "main",
                    "image": "python:3.11",
                    "command": ["sh", "-c"],
                    "args": [script],
                    "envFrom": [{"configMapRef": {"name": "settings"}}],
                    "env": [
                        {"name": "TARGET", "value": "$(WHO)!"},  # WHO comes from envFrom
                        {
                            "name": "KEY",
                            "valueFrom": {"secretKeyRef": {"name": "app-key", "key": "key"}},
                        },
                        {
                            "name": "NS",
                            "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                        },
                        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    ],
                    "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
                    "volumeMounts": [
                        {"name": "key", "mountPath": "/etc/app"},
                        {"name": "srv", "mountPath": "/srv"},
                    ],
                }
            ],
            "volumes": [
                {"name": "key", "secret": {"secretName": "app-key"}},
                {"name": "srv", "emptyDir": {}},
            ],
        },
    }


async def test_a_pod_waits_for_its_secret_then_runs_with_its_configuration(
    kube: Kube, ns: str
) -> None:
    await kube.create(
        "ConfigMap",
        ns,
        {"metadata": {"name": "settings"}, "data": {"GREETING": "hello", "WHO": "world"}},
    )
    await kube.create("Pod", ns, configured_pod())

    async def waiting() -> dict | None:
        pod = await kube.get("Pod", ns, "configured")
        statuses = ((pod or {}).get("status") or {}).get("containerStatuses") or [{}]
        reason = (statuses[0].get("state") or {}).get("waiting", {}).get("reason")
        return statuses[0] if reason == "CreateContainerConfigError" else None

    status = await eventually(waiting, timeout=60)
    assert status["state"]["waiting"]["message"] == 'secret "app-key" not found'

    await kube.create(
        "Secret",
        ns,
        {"metadata": {"name": "app-key"}, "data": {"key": base64.b64encode(b"k-42").decode()}},
    )

    async def ready() -> dict | None:
        pod = await kube.get("Pod", ns, "configured")
        return pod if pod and is_ready(pod) else None

    pod = await eventually(ready, timeout=30)
    ip = pod["status"]["podIP"]
    assert await fetch(f"{ip}:8080") == (
        f"hello world! key=k-42 ns={ns} ip={ip} file=k-42 host=configured"
    )
