"""The operator's view of its children, from watch events and its own writes.

A converged pass reads nothing from the API: a child the cache holds is compared as cached.
Kinds the operator watches (`watched`, filled at start from what it watches) stay fresh
through their events and never expire; a kind it does not watch (the engine-cache claim) is
read again after `ttl_seconds`. A child the cache does not hold is read from the API once (a
miss), so a deleted child is simply a miss, and the next pass creates it. Lists of pool pods
come from one LIST per namespace, then from pod events, listed again every `ttl_seconds` so
that a missed event cannot leave a ghost for long.

Beside each object the cache keeps its baseline: the object as the operator last wrote it
(the API server's answer), or as it first saw it. What differs from it was changed by
someone else since (children.foreign_edits).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DEFAULT_TTL_SECONDS = 300.0

Key = tuple[str, str, str]  # (plural, namespace, name)


def _version(obj: Mapping[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    if not isinstance(raw, str) or not raw.isdigit():
        return None  # opaque to clients in general; compared only when it is a number
    return int(raw)


class ObjectCache:
    def __init__(
        self,
        ttl_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        watched: Iterable[str] = (),
    ) -> None:
        self.ttl_seconds = DEFAULT_TTL_SECONDS if ttl_seconds is None else ttl_seconds
        self.watched: set[str] = set(watched)
        self._clock = clock
        self._objects: dict[Key, tuple[float, dict[str, Any]]] = {}
        self._baselines: dict[Key, dict[str, Any]] = {}
        # namespace -> when its pods were last listed; the pods themselves are in _objects.
        self._pods_listed: dict[str, float] = {}
        # Objects a read found missing: asked again only after an event or a write names them.
        self._absent: set[Key] = set()

    def lookup(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object, or None when it must be read from the API."""
        entry = self._objects.get((plural, namespace, name))
        if entry is None:
            return None
        seen, obj = entry
        if plural not in self.watched and self._clock() - seen > self.ttl_seconds:
            self.forget(plural, namespace, name)
            return None
        return obj

    def seen(self, plural: str, obj: Mapping[str, Any], written: bool = False) -> bool:
        """Keep `obj` unless the cache holds it or a newer version; True when kept.

        `written`: `obj` is the API server's answer to the operator's own write, its new
        baseline. An object seen first is its own baseline."""
        meta = obj.get("metadata") or {}
        key = (plural, meta.get("namespace") or "", meta.get("name") or "")
        entry = self._objects.get(key)
        if entry is not None:
            old, new = _version(entry[1]), _version(obj)
            if old is not None and new is not None and new <= old:
                return False
        self._objects[key] = (self._clock(), dict(obj))
        if written or key not in self._baselines:
            self._baselines[key] = dict(obj)
        self._absent.discard(key)
        return True

    def baseline(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The object as the operator last wrote it or first saw it; None if unknown."""
        return self._baselines.get((plural, namespace, name))

    def mark_absent(self, plural: str, namespace: str, name: str) -> None:
        """The API said there is no such object (a read found none, or we deleted it)."""
        self.forget(plural, namespace, name)
        self._absent.add((plural, namespace, name))

    def known_absent(self, plural: str, namespace: str, name: str) -> bool:
        return (plural, namespace, name) in self._absent

    def forget(self, plural: str, namespace: str, name: str) -> None:
        self._objects.pop((plural, namespace, name), None)
        self._baselines.pop((plural, namespace, name), None)

    def pods_listed(self, namespace: str) -> bool:
        listed = self._pods_listed.get(namespace)
        return listed is not None and self._clock() - listed <= self.ttl_seconds

    def replace_pods(self, namespace: str, pods: list[dict[str, Any]]) -> None:
        """A fresh LIST of the namespace's pool pods replaces whatever was cached."""
        for key in [k for k in self._objects if k[0] == "pods" and k[1] == namespace]:
            self.forget(*key)
        for pod in pods:
            self.seen("pods", pod)
        self._pods_listed[namespace] = self._clock()

    def pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        found = []
        for (plural, ns, _), (_, pod) in self._objects.items():
            pod_labels = (pod.get("metadata") or {}).get("labels") or {}
            if plural == "pods" and ns == namespace and labels.items() <= pod_labels.items():
                found.append(pod)
        return sorted(found, key=lambda p: p["metadata"]["name"])
