"""Children written with server-side apply, only when the live object departs from them.

The operator applies each child whole (`KubeClient.apply`, field manager
`voxfleet-operator`), so that the API server records which fields are the operator's. A
pass writes nothing while the live object (from the cache, as a rule) holds what is
rendered. Three departures make a write:

- a field the operator renders is missing or holds another value (`departures`): every
  element of a rendered list must be found in the live list, and an empty list or map may
  be absent, as the API server leaves them out;
- a field the operator applied before and renders no more, by its own entry in the object's
  `metadata.managedFields` (`departures`): applying again removes it;
- a field someone else added or changed since the operator last saw the object as it wrote
  it (the cache's baseline, `foreign_edits`), outside what it renders: `hostNetwork: true`,
  `serviceAccountName: admin`, `privileged: true` or a sidecar container on the GPU pods.
  Those are put back as they were (removed, or their earlier value restored) by a JSON
  patch before the apply, guarded by the object's resourceVersion.

Never a departure: metadata beyond the operator's own labels, annotations and owners (other
tools' labels, the server's bookkeeping, a pod template's `kubectl rollout restart` stamp),
status, the HPA's `spec.replicas`, and what the API server filled in when the object was
written (defaults, a Service's cluster IP): that is in the baseline.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from voxfleet_operator.cache import ObjectCache
from voxfleet_operator.kube import (
    FIELD_MANAGER,
    JSON_PATCH,
    ApiError,
    KubeClient,
    resource_of,
)

logger = logging.getLogger(__name__)

Outcome = Literal["created", "patched", "unchanged"]
Path = tuple[str | int, ...]

# Set by other writers on the operator's children by design: the HPA scales a pool
# Deployment (`kubectl scale` too). Never put back.
NOT_OURS: frozenset[Path] = frozenset({("spec", "replicas")})
# Top-level fields that are never a departure of anyone's (module doc).
_OUTSIDE = frozenset({"apiVersion", "kind", "metadata", "status"})
_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def _where(path: Path) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path) or "."


def _missing(desired: Any, live: Any, path: Path = ()) -> list[str]:
    """Where `live` lacks a field of `desired` or holds another value."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return [_where(path)]
        found: list[str] = []
        for key, value in desired.items():
            if key in ("apiVersion", "kind") and not path:
                continue  # the URL names the object; some answers leave them out
            if key not in live:
                if value != [] and value != {}:
                    found.append(_where((*path, key)))
            else:
                found += _missing(value, live[key], (*path, key))
        return found
    if isinstance(desired, list):
        if not isinstance(live, list):
            return [_where(path)]
        if all(isinstance(d, Mapping) for d in desired):
            # Each rendered element somewhere in the live list (where it was put, as a rule):
            # elements someone else added are theirs (`foreign_edits` puts them back), not
            # missing ones of ours.
            found = []
            for index, element in enumerate(desired):
                if index < len(live) and not _missing(element, live[index]):
                    continue
                if not any(not _missing(element, other) for other in live):
                    found.append(_where((*path, index)))
            return found
        same = len(desired) == len(live) and all(map(_same, desired, live))
        return [] if same else [_where(path)]
    return [] if _same(desired, live) else [_where(path)]


def _own_entry(live: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The operator's own server-side-apply entry in the object's managedFields."""
    for entry in (live.get("metadata") or {}).get("managedFields") or []:
        if (
            entry.get("manager") == FIELD_MANAGER
            and entry.get("operation") == "Apply"
            and not entry.get("subresource")
        ):
            return dict(entry)
    return None


def _matches(keys: Mapping[str, Any], element: Any) -> bool:
    # A key the rendered element leaves out is one the server defaulted (a port's protocol).
    return isinstance(element, Mapping) and all(
        k not in element or _same(element[k], v) for k, v in keys.items()
    )


def _unrendered(fields: Mapping[str, Any], live: Any, desired: Any, path: Path) -> Iterator[Path]:
    """The fields of a managedFields `fieldsV1` tree that `live` has and `desired` lacks."""
    for key, sub in fields.items():
        kind, _, raw = key.partition(":")
        if kind == "f":
            if not isinstance(live, Mapping) or raw not in live:
                continue
            here: Path = (*path, raw)
            if not isinstance(desired, Mapping) or raw not in desired:
                yield here
            elif sub:
                yield from _unrendered(sub, live[raw], desired[raw], here)
        elif kind in ("k", "v", "i") and isinstance(live, list):
            index, element = _find(kind, raw, live)
            if index is None:
                continue
            here = (*path, index)
            wanted = _find(kind, raw, desired)[1] if isinstance(desired, list) else None
            if wanted is None:
                yield here
            elif kind != "v" and sub:
                yield from _unrendered(sub, element, wanted, here)


def _find(kind: str, raw: str, items: list[Any]) -> tuple[int | None, Any]:
    """The index and element of a list that a managedFields path element names."""
    if kind == "i":
        index = int(raw)
        return (index, items[index]) if index < len(items) else (None, None)
    value = json.loads(raw)
    for index, element in enumerate(items):
        if (kind == "k" and _matches(value, element)) or (kind == "v" and element == value):
            return index, element
    return None, None


def departures(desired: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Where `live` departs from `desired` in a way that applying `desired` puts right:
    rendered fields missing or different, and fields the operator applied before and no
    longer renders. Empty: nothing to apply."""
    found = _missing(desired, live)
    entry = _own_entry(live)
    if entry is not None:
        fields = dict(entry.get("fieldsV1") or {})
        fields.pop("f:metadata", None)  # our labels and owners are checked above
        found += [_where(p) for p in _unrendered(fields, live, desired, ())]
    return found


def in_line(desired: Mapping[str, Any], live: Mapping[str, Any]) -> bool:
    """Whether `live` already is what we render, as far as an apply can tell."""
    return not departures(desired, live)


def _pointer(path: Path) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path)


