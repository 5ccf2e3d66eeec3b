"""Choosing a pod per stream, and trying another one when a pod refuses.

Knows nothing of HTTP or gRPC: an endpoint is a string (`host:port`), a refusal is a gRPC
status *name* (`"RESOURCE_EXHAUSTED"`), and a stream is whatever the caller's `open_stream`
yields. So the speech API's gateway (engines/gateway), `engines.client.tts` and the bench can
all put their streams through the same choice:

- `Balancer.choose` picks, among a voice's ready endpoints, the one with the fewest streams
  this process has in flight to it; ties go round-robin, so that one stream at a time still
  visits every pod. Each balancer starts its round at a random pod: clients started together
  (a fleet of workers, or make autoscale's one client per listener) would otherwise all send
  their first stream to the same pod, and keep stepping through the pods in step, stacking
  their streams on one pod while the others idle. A count of our own streams needs no
  metrics scrape and reacts at once; it does not see other processes' streams, which the
  pods' own refusals cover.
- A stream refused before its first item (RESOURCE_EXHAUSTED; UNAVAILABLE: a pod that is
  stopping or not reachable; NOT_FOUND: a pod that no longer has the voice) is tried on
  another endpoint, each endpoint at most once, within `max_attempts`. Refusals are counted
  per endpoint. An error after the first item is never retried: the listener has heard
  audio, and speaking it again would repeat it.
- `stream_balanced` (asyncio) and `stream_balanced_sync` (threads) are the same loop around
  one `StreamAttempts` each. Callers map `NoEndpoints` and `StreamRefused` to their own
  errors (the gateway to OpenAI's envelope) at their edge.
- `resolve_endpoints("joe-tts-pods.tts.svc:8001")` lists the ready pods of a voice through
  its headless Service (plain DNS: no Kubernetes API, no RBAC), for callers that have no
  list of their own; `ResolvedEndpoints` keeps that answer for a few seconds and looks it up
  again in the background once it is older, so that a client holding one connection per pod
  sees a pod added by a scale-out (or one that left) within seconds, without ever waiting
  for a lookup but the first.
- Streams that every tried pod refused are counted apart (`Balancer.refused_streams`), as are
  the refusals a retry absorbed (`EndpointCounts.refusals`): a listener who got no audio is
  not a failure of the pods, and one who got it from the second pod did not notice.
"""

from __future__ import annotations

