"""Faults a real API server cannot be asked for, injected in front of one.

`FaultProxy` is a plain-HTTP listener on loopback that passes every request on to the real
kube-apiserver (with TLS and the client certificate it is given), streaming the answer back
(watches included), and keeps a log of what it served. Tests set, between requests:
- `outage_methods`: requests of these methods are answered 503 (an API outage, of writes
  only or of everything, watches included);
- `throttled[path]`: that many requests of `path` are answered 429 with `Retry-After: 1`;
- `conflicts[path]`: that many PATCH/PUT requests of `path` are answered 409 Conflict, as an
  API server racing another writer does;
- `required_token`: requests with another bearer token are answered 401;
- `expired_watches`: that many watch requests get, instead of events, one ERROR event
  `410 Gone` ("too old resource version"), as a server answers a watch that resumes from a
  resourceVersion its history no longer holds; `cut_watches()` ends every watch in flight
  (as a restarted API server or a dropped connection does), so that watchers resume.
The operator under test is pointed at the proxy (its kubeconfig), the tests' own client at
the API server itself, so `served` and `writes()` are the operator's requests only.
"""

from __future__ import annotations

import json
import ssl
from pathlib import Path

import aiohttp
from aiohttp import web

WRITE_METHODS = frozenset({"POST", "PATCH", "PUT", "DELETE"})
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "content-encoding",
        "host",
        "authorization",
    }
)


def _status(code: int, reason: str, message: str) -> web.Response:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": message,
    }
    return web.Response(status=code, text=json.dumps(body), content_type="application/json")


class FaultProxy:
    def __init__(self, upstream: str, ca: Path, cert: Path, key: Path) -> None:
        self.upstream = upstream.rstrip("/")
        self._tls = ssl.create_default_context(cafile=str(ca))
        self._tls.load_cert_chain(str(cert), str(key))
        self.served: list[str] = []
        self.outage_methods: frozenset[str] = frozenset()
        self.throttled: dict[str, int] = {}
        self.conflicts: dict[str, int] = {}
        self.required_token: str | None = None
        self.expired_watches = 0
        self.expired_served = 0
        self._watches: dict[web.StreamResponse, web.Request] = {}
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    def writes(self) -> list[str]:
        return [s for s in self.served if s.split(" ", 1)[0] in WRITE_METHODS]

    async def start(self) -> FaultProxy:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._tls),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
        )
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_route("*", "/{path:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path, method = request.path, request.method
        self.served.append(f"{method} {path}")
        token = request.headers.get("Authorization", "")
        if self.required_token is not None and token != f"Bearer {self.required_token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if method in self.outage_methods:
            return _status(503, "ServiceUnavailable", "the API is down (injected)")
        if self.throttled.get(path, 0) > 0:
            self.throttled[path] -= 1
            response = _status(429, "TooManyRequests", "slow down (injected)")
            response.headers["Retry-After"] = "1"
            return response
        if request.query.get("watch") in ("true", "1") and self.expired_watches > 0:
            self.expired_watches -= 1
            self.expired_served += 1
            gone = {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": "too old resource version (injected)",
                },
            }
            return web.Response(text=json.dumps(gone) + "\n", content_type="application/json")
        if method in ("PATCH", "PUT") and self.conflicts.get(path, 0) > 0:
            self.conflicts[path] -= 1
            return _status(
                409,
                "Conflict",
                "Operation cannot be fulfilled: the object has "
                "been modified; please apply your changes to the latest version",
            )
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        body = await request.read()
        async with self._session.request(
            method, self.upstream + request.path_qs, headers=headers, data=body or None
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            for name, value in upstream.headers.items():
                if name.lower() not in _HOP_HEADERS:
                    response.headers[name] = value
            await response.prepare(request)
            watching = request.query.get("watch") in ("true", "1")
            if watching:
                self._watches[response] = request
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
            except (ConnectionError, RuntimeError):
                pass  # cut, or the client went away
            finally:
                self._watches.pop(response, None)
            return response

    def cut_watches(self) -> int:
        """Drop the connection of every watch in flight; the number dropped."""
        cut = list(self._watches.values())
        self._watches.clear()
        for request in cut:
            if request.transport is not None:
                request.transport.close()
        return len(cut)
