"""Pieces shared by the render functions: metadata, security contexts, GPU placement."""

from __future__ import annotations

from typing import Any

from voxfleet_operator.names import common_labels
from voxfleet_operator.pools import Pool

# The Triton image runs as this non-root user (the official image's `triton-server` user).
RUN_AS_USER = 1000

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


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


def gpu_node_selector(pool: Pool) -> dict[str, str]:
    """The pool's selector plus the GPU product, so engines run where they were built for."""
    return {**pool.node_selector, GPU_PRODUCT_LABEL: pool.gpu_product}


def gpu_resources(pool: Pool) -> dict[str, Any]:
    gpus = str(pool.gpus_per_pod)
    return {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": gpus},
        "limits": {"memory": "16Gi", "nvidia.com/gpu": gpus},
    }
