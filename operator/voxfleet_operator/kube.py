"""The operator's client for its children: the official Kubernetes client's asyncio variant.

kopf talks to the API for the TTSVoice objects themselves; children (Jobs, Deployments,
Services, ...) go through `kubernetes.aio`'s `ApiClient` (its configuration loaders, TLS,
authentication and connection pool), addressed by path from `PLURALS`, as plain dicts. The
operator writes its children with server-side apply under the field manager
`voxfleet-operator` (`FIELD_MANAGER`), so that the API server records which fields are its.

Transient answers (HTTP 429 and 5xx, a refused or dropped connection) are retried a few
times with back-off, `Retry-After` honoured: the library's own retries leave out PATCH and
POST, nearly all the operator's writes. `ApiHealth` remembers an outage and probes the API
until it answers again, so that callers backing off can retry as soon as it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes.aio import client as kube_client
from kubernetes.aio import config as kube_config
from kubernetes.aio.client.exceptions import ApiException

logger = logging.getLogger(__name__)

FIELD_MANAGER = "voxfleet-operator"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CONFLICT_RETRIES = 5
# Delays before each retry of a transient failure inside one call; after the last, the call
# fails and the caller's own back-off (handlers.py) takes over.
TRANSIENT_RETRY_SECONDS = (0.2, 0.5, 1.0)
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# A Retry-After longer than this is cut short: the caller's back-off covers longer waits.
MAX_RETRY_AFTER_SECONDS = 10.0
PROBE_INTERVAL_SECONDS = 1.0
REQUEST_TIMEOUT_SECONDS = 30.0


class ApiError(Exception):
    def __init__(
        self, status: int, reason: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after


def is_transient(error: BaseException) -> bool:
    """Whether `error` says the API is unavailable for now, not that the request is wrong."""
    if isinstance(error, ApiError):
        return error.status in TRANSIENT_STATUSES
    return isinstance(error, (aiohttp.ClientConnectionError, asyncio.TimeoutError))


def retry_after_seconds(value: str | None) -> float | None:
    """`Retry-After` in seconds (the API server sends delta-seconds), capped; None if absent."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_SECONDS)


class ApiHealth:
    """Whether the API answers, learnt from every call, and a wake-up when it answers again.

    After a transient failure it is `down` and one probe task repeats a harmless request
    (a GET, or an empty merge patch where a write failed, since an outage can be of writes
    only) every `PROBE_INTERVAL_SECONDS` until the API answers it.
    """

    def __init__(self) -> None:
        self._up = asyncio.Event()
        self._up.set()
        self._probe: asyncio.Task[None] | None = None
        self.outages = 0

    @property
    def down(self) -> bool:
        return not self._up.is_set()

    def mark_up(self) -> None:
        self._up.set()

    def mark_down(self, probe: Callable[[], Awaitable[Any]]) -> None:
        if self._up.is_set():
            self.outages += 1
        self._up.clear()
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._run_probe(probe))

    async def _run_probe(self, probe: Callable[[], Awaitable[Any]]) -> None:
        while self.down:
            await asyncio.sleep(PROBE_INTERVAL_SECONDS)
            try:
                await probe()
            except ApiError as error:
                if error.status in TRANSIENT_STATUSES:
                    continue
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                continue
            except RuntimeError:  # the session was closed: the operator is stopping
                return
            self.mark_up()

    async def wait_up(self, timeout: float) -> bool:
        """Wait at most `timeout` s for the API to answer again; True when it does."""
        if not self.down:
            return True
        try:
            await asyncio.wait_for(self._up.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def close(self) -> None:
        if self._probe is not None and not self._probe.done():
            self._probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._probe


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    plural: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{quote(namespace)}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name)}"
        return base


# The kinds the operator reads and writes. Their paths are fixed, so no discovery is asked
# for at start (the ServiceMonitor API may come and go while the operator runs).
PLURALS: dict[tuple[str, str], Resource] = {
    ("batch/v1", "Job"): Resource("batch", "v1", "jobs"),
    ("apps/v1", "Deployment"): Resource("apps", "v1", "deployments"),
    ("v1", "Service"): Resource("", "v1", "services"),
    ("v1", "Secret"): Resource("", "v1", "secrets"),
    ("v1", "ConfigMap"): Resource("", "v1", "configmaps"),
    ("v1", "Pod"): Resource("", "v1", "pods"),
    ("v1", "PersistentVolumeClaim"): Resource("", "v1", "persistentvolumeclaims"),
    ("autoscaling/v2", "HorizontalPodAutoscaler"): Resource(
        "autoscaling", "v2", "horizontalpodautoscalers"
    ),
    ("policy/v1", "PodDisruptionBudget"): Resource("policy", "v1", "poddisruptionbudgets"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"): Resource(
        "monitoring.coreos.com", "v1", "servicemonitors"
    ),
    ("voxfleet.io/v1alpha1", "TTSVoice"): Resource("voxfleet.io", "v1alpha1", "ttsvoices"),
}


def resource_of(obj: Mapping[str, Any]) -> Resource:
    try:
        return PLURALS[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise ValueError(
            f"no API path known for {obj.get('apiVersion')} {obj.get('kind')}"
        ) from None


async def login(configuration: kube_client.Configuration) -> None:
    """The pod's service account (its token read again every minute by the client), else the
    kubeconfig (`$KUBECONFIG` as it is now, else ~/.kube/config), into `configuration`."""
    try:
        kube_config.load_incluster_config(client_configuration=configuration)
    except kube_config.ConfigException:
        await kube_config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config"),
            client_configuration=configuration,
            persist_config=False,
        )


