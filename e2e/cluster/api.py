"""A small asynchronous Kubernetes API client: what a kubelet and controllers need, over HTTP.

It speaks to any API server URL (the KMock emulator here, a kube-apiserver elsewhere) with
JSON merge patches, as controllers that own their objects do.
"""

from __future__ import annotations

from typing import Any

import aiohttp

# kind -> (group/version, plural): the resources the local cluster reads and writes.
RESOURCES: dict[str, tuple[str, str]] = {
    "Pod": ("v1", "pods"),
    "Service": ("v1", "services"),
    "Secret": ("v1", "secrets"),
    "ConfigMap": ("v1", "configmaps"),
    "Deployment": ("apps/v1", "deployments"),
    "Job": ("batch/v1", "jobs"),
}

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        super().__init__(f"{method} {path}: {status} {body[:300]}")
        self.status = status


def resource_path(kind: str, namespace: str | None = None, name: str | None = None) -> str:
    version, plural = RESOURCES[kind]
    base = f"/api/{version}" if version == "v1" else f"/apis/{version}"
    if namespace:
        base += f"/namespaces/{namespace}"
    return f"{base}/{plural}" + (f"/{name}" if name else "")


class KubeApi:
    """Typed verbs over one API server; 404 on reads is `None` or an empty list."""

    def __init__(self, session: aiohttp.ClientSession, url: str, token: str | None = None):
        self._session = session
        self._url = url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    async def _call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        headers = dict(self._headers)
        if body is not None:
            headers["Content-Type"] = content_type
        async with self._session.request(
            method, self._url + path, json=body, headers=headers
        ) as response:
            text = await response.text()
            if response.status >= 400:
                raise ApiError(method, path, response.status, text)
            return await response.json(content_type=None) if text else None

    async def list(self, kind: str, namespace: str | None = None) -> list[Obj]:
        try:
            data = await self._call("GET", resource_path(kind, namespace))
        except ApiError as error:
            if error.status == 404:  # a resource this server does not serve holds nothing
                return []
            raise
        return list((data or {}).get("items") or [])

    async def get(self, kind: str, namespace: str, name: str) -> Obj | None:
        try:
            result: Obj = await self._call("GET", resource_path(kind, namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    async def create(self, kind: str, namespace: str, obj: Obj) -> Obj:
        obj.setdefault("metadata", {})["namespace"] = namespace
        version, _ = RESOURCES[kind]
        obj.setdefault("apiVersion", version)
        obj.setdefault("kind", kind)
        result: Obj = await self._call("POST", resource_path(kind, namespace), obj)
        return result

    async def patch(
        self, kind: str, namespace: str, name: str, patch: Obj, subresource: str = ""
    ) -> Obj | None:
        path = resource_path(kind, namespace, name) + (f"/{subresource}" if subresource else "")
        try:
            result: Obj = await self._call("PATCH", path, patch, "application/merge-patch+json")
        except ApiError as error:
            if error.status == 404:  # gone meanwhile: nothing left to update
                return None
            raise
        return result

    async def delete(self, kind: str, namespace: str, name: str) -> None:
        try:
            await self._call("DELETE", resource_path(kind, namespace, name))
        except ApiError as error:
            if error.status != 404:
                raise
