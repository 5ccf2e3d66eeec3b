"""Pool pods as Kubernetes objects, for driving the autoscaling loop without a cluster.

A local Triton process (`voxfleet serve`) stands for one pod of the operator-rendered pool
Deployment: the same labels and named container ports, at its loopback address, with the
status the kubelet would report.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxfleet_operator.names import pool_selector

STARTED = "2026-01-01T00:00:00Z"


def pool_pod(
    name: str,
    namespace: str,
    pool: str,
    metrics_port: int,
    http_port: int = 8000,
    grpc_port: int = 8001,
    ip: str = "127.0.0.1",
    ready: bool = True,
    phase: str = "Running",
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**pool_selector(pool), **(labels or {})},
        },
        "spec": {
            "containers": [
                {
                    "name": "triton",
                    "ports": [
                        {"name": "grpc", "containerPort": grpc_port},
                        {"name": "http", "containerPort": http_port},
                        {"name": "metrics", "containerPort": metrics_port},
                    ],
                }
            ]
        },
        "status": {
            "phase": phase,
            "podIP": ip,
            "startTime": STARTED,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True" if ready else "False",
                    "lastTransitionTime": STARTED,
                }
            ],
        },
    }