import itertools
import random
import re
import socket
import threading
import time
from collections.abc import (
    AsyncIterator,
    Callable,
    Collection,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")

RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
UNAVAILABLE = "UNAVAILABLE"
NOT_FOUND = "NOT_FOUND"
# What a pod answers before any audio when another pod may still take the stream. NOT_FOUND
# is a pod that no longer has the voice: one that is stopping (Triton unloads every model on
# its way out) or had the voice unloaded, while the client's list of pods is seconds old.
DEFAULT_RETRY_CODES = frozenset({RESOURCE_EXHAUSTED, UNAVAILABLE, NOT_FOUND})
_STATUS_PREFIX = re.compile(r"^\[([A-Z_]+)\] ")
DEFAULT_MAX_ATTEMPTS = 3


def resolve_endpoints(address: str) -> list[str]:
    """Every `ip:port` that `host:port` resolves to now, sorted; [] where the name does not
    exist (as a headless Service with no ready pod answers). Blocks for the lookup."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror:
        return []
    found = {str(info[4][0]) for info in infos}
    return sorted(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}" for ip in found)


class ResolvedEndpoints:
    """The endpoints `address` resolves to, looked up again once older than `ttl_s`.

    Calling it returns the last answer at once; a stale answer starts one lookup in a thread
    of its own, so neither a blocking caller nor an event loop waits on DNS (only the first
    call does). A lookup that fails keeps the previous answer. `resolve` is for tests."""

    def __init__(
        self,
        address: str,
        ttl_s: float = 2.0,
        resolve: Callable[[str], list[str]] = resolve_endpoints,
    ) -> None:
        self.address = address
        self.ttl_s = ttl_s
        self._resolve = resolve
        self._lock = threading.Lock()
        self._endpoints: list[str] | None = None
        self._at = 0.0
        self._looking = False

    def __call__(self) -> list[str]:
        with self._lock:
            known, stale = self._endpoints, time.monotonic() - self._at > self.ttl_s
            start = known is not None and stale and not self._looking
            if start:
                self._looking = True
        if known is None:
            return self.refresh()
        if start:
            threading.Thread(target=self._refresh_quietly, daemon=True).start()
        return list(known)

    def refresh(self) -> list[str]:
        """Look the address up now (blocking) and keep the answer."""
        try:
            found = self._resolve(self.address)
        finally:
            with self._lock:
                self._looking = False
        with self._lock:
            self._endpoints, self._at = list(found), time.monotonic()
        return list(found)

    def _refresh_quietly(self) -> None:
        try:
            self.refresh()
        except Exception:  # keep the previous answer; the next call tries again
            with self._lock:
                self._at = time.monotonic()


class NoEndpoints(LookupError):
    """No endpoint serves the voice now (none ready, or every one was tried already)."""

    def __init__(self, voice: str) -> None:
        super().__init__(f"no ready pod serves voice {voice!r} now")
        self.voice = voice


@dataclass(frozen=True)
class Refusal:
    endpoint: str
    code: str | None
    message: str


def status_of(message: str, default: str | None = None) -> tuple[str | None, str]:
    """An error message as (gRPC status name, text): the stream model's own errors lead with
    their status (`[RESOURCE_EXHAUSTED] this server is full: ...`); Triton's own "Request for
    unknown model: ..." (a voice the pod does not have, or no longer has) is NOT_FOUND;
    anything else has `default` (the call's own status, where there is one)."""
    prefixed = _STATUS_PREFIX.match(message)
    if prefixed:
        return prefixed.group(1), message[prefixed.end() :]
    if "unknown model" in message or "is not found" in message:
        return NOT_FOUND, message
    return default, message


class StreamRefused(RuntimeError):
    """Every attempt was refused before its first item; `code` is the last refusal's."""

    def __init__(self, voice: str, refusals: Sequence[Refusal]) -> None:
        last = refusals[-1]
        tried = ", ".join(r.endpoint for r in refusals)
        super().__init__(
            f"voice {voice!r}: {len(refusals)} pod(s) refused the stream ({tried}); "
            f"last: {last.message}"
        )
        self.voice = voice
        self.refusals = list(refusals)
        self.code = last.code
        self.last_message = last.message


@dataclass
class EndpointCounts:
    """What this process knows of one endpoint: its streams now, and since start."""

    in_flight: int = 0
    streams: int = 0
    refusals: int = 0
    failures: int = 0  # errors after the first item, or codes that are not retried


class Balancer:
    """Per-process stream counts per endpoint, and the choice they drive. Thread-safe."""

    def __init__(
        self,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retry_codes: Collection[str] = DEFAULT_RETRY_CODES,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts}")
        self.max_attempts = max_attempts
        self.retry_codes = frozenset(retry_codes)
        self._counts: dict[str, EndpointCounts] = {}
        self._lock = threading.Lock()
        self._turn = itertools.count(random.randrange(1 << 30))
        # Streams every tried endpoint refused (the listener got no audio), and streams that
        # found no endpoint at all.
        self.refused_streams = 0
        self.unserved_streams = 0

    def choose(self, endpoints: Iterable[str], avoid: Collection[str] = ()) -> str | None:
        """The endpoint with the fewest streams in flight, round-robin among equals; None
        when every endpoint is in `avoid` (or there is none)."""
        candidates = sorted({e for e in endpoints if e not in avoid})
        if not candidates:
            return None
        with self._lock:
            turn = next(self._turn)
            loads = [self._count(e).in_flight for e in candidates]
            fewest = min(loads)
            tied = [e for e, load in zip(candidates, loads, strict=True) if load == fewest]
            return tied[turn % len(tied)]

    def started(self, endpoint: str) -> None:
        with self._lock:
            counts = self._count(endpoint)
            counts.in_flight += 1
            counts.streams += 1

    def ended(self, endpoint: str) -> None:
        with self._lock:
            counts = self._count(endpoint)
            counts.in_flight = max(0, counts.in_flight - 1)

    def refused(self, endpoint: str) -> None:
        with self._lock:
            self._count(endpoint).refusals += 1

    def failed(self, endpoint: str) -> None:
        with self._lock:
            self._count(endpoint).failures += 1

    def gave_up(self, refused: bool) -> None:
        """A stream ends without audio: every endpoint it tried refused it (`refused`), or
        there was no endpoint to try."""
        with self._lock:
            if refused:
                self.refused_streams += 1
            else:
                self.unserved_streams += 1

    def should_retry(self, code: str | None, started: bool) -> bool:
        """Whether an error with gRPC status `code` may be tried on another endpoint."""
        return not started and code in self.retry_codes

    def counts(self) -> dict[str, EndpointCounts]:
        """A copy of the counts, by endpoint."""
        with self._lock:
            return {e: EndpointCounts(**vars(c)) for e, c in self._counts.items()}

    @property
    def refusals(self) -> int:
        with self._lock:
            return sum(c.refusals for c in self._counts.values())

    def forget(self, keep: Collection[str]) -> None:
        """Drop the counts of endpoints not in `keep` that have nothing in flight (pods gone)."""
        with self._lock:
            for endpoint in [e for e, c in self._counts.items() if e not in keep]:
                if self._counts[endpoint].in_flight == 0:
                    del self._counts[endpoint]

    def _count(self, endpoint: str) -> EndpointCounts:
        counts = self._counts.get(endpoint)
        if counts is None:
            counts = self._counts[endpoint] = EndpointCounts()
        return counts


@dataclass
class StreamAttempts:
    """The attempts of one stream: which endpoint next, and whether an error ends it."""

    balancer: Balancer
    voice: str
    endpoints: Callable[[], Sequence[str]]
    tried: list[str] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)

    def next_endpoint(self) -> str:
        """The endpoint for the next attempt (counted as started); raises NoEndpoints or,
        once some were refused, StreamRefused."""
        endpoint = None
        if len(self.tried) < self.balancer.max_attempts:
            endpoint = self.balancer.choose(self.endpoints(), avoid=self.tried)
        if endpoint is None:
            self.balancer.gave_up(bool(self.refusals))
            if self.refusals:
                raise StreamRefused(self.voice, self.refusals)
            raise NoEndpoints(self.voice)
        self.tried.append(endpoint)
        self.balancer.started(endpoint)
        return endpoint

    def error(self, endpoint: str, code: str | None, message: str, started: bool) -> bool:
        """Record an attempt's error; True when the stream should try another endpoint."""
        if self.balancer.should_retry(code, started):
            self.balancer.refused(endpoint)
            self.refusals.append(Refusal(endpoint, code, message))
            return True
        self.balancer.failed(endpoint)
        return False


def _endpoints_of(
    endpoints: Sequence[str] | Callable[[], Sequence[str]],
) -> Callable[[], Sequence[str]]:
    if callable(endpoints):
        return endpoints
    fixed = list(endpoints)
    return lambda: fixed


async def stream_balanced(
    balancer: Balancer,
    voice: str,
    endpoints: Sequence[str] | Callable[[], Sequence[str]],
    open_stream: Callable[[str], AsyncIterator[T]],
    code_of: Callable[[BaseException], str | None],
) -> AsyncIterator[T]:
    """Yield the items of one stream from the endpoint `balancer` picks, trying another one
    when an attempt is refused before its first item. `endpoints` may be a function, read
    again before each attempt (pods come and go). `code_of` names an error's gRPC status."""
    attempts = StreamAttempts(balancer, voice, _endpoints_of(endpoints))
    while True:
        endpoint = attempts.next_endpoint()
        started = False
        try:
            async for item in open_stream(endpoint):
                started = True
                yield item
            return
        except Exception as error:
            if not attempts.error(endpoint, code_of(error), str(error), started):
                raise
        finally:
            balancer.ended(endpoint)


def stream_balanced_sync(
    balancer: Balancer,
    voice: str,
    endpoints: Sequence[str] | Callable[[], Sequence[str]],
    open_stream: Callable[[str], Iterator[T]],
    code_of: Callable[[BaseException], str | None],
) -> Generator[T, None, None]:
    """`stream_balanced` for blocking callers (engines.client.tts's `TtsClient`)."""
    attempts = StreamAttempts(balancer, voice, _endpoints_of(endpoints))
    while True:
        endpoint = attempts.next_endpoint()
        started = False
        try:
            for item in open_stream(endpoint):
                started = True
                yield item
            return
        except Exception as error:
            if not attempts.error(endpoint, code_of(error), str(error), started):
                raise
        finally:
            balancer.ended(endpoint)
