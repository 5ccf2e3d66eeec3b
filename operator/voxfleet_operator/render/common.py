"""Pieces shared by the render functions: metadata, security contexts, GPU placement."""

from __future__ import annotations

import re
from typing import Any

from voxfleet_operator.names import common_labels
from voxfleet_operator.pools import Pool

# The Triton image runs as this non-root user (the official image's `triton-server` user).
RUN_AS_USER = 1000

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"


def metadata(
    name: str, namespace: str, component: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**common_labels(component), **(labels or {})},
    }


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_USER,
        "runAsGroup": RUN_AS_USER,
        "fsGroup": RUN_AS_USER,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pool_node_selector(pool: Pool) -> dict[str, str]:
    """The pool's selector, plus the GPU product on a GPU pool: engines run where they were
    built for. A CPU pool's pods go wherever its own selector allows."""
    if not pool.needs_gpu:
        return dict(pool.node_selector)
    return {**pool.node_selector, GPU_PRODUCT_LABEL: pool.gpu_product}


def _doubled(quantity: str) -> str:
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity)
    return f"{int(match.group(1)) * 2}{match.group(2)}" if match else quantity


def pool_resources(pool: Pool) -> dict[str, Any]:
    """A pool pod's requests and limits: GPUs only on a GPU pool; memory limited to twice the
    request (a CPU limit would throttle streams; the CPU request reserves the cores)."""
    requests: dict[str, str] = {"cpu": pool.cpu_request, "memory": pool.memory_request}
    limits: dict[str, str] = {"memory": _doubled(pool.memory_request)}
    if pool.needs_gpu:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(pool.gpus_per_pod)
    return {"requests": requests, "limits": limits}
