"""Which voices exist, and which endpoints serve each one now.

Two directories, one interface:

- `StaticDirectory`: fixed Triton endpoints (`voxfleet serve --api-port`, `voxfleet api
  --upstream HOST:PORT`). The voices are what those servers' repository index lists; a voice
  is served by the endpoints where it is READY.
- `DnsDirectory`: the cluster. The voice table (a JSON file the operator renders into a
  ConfigMap) lists the namespace's voices, each with the address of its headless Service
  (`<voice>-tts-pods.<namespace>.svc:8001`). That name resolves to the ready pods that serve
  the voice, the same pods its ClusterIP Service selects: the operator labels a pod
  `serving.voxfleet.io/<voice>` once the voice is loaded there, and Kubernetes lists only
  ready pods, so a pod that is stopping leaves the answer before it stops. Plain DNS needs
  no Kubernetes API access, so the gateway runs with no RBAC and no service-account token.

Answers are kept for `ttl_s` and refreshed in the background once older, so a request never
waits for a lookup except the very first one for a voice.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from engines.client.balancing import resolve_endpoints
from engines.gateway.errors import UpstreamError
from engines.gateway.upstream import Upstreams
from engines.gateway.voices import VoiceTable, VoiceTableError, load_table, with_flags

DEFAULT_TTL_S = 2.0
V = TypeVar("V")


class Directory(Protocol):
    table: VoiceTable

    async def voices(self) -> list[str]:
        """The voices that exist (served now or not)."""
        ...

    async def reachable(self) -> bool:
        """Whether the voice list could be read at all (else unknown voices are a 503)."""
        ...

    async def endpoints(self, voice: str) -> list[str]:
        """The endpoints that serve `voice` now (fresh enough to stream from)."""
        ...

    def endpoints_now(self, voice: str) -> list[str]:
        """The last known endpoints of `voice`, without waiting (the balancer's view)."""
        ...

    async def close(self) -> None: ...


class _Cached(Generic[V]):
    """A value read by `fetch`, kept `ttl_s`, then refreshed in the background."""

    def __init__(self, fetch: Callable[[], Awaitable[V]], ttl_s: float) -> None:
        self._fetch = fetch
        self._ttl_s = ttl_s
        self._value: V | None = None
        self._at = 0.0
        self._task: asyncio.Task[V] | None = None

    @property
    def value(self) -> V | None:
        return self._value

    async def get(self) -> V:
        if self._value is None:
            return await self._refresh()
        if time.monotonic() - self._at > self._ttl_s:
            self._refresh_soon()
        return self._value

    def _refresh_soon(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
            # A background refresh's failure keeps the old answer; it must not go unread.
            self._task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _refresh(self) -> V:
        self._refresh_soon()
        assert self._task is not None
        return await asyncio.shield(self._task)

    async def _run(self) -> V:
        value = await self._fetch()
        self._value, self._at = value, time.monotonic()
        return value

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


class StaticDirectory:
    """Fixed endpoints; the voices are the models their Triton servers hold."""

    def __init__(
        self,
        endpoints: Sequence[str],
        upstreams: Upstreams,
        table: VoiceTable | None = None,
        ttl_s: float = DEFAULT_TTL_S,
    ) -> None:
        if not endpoints:
            raise ValueError("a static directory needs at least one endpoint")
        self.table = table or VoiceTable()
        self._endpoints = list(endpoints)
        self._upstreams = upstreams
        # endpoint -> {model: ready}, or None where the endpoint did not answer.
        self._index: _Cached[dict[str, dict[str, bool] | None]] = _Cached(self._read, ttl_s)

    async def _read(self) -> dict[str, dict[str, bool] | None]:
        async def one(endpoint: str) -> dict[str, bool] | None:
            try:
                return await self._upstreams.model_states(endpoint)
            except UpstreamError:
                return None

        answers = await asyncio.gather(*(one(e) for e in self._endpoints))
        return dict(zip(self._endpoints, answers, strict=True))

    async def voices(self) -> list[str]:
        index = await self._index.get()
        return sorted({m for models in index.values() if models for m in models})

    async def reachable(self) -> bool:
        index = await self._index.get()
        return any(models is not None for models in index.values())

    async def endpoints(self, voice: str) -> list[str]:
        await self._index.get()
        return self.endpoints_now(voice)

    def endpoints_now(self, voice: str) -> list[str]:
        index = self._index.value or {}
        return [e for e, models in index.items() if models and models.get(voice)]

    async def close(self) -> None:
        self._index.cancel()


async def resolve_address(address: str) -> list[str]:
    """`engines.client.balancing.resolve_endpoints` off the event loop."""
    return await asyncio.to_thread(resolve_endpoints, address)


class DnsDirectory:
    """The voice table's voices, each resolved through its address (a headless Service)."""

    def __init__(
        self,
        table_path: Path,
        ttl_s: float = DEFAULT_TTL_S,
        aliases: tuple[tuple[str, str], ...] = (),
        default_voice: str | None = None,
    ) -> None:
        self._path = table_path
        self._flags = (aliases, default_voice)
        self._ttl_s = ttl_s
        self._mtime: float | None = None
        self._checked = 0.0
        self.table = VoiceTable()
        self._resolved: dict[str, _Cached[list[str]]] = {}
        self._reload(force=True)

    def _reload(self, force: bool = False) -> None:
        """Read the table again when its file changed (a ConfigMap update)."""
        now = time.monotonic()
        if not force and now - self._checked < self._ttl_s:
            return
        self._checked = now
        try:
            mtime = self._path.stat().st_mtime
        except OSError:
            mtime = None
        if mtime == self._mtime and not force:
            return
        try:
            table = load_table(self._path)
        except VoiceTableError:
            if force and self._mtime is None:
                raise
            return  # a half-written update: keep the table we have
        self._mtime, self.table = mtime, with_flags(table, *self._flags)
        for voice in [v for v in self._resolved if v not in table.voices]:
            self._resolved.pop(voice).cancel()

    async def voices(self) -> list[str]:
        self._reload()
        return sorted(self.table.voices)

    async def reachable(self) -> bool:
        return True

    def _cached(self, voice: str) -> _Cached[list[str]] | None:
        entry = self.table.voices.get(voice)
        if entry is None or not entry.address:
            return None
        cached = self._resolved.get(voice)
        if cached is None:
            address = entry.address
            cached = self._resolved[voice] = _Cached(lambda: resolve_address(address), self._ttl_s)
        return cached

    async def endpoints(self, voice: str) -> list[str]:
        self._reload()
        cached = self._cached(voice)
        return list(await cached.get()) if cached is not None else []

    def endpoints_now(self, voice: str) -> list[str]:
        cached = self._resolved.get(voice)
        return list(cached.value or []) if cached is not None else []

    async def close(self) -> None:
        for cached in self._resolved.values():
            with contextlib.suppress(Exception):
                cached.cancel()
