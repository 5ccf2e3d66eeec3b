"""A small async Kubernetes API client for the operator's children.

kopf talks to the API for the TTSVoice objects themselves; children (Jobs, Deployments,
Services, ...) go through this client, which uses the same credentials kopf would (the
in-cluster service account, else the kubeconfig). It speaks JSON merge patches only: the
operator owns every field it renders, and lists are replaced whole.

Transient answers (HTTP 429 and 5xx, a refused or dropped connection) are retried a few
times with back-off, `Retry-After` honoured; `ApiHealth` remembers an outage and probes the
API until it answers again, so that callers backing off can retry as soon as it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

logger = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
# Delays before each retry of a transient failure inside one call; after the last, the call
# fails and the caller's own back-off (handlers.py) takes over.
TRANSIENT_RETRY_SECONDS = (0.2, 0.5, 1.0)
TRANSIENT_STATUSES = frozenset({429, 500, 502, 503, 504})
# A Retry-After longer than this is cut short: the caller's back-off covers longer waits.
MAX_RETRY_AFTER_SECONDS = 10.0
PROBE_INTERVAL_SECONDS = 1.0


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

    def mark_down(self, probe: Any) -> None:
        if self._up.is_set():
            self.outages += 1
        self._up.clear()
        if self._probe is None or self._probe.done():
            self._probe = asyncio.create_task(self._run_probe(probe))

    async def _run_probe(self, probe: Any) -> None:
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


class KubeClient:
    """JSON over HTTPS to the API server; one aiohttp session for the operator's lifetime."""

    def __init__(
        self, session: aiohttp.ClientSession, server: str, authorization: str | None = None
    ) -> None:
        self._session = session
        self._server = server.rstrip("/")
        self._authorization = authorization
        self.requests = 0
        self.health = ApiHealth()
        self._patched_path: str | None = None

    @classmethod
    async def connect(cls) -> KubeClient:
        """Log in the way kopf does: the service account in a pod, else the kubeconfig."""
        info = _login()
        headers = {"Accept": "application/json"}
        context: ssl.SSLContext | bool = True
        if info.server.startswith("https"):
            context = ssl.create_default_context()
            if info.insecure:
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            if info.ca_path:
                context.load_verify_locations(cafile=str(info.ca_path))
            elif info.ca_data:
                data = info.ca_data.decode() if isinstance(info.ca_data, bytes) else info.ca_data
                context.load_verify_locations(cadata=data)
            cert, key = info.certificate_path, info.private_key_path
            if info.certificate_data and info.private_key_data:
                cert, key = _to_file(info.certificate_data), _to_file(info.private_key_data)
            if cert and key:
                context.load_cert_chain(str(cert), str(key))
        auth = None
        if info.username and info.password:
            auth = aiohttp.BasicAuth(info.username, info.password)
        session = aiohttp.ClientSession(
            headers=headers,
            auth=auth,
            connector=aiohttp.TCPConnector(ssl=context, limit=32),
            timeout=aiohttp.ClientTimeout(total=30),
        )
        return cls(session, info.server, _authorization(info))

    async def close(self) -> None:
        await self.health.close()
        await self._session.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        delays = iter(TRANSIENT_RETRY_SECONDS)
        renewed = False
        while True:
            try:
                result = await self._call_once(method, path, body, params, content_type)
            except ApiError as error:
                # Service-account tokens are short-lived and rotated on disk: read them again.
                if error.status == 401 and not renewed and self._authorization is not None:
                    self._authorization = _authorization(_login())
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

    def _probe_for(self, method: str, path: str) -> Any:
        """A request that repeats nothing but tells whether `method path` would work now.

        A failed write is probed with an empty merge patch (it changes nothing, but goes the
        way of a write) of the object patched last, or of the failed path itself; an outage
        can be of writes only, where a GET would answer at once.
        """
        target = path if method == "PATCH" else self._patched_path
        if method != "GET" and target is not None:
            return lambda: self._call_once(
                "PATCH", target, {}, None, "application/merge-patch+json"
            )
        return lambda: self._call_once("GET", path, None, {"limit": "1"}, "application/json")

    async def _call_once(
        self,
        method: str,
        path: str,
        body: Any,
        params: Mapping[str, str] | None,
        content_type: str,
    ) -> Any:
        self.requests += 1
        headers = {"Authorization": self._authorization} if self._authorization else {}
        kwargs: dict[str, Any] = {"params": dict(params or {}), "headers": headers}
        if body is not None:
            kwargs["data"] = json.dumps(body)
            headers["Content-Type"] = content_type
        async with self._session.request(method, self._server + path, **kwargs) as response:
            if response.status >= 400:
                try:
                    status = await response.json(content_type=None)
                    reason = str(status.get("reason", response.reason))
                    message = str(status.get("message", ""))
                except Exception:
                    reason, message = str(response.reason), (await response.text())[:500]
                raise ApiError(
                    response.status,
                    reason,
                    message,
                    retry_after_seconds(response.headers.get("Retry-After")),
                )
            return await response.json(content_type=None)

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
        params = {"labelSelector": label_selector} if label_selector else None
        result = await self._call("GET", resource.path(namespace), params=params)
        items: list[dict[str, Any]] = result.get("items") or []
        if label_selector:
            # Not every API emulator filters by label; filtering again is harmless.
            items = [i for i in items if _selector_matches(label_selector, i)]
        return items

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        resource = resource_of(obj)
        namespace = obj["metadata"].get("namespace")
        created: dict[str, Any] = await self._call("POST", resource.path(namespace), dict(obj))
        return created

    async def patch(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        subresource: str | None = None,
    ) -> dict[str, Any]:
        path = resource.path(namespace, name) + (f"/{subresource}" if subresource else "")
        for attempt in range(CONFLICT_RETRIES):
            try:
                patched: dict[str, Any] = await self._call(
                    "PATCH", path, dict(patch), content_type="application/merge-patch+json"
                )
                return patched
            except ApiError as error:
                # A merge patch without resourceVersion only conflicts when the server is
                # racing another writer of the same object; try again after a moment.
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


def _login() -> Any:
    import kopf

    settings = kopf.OperatorSettings()
    info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )
    if info is None:
        raise RuntimeError("no Kubernetes credentials: neither a service account nor a kubeconfig")
    return info


def _authorization(info: Any) -> str | None:
    return f"{info.scheme or 'Bearer'} {info.token}" if info.token else None


def _selector_matches(selector: str, obj: Mapping[str, Any]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in selector.split(","):
        if "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key.rstrip("=")) != value:
                return False
        elif term and term not in labels:
            return False
    return True


def _to_file(data: str | bytes) -> str:
    import base64

    raw = data if isinstance(data, bytes) else data.encode()
    try:
        raw = base64.b64decode(raw, validate=True)
    except ValueError:
        pass
    handle = tempfile.NamedTemporaryFile(delete=False, suffix=".pem")
    handle.write(raw)
    handle.close()
    return handle.name