def foreign_edits(
    baseline: Mapping[str, Any], live: Mapping[str, Any], desired: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """JSON-patch operations that put back what someone else added to `live`, or changed,
    since `baseline` (the object as the operator last wrote or first saw it), outside the
    fields `desired` renders: added fields removed, changed ones given their earlier value.
    Rendered fields are left to the apply; metadata, status and `NOT_OURS` to their owners."""
    ops: list[dict[str, Any]] = []
    for key in live:
        if key in _OUTSIDE:
            continue
        _edits(baseline.get(key, _ABSENT), live[key], desired.get(key, _ABSENT), (key,), ops)
    return ops


def _edits(base: Any, now: Any, want: Any, path: Path, ops: list[dict[str, Any]]) -> None:
    if path in NOT_OURS or path[-1] == "metadata":
        # A pod template's labels and annotations are other tools' too, as the object's are
        # (`kubectl rollout restart` stamps one); the rendered ones are the apply's.
        return
    if base is _ABSENT:
        if want is _ABSENT:
            ops.append({"op": "remove", "path": _pointer(path)})
        return
    if isinstance(now, Mapping) and isinstance(base, Mapping):
        for key, value in now.items():
            wanted = want.get(key, _ABSENT) if isinstance(want, Mapping) else _ABSENT
            _edits(base.get(key, _ABSENT), value, wanted, (*path, key), ops)
        return
    if isinstance(now, list) and isinstance(base, list):
        # From the end, so that removing an element leaves the indices before it as they are.
        for index in reversed(range(len(now))):
            element = now[index]
            before = _counterpart(element, base, index)
            wanted = _counterpart(element, want, index) if isinstance(want, list) else _ABSENT
            _edits(before, element, wanted, (*path, index), ops)
        return
    if not _same(base, now) and want is _ABSENT:
        ops.append({"op": "replace", "path": _pointer(path), "value": base})


def _counterpart(element: Any, items: list[Any], index: int) -> Any:
    """The element of `items` that `element` stands for: the one of the same name where
    elements are named (containers, ports, volumes), else the one at the same index."""
    if isinstance(element, Mapping) and "name" in element:
        for other in items:
            if isinstance(other, Mapping) and other.get("name") == element["name"]:
                return other
        return _ABSENT
    return items[index] if index < len(items) else _ABSENT


def owner_reference(owner: Mapping[str, Any], controller: bool) -> dict[str, Any]:
    meta = owner["metadata"]
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def with_owners(obj: dict[str, Any], owners: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A copy of `obj` owned by `owners`: one owner is the controller, several share it."""
    controller = len(owners) == 1
    meta = dict(obj["metadata"])
    meta["ownerReferences"] = [owner_reference(o, controller) for o in owners]
    return {**obj, "metadata": meta}


async def ensure(
    client: KubeClient,
    desired: dict[str, Any],
    cache: ObjectCache | None = None,
    patch_existing: bool = True,
) -> tuple[Outcome, dict[str, Any]]:
    """Make the live object hold `desired`: apply it, put back what others changed, or leave
    it alone (module doc).

    With a cache, the live object is the cached one when there is one (no read); a child the
    cache lacks is read. `patch_existing=False` creates only: an object that exists (made by
    a concurrent pass meanwhile) is returned as it is, for kinds whose spec the API server
    will not let us change (a Job's pod template and selector are immutable).
    """
    resource = resource_of(desired)
    namespace = desired["metadata"]["namespace"]
    name = desired["metadata"]["name"]
    live = cache.lookup(resource.plural, namespace, name) if cache is not None else None
    if live is None:
        live = await client.get(resource, namespace, name)
        if live is not None and cache is not None:
            cache.seen(resource.plural, live)
    if not patch_existing:
        if live is not None:
            return "unchanged", live
        try:
            created = await client.create(desired)
        except ApiError as error:
            found = await client.get(resource, namespace, name) if error.status == 409 else None
            if found is None:
                raise
            # Created by a concurrent pass since our read.
            if cache is not None:
                cache.seen(resource.plural, found)
            return "unchanged", found
        if cache is not None:
            cache.seen(resource.plural, created, written=True)
        return "created", created
    if live is None:
        applied = await client.apply(desired)
        if cache is not None:
            cache.seen(resource.plural, applied, written=True)
        return "created", applied
    baseline = cache.baseline(resource.plural, namespace, name) if cache is not None else None
    written = False
    # Others' edits go first: what they changed may only be valid together (`privileged`
    # they added with `allowPrivilegeEscalation` they changed, which the apply puts back).
    edits = foreign_edits(baseline, live, desired) if baseline is not None else []
    if edits:
        version = (live.get("metadata") or {}).get("resourceVersion")
        guard = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
        live = await client.patch(resource, namespace, name, guard + edits, None, JSON_PATCH)
        written = True
    if departures(desired, live):
        live = await client.apply(desired)
        written = True
    if not written:
        return "unchanged", live
    if cache is not None:
        cache.seen(resource.plural, live, written=True)
    left = departures(desired, live)
    if left:
        # The server would not keep what was applied (a webhook, a field it resets): every
        # pass would write the object again. Say so.
        logger.warning(
            "%s %s/%s still differs after it was applied, at %s",
            desired["kind"],
            namespace,
            name,
            ", ".join(left),
        )
    return "patched", live
