"""Objects that belong to one voice (its gRPC Service) or to its namespace (the key)."""

from __future__ import annotations

import base64
import secrets
from typing import Any

from voxfleet_operator.names import (
    GRPC_PORT,
    POOL_LABEL,
    REPOSITORY_KEY_SECRET,
    REPOSITORY_KEY_SECRET_KEY,
    VOICE_LABEL,
    pool_selector,
    serving_label,
    voice_service_name,
)
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import metadata


def build_voice_service(voice: str, namespace: str, pool: Pool) -> dict[str, Any]:
    """Selects the pool's pods that have the voice loaded (the operator labels them)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(
            voice_service_name(voice),
            namespace,
            "endpoint",
            {VOICE_LABEL: voice, POOL_LABEL: pool.name},
        ),
        "spec": {
            "type": "ClusterIP",
            "selector": {**pool_selector(pool.name), serving_label(voice): "true"},
            "ports": [
                {
                    "name": "grpc",
                    "port": GRPC_PORT,
                    "targetPort": "grpc",
                    "protocol": "TCP",
                    "appProtocol": "grpc",
                }
            ],
        },
    }


# 32 random bytes, URL-safe base64: it travels in an HTTP header and a command-line flag.
REPOSITORY_KEY_BYTES = 32


def new_repository_key() -> str:
    """A fresh random repository key (one per namespace)."""
    return secrets.token_urlsafe(REPOSITORY_KEY_BYTES)


def build_repository_key_secret(namespace: str, key: str) -> dict[str, Any]:
    """The namespace's repository key, read by its pool pods' args and by the operator."""
    # `data`, not `stringData`: the API server returns `data`, and drift is compared on it.
    encoded = base64.b64encode(key.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": metadata(REPOSITORY_KEY_SECRET, namespace, "repository-key"),
        "data": {REPOSITORY_KEY_SECRET_KEY: encoded},
    }
