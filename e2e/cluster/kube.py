"""The suite's own access to the API server (the claims provisioner's, the operator tests'):
the official Python client's asyncio variant (`kubernetes.aio`), with objects as plain dicts.

`Kube` sends requests through `kubernetes.aio.client.ApiClient` (its TLS, its credentials
from a kubeconfig, its Retry-After handling) to paths built from `RESOURCES`, and answers
JSON as dicts. `Informer` keeps a dict of the objects
of one list (with a label or field selector) up to date with a watch, as client-go's
informers do: it lists, watches from the list's resourceVersion, resumes after the server
ends the watch, and lists again when the server answers 410 Gone (the resourceVersion has
been compacted away).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes.aio import client as aio_client
from kubernetes.aio import config as aio_config
from kubernetes.aio.client.exceptions import ApiException

Obj = dict[str, Any]
log = logging.getLogger("cluster.kube")

# kind -> (apiVersion, plural, namespaced)
RESOURCES: dict[str, tuple[str, str, bool]] = {
    "Pod": ("v1", "pods", True),
    "Node": ("v1", "nodes", False),
    "Service": ("v1", "services", True),
    "Secret": ("v1", "secrets", True),
    "ConfigMap": ("v1", "configmaps", True),
    "ServiceAccount": ("v1", "serviceaccounts", True),
    "PersistentVolumeClaim": ("v1", "persistentvolumeclaims", True),
    "PersistentVolume": ("v1", "persistentvolumes", False),
    "Event": ("v1", "events", True),
    "EndpointSlice": ("discovery.k8s.io/v1", "endpointslices", True),
    "Lease": ("coordination.k8s.io/v1", "leases", True),
    "Deployment": ("apps/v1", "deployments", True),
    "Job": ("batch/v1", "jobs", True),
}
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        reason = body
        with contextlib.suppress(ValueError, AttributeError):
            reason = json.loads(body).get("message", body)
        super().__init__(f"{method} {path}: {status} {reason[:400]}")
        self.status = status


def resource_path(
    kind: str, namespace: str | None = None, name: str | None = None, subresource: str = ""
) -> str:
    version, plural, namespaced = RESOURCES[kind]
    base = f"/api/{version}" if version == "v1" else f"/apis/{version}"
    if namespaced and namespace:
        base += f"/namespaces/{quote(namespace)}"
    path = f"{base}/{plural}"
    if name:
        path += f"/{quote(name)}"
    if subresource:
        path += f"/{subresource}"
    return path


class Kube:
    """Typed verbs over one API server and identity; 404 on reads is `None` or `[]`."""

    def __init__(self, api: aio_client.ApiClient) -> None:
        self.api = api

    @classmethod
    async def connect(cls, kubeconfig: Path) -> Kube:
        configuration = aio_client.Configuration()
        await aio_config.load_kube_config(
            config_file=str(kubeconfig),
            client_configuration=configuration,
            persist_config=False,
        )
        return cls(aio_client.ApiClient(configuration))

    async def close(self) -> None:
        await self.api.close()

    async def _send(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "",
        timeout: float | None = 30,
    ) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        request = await self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return await self.api.call_api(*request, _request_timeout=timeout)
        except ApiException as error:
            raise ApiError(method, path, int(error.status or 0), str(error.body or "")) from None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, Any] | None = None,
        content_type: str = "",
    ) -> Any:
        response = await self._send(method, path, body, query, content_type)
        data = await response.read()
        if not 200 <= response.status < 300:
            raise ApiError(method, path, response.status, data.decode(errors="replace"))
        return json.loads(data) if data else None

    async def get(self, kind: str, namespace: str | None, name: str) -> Obj | None:
        try:
            result: Obj = await self.call("GET", resource_path(kind, namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return result

    async def list(
        self,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> tuple[list[Obj], str]:
        """(items, the list's resourceVersion)."""
        query = _selectors(label_selector, field_selector)
        data = await self.call("GET", resource_path(kind, namespace), query=query)
        return list(data.get("items") or []), str(data["metadata"].get("resourceVersion", ""))

    async def create(
        self,
        kind: str,
        namespace: str | None,
        obj: Obj,
        subresource: str = "",
        name: str | None = None,
    ) -> Obj:
        version, _, namespaced = RESOURCES[kind]
        if not subresource:
            obj.setdefault("apiVersion", version)
            obj.setdefault("kind", kind)
            if namespaced and namespace:
                obj.setdefault("metadata", {})["namespace"] = namespace
        result: Obj = await self.call(
            "POST", resource_path(kind, namespace, name, subresource), obj
        )
        return result

    async def patch(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        patch: Obj,
        subresource: str = "",
        content_type: str = MERGE_PATCH,
    ) -> Obj | None:
        try:
            result: Obj = await self.call(
                "PATCH",
                resource_path(kind, namespace, name, subresource),
                patch,
                content_type=content_type,
            )
        except ApiError as error:
            if error.status == 404:  # gone meanwhile: nothing left to update
                return None
            raise
        return result

    async def replace(self, kind: str, namespace: str | None, name: str, obj: Obj) -> Obj:
        result: Obj = await self.call("PUT", resource_path(kind, namespace, name), obj)
        return result

    async def delete(
        self, kind: str, namespace: str | None, name: str, options: Obj | None = None
    ) -> bool:
        body = {"apiVersion": "v1", "kind": "DeleteOptions", **(options or {})}
        try:
            await self.call("DELETE", resource_path(kind, namespace, name), body)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def watch(
        self,
        kind: str,
        namespace: str | None,
        resource_version: str,
        *,
        label_selector: str = "",
        field_selector: str = "",
        timeout_s: int = 300,
    ) -> Any:
        """The events of one watch request, as dicts, until the server ends it. A 410 Gone
        (in the response or as an ERROR event) raises `ApiError` with status 410."""
        query: dict[str, Any] = _selectors(label_selector, field_selector)
        query.update(
            watch="true",
            resourceVersion=resource_version,
            allowWatchBookmarks="true",
            timeoutSeconds=timeout_s,
        )
        path = resource_path(kind, namespace)
        response = await self._send("GET", path, query=query, timeout=timeout_s + 30)
        try:
            if not 200 <= response.status < 300:
                data = await response.read()
                raise ApiError("WATCH", path, response.status, data.decode(errors="replace"))
            while line := await response.response.content.readline():
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    status = event.get("object") or {}
                    raise ApiError(
                        "WATCH", path, int(status.get("code") or 500), json.dumps(status)
                    )
                yield event
        finally:
            response.response.release()


def _selectors(label_selector: str, field_selector: str) -> dict[str, Any]:
    query = {"labelSelector": label_selector, "fieldSelector": field_selector}
    return {k: v for k, v in query.items() if v}


class Informer:
    """A list of `kind` (namespace, selectors) kept current by a watch; `on_change()` is
    called after every change. `objects` maps "namespace/name" to the object."""

    def __init__(
        self,
        kube: Kube,
        kind: str,
        namespace: str | None = None,
        on_change: Callable[[], None] = lambda: None,
        *,
        label_selector: str = "",
        field_selector: str = "",
    ) -> None:
        self.kube = kube
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.on_change = on_change
        self.objects: dict[str, Obj] = {}
        self.synced = asyncio.Event()
        self.relists = 0  # lists after the first: each follows a 410 Gone or an error
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def items(self) -> list[Obj]:
        return list(self.objects.values())

    @staticmethod
    def key(obj: Obj) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace') or ''}/{meta['name']}"

    async def _run(self) -> None:
        first = True
        while True:
            try:
                items, version = await self.kube.list(
                    self.kind,
                    self.namespace,
                    label_selector=self.label_selector,
                    field_selector=self.field_selector,
                )
                self.objects = {self.key(item): item for item in items}
                if not first:
                    self.relists += 1
                first = False
                self.synced.set()
                self.on_change()
                while True:  # watch, and resume where the last watch ended
                    async for event in self.kube.watch(
                        self.kind,
                        self.namespace,
                        version,
                        label_selector=self.label_selector,
                        field_selector=self.field_selector,
                    ):
                        obj = event["object"]
                        version = obj["metadata"].get("resourceVersion") or version
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            self.objects.pop(self.key(obj), None)
                        else:
                            self.objects[self.key(obj)] = obj
                        self.on_change()
            except ApiError as error:
                if error.status != 410:
                    log.warning("watching %s: %s", self.kind, error)
                    await asyncio.sleep(1.0)
            except (OSError, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
                log.warning("watching %s: %r", self.kind, error)
                await asyncio.sleep(1.0)