class KubeClient:
    """Plain-dict verbs over `kubernetes.aio`'s ApiClient, with retries (module doc)."""

    def __init__(
        self,
        api: kube_client.ApiClient,
        relogin: Callable[[kube_client.Configuration], Awaitable[None]] | None = login,
    ) -> None:
        self.api = api
        self._relogin = relogin
        self.requests = 0
        self.health = ApiHealth()
        self._patched_path: str | None = None

    @classmethod
    async def connect(cls) -> KubeClient:
        configuration = kube_client.Configuration()
        await login(configuration)
        return cls(kube_client.ApiClient(configuration))

    async def close(self) -> None:
        await self.health.close()
        await self.api.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        delays = iter(TRANSIENT_RETRY_SECONDS)
        renewed = False
        while True:
            try:
                result = await self._call_once(method, path, body, query, content_type)
            except ApiError as error:
                # A token read from a kubeconfig is not renewed by the client: read it again.
                if error.status == 401 and not renewed and self._relogin is not None:
                    await self._relogin(self.api.configuration)
                    renewed = True
                    continue
                if error.status not in TRANSIENT_STATUSES:
                    self.health.mark_up()
                    raise
                delay = next(delays, None)
                if delay is None:
                    self.health.mark_down(self._probe_for(method, path))
                    raise
                await asyncio.sleep(error.retry_after or delay)
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError):
                delay = next(delays, None)
                if delay is None:
                    self.health.mark_down(self._probe_for(method, path))
                    raise
                await asyncio.sleep(delay)
            else:
                self.health.mark_up()
                if method == "PATCH":
                    self._patched_path = path
                return result

    def _probe_for(self, method: str, path: str) -> Callable[[], Awaitable[Any]]:
        """A request that repeats nothing but tells whether `method path` would work now.

        A failed write is probed with an empty merge patch (it changes nothing, but goes the
        way of a write) of the object patched last, or of the failed path itself; an outage
        can be of writes only, where a GET would answer at once.
        """
        target = path if method == "PATCH" else self._patched_path
        if method != "GET" and target is not None:
            return lambda: self._call_once("PATCH", target, {}, None, MERGE_PATCH)
        return lambda: self._call_once("GET", path, None, {"limit": "1"}, "application/json")

    async def _call_once(
        self,
        method: str,
        path: str,
        body: Any,
        query: Mapping[str, str] | None,
        content_type: str,
    ) -> Any:
        self.requests += 1
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        request = await self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = await self.api.call_api(*request, _request_timeout=REQUEST_TIMEOUT_SECONDS)
            data = await response.read()
        except ApiException as error:
            raise _api_error(int(error.status or 0), str(error.reason), error.body, None) from None
        if response.status >= 400:
            retry_after = retry_after_seconds(response.headers.get("Retry-After"))
            raise _api_error(response.status, str(response.reason), data, retry_after)
        return json.loads(data) if data else None

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj: dict[str, Any] = await self._call("GET", resource.path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise
        return obj

    async def list(
        self, resource: Resource, namespace: str | None, label_selector: str | None = None
    ) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        result = await self._call("GET", resource.path(namespace), query=query)
        items: list[dict[str, Any]] = result.get("items") or []
        return items

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        resource = resource_of(obj)
        namespace = obj["metadata"].get("namespace")
        created: dict[str, Any] = await self._call(
            "POST", resource.path(namespace), dict(obj), {"fieldManager": FIELD_MANAGER}
        )
        return created

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of `obj` (created where missing): the API server makes the
        object hold every field of `obj`, taking those another writer set (force), and
        removes the fields this manager applied before and `obj` no longer has."""
        resource = resource_of(obj)
        meta = obj["metadata"]
        applied: dict[str, Any] = await self._call(
            "PATCH",
            resource.path(meta.get("namespace"), meta["name"]),
            dict(obj),
            {"fieldManager": FIELD_MANAGER, "force": "true"},
            APPLY_PATCH,
        )
        return applied

    async def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Any,
        subresource: str | None = None,
        content_type: str = MERGE_PATCH,
    ) -> dict[str, Any]:
        """A merge patch (or, with `content_type` JSON_PATCH, a list of JSON-patch
        operations) under this operator's field manager."""
        path = resource.path(namespace, name) + (f"/{subresource}" if subresource else "")
        body = list(patch) if content_type == JSON_PATCH else dict(patch)
        for attempt in range(CONFLICT_RETRIES):
            try:
                patched: dict[str, Any] = await self._call(
                    "PATCH", path, body, {"fieldManager": FIELD_MANAGER}, content_type
                )
                return patched
            except ApiError as error:
                # A patch without resourceVersion only conflicts when the server is racing
                # another writer of the same object; try again after a moment.
                if error.status != 409 or attempt == CONFLICT_RETRIES - 1:
                    raise
                await asyncio.sleep(0.05 * 2**attempt)
        raise AssertionError("unreachable")

    async def delete(self, resource: Resource, namespace: str, name: str) -> bool:
        try:
            await self._call(
                "DELETE",
                resource.path(namespace, name),
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": "Background",
                },
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def exists(self, path: str) -> bool:
        try:
            await self._call("GET", path)
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True


def _api_error(
    status: int, reason: str, body: bytes | str | None, retry_after: float | None
) -> ApiError:
    """An ApiError from an answer's status and body (a Status object, as a rule)."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    message = text[:500]
    try:
        answer = json.loads(text)
        if isinstance(answer, dict):
            reason = str(answer.get("reason") or reason)
            message = str(answer.get("message", ""))
    except ValueError:
        pass
    return ApiError(status, reason, message, retry_after)
