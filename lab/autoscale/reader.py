"""The experiment's frequent reads of the API, in this process.

The autoscaling watch reads the HPAs every second and the sampler reads the pool's pods, its
Deployment and the TTSVoices every few seconds. Through `kubectl` each read is a process of
its own, about 70 ms of CPU: in a `pool_shared` run on the real node, 2,907 of them took 212
CPU-seconds, a quarter of a core of the 2-core machine whose pods the experiment measures
(process accounting, docs/autoscaling.md). `ApiReader` makes those reads over one client of
the official Kubernetes library; whatever else it is asked goes to kubectl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from e2e_support import Kubectl

# kubectl's name of a kind -> (API group path, plural).
KINDS = {
    "pod": ("/api/v1", "pods"),
    "pods": ("/api/v1", "pods"),
    "services": ("/api/v1", "services"),
    "deployment": ("/apis/apps/v1", "deployments"),
    "deployments": ("/apis/apps/v1", "deployments"),
    "horizontalpodautoscalers": ("/apis/autoscaling/v2", "horizontalpodautoscalers"),
    "ttsv": ("/apis/voxfleet.io/v1alpha1", "ttsvoices"),
}


class ApiReader:
    """`get` and `items` as `Kubectl` has them (the autoscaling watch's `KubectlLike`), for
    the kinds in KINDS in `kubectl`'s namespace; other reads go to `kubectl`."""

    def __init__(self, kubectl: Kubectl) -> None:
        from kubernetes import config

        self.kubectl = kubectl
        self.namespace = kubectl.namespace
        self._client = config.new_client_from_config(config_file=str(Path(kubectl.kubeconfig)))

    def _read(self, path: str, query: list[tuple[str, str]] | None = None) -> Any:
        """GET `path` as JSON; None where it is not found."""
        request = self._client.param_serialize(
            method="GET",
            resource_path=path,
            query_params=query or [],
            header_params={"Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        response = self._client.call_api(*request)
        data = response.read()
        if response.status == 404:
            return None
        if not 200 <= response.status < 300:
            raise RuntimeError(f"GET {path}: {response.status} {response.reason}: {data[:300]!r}")
        return json.loads(data)

    def get(self, *args: str) -> Any:
        """`kubectl get KIND [NAME] -o json`; None where the object does not exist."""
        if not 1 <= len(args) <= 2 or args[0] not in KINDS:
            return self.kubectl.get(*args)
        group, plural = KINDS[args[0]]
        path = f"{group}/namespaces/{self.namespace}/{plural}"
        return self._read(f"{path}/{args[1]}" if len(args) == 2 else path)

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        if kind not in KINDS:
            return self.kubectl.items(kind, selector)
        group, plural = KINDS[kind]
        listing = self._read(
            f"{group}/namespaces/{self.namespace}/{plural}",
            [("labelSelector", selector)] if selector else None,
        )
        return list(listing["items"]) if listing else []
