"""Create-or-patch of children, writing nothing when the live object already matches."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from voxfleet_operator.kube import ApiError, KubeClient, resource_of

Outcome = Literal["created", "patched", "unchanged"]

# Maps whose extra keys change meaning (a selector with one more label selects other pods),
# so they must match exactly, unlike the rest of an object where the server adds defaults.
EXACT_MAPS = frozenset({"selector", "matchLabels", "nodeSelector"})


def is_subset(desired: Any, live: Any, key: str | None = None) -> bool:
    """Whether `live` already holds everything in `desired`.

    The API server adds defaults and status to what we send, so the live object is compared
    as a superset: every key we render must be there with the same value; lists must have
    the same length, element by element. Selectors must match exactly.
    """
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return False
        if key in EXACT_MAPS and set(live) - set(desired):
            return False
        return all(k in live and is_subset(v, live[k], k) for k, v in desired.items())
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return False
        return all(is_subset(d, x) for d, x in zip(desired, live, strict=True))
    if isinstance(desired, bool) or isinstance(live, bool):
        return desired is live
    if isinstance(desired, (int, float)) and isinstance(live, (int, float)):
        return float(desired) == float(live)
    return bool(desired == live)


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


def _with_removals(desired: Any, live: Any, key: str | None = None) -> Any:
    """`desired` as a merge patch over `live`: extra keys of exact maps are set to null."""
    if not isinstance(desired, Mapping):
        return desired
    live_map = live if isinstance(live, Mapping) else {}
    patch = {k: _with_removals(v, live_map.get(k), k) for k, v in desired.items()}
    if key in EXACT_MAPS:
        patch.update({k: None for k in live_map if k not in desired})
    return patch


def _patch_of(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    # apiVersion/kind/name/namespace identify the object; everything else is ours to set.
    patch = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in desired["metadata"].items() if k not in ("name", "namespace")}
    patch["metadata"] = meta
    result: dict[str, Any] = _with_removals(patch, live)
    return result


async def ensure(client: KubeClient, desired: dict[str, Any]) -> tuple[Outcome, dict[str, Any]]:
    """Make the live object hold `desired`: create it, patch it, or leave it alone."""
    resource = resource_of(desired)
    namespace = desired["metadata"]["namespace"]
    name = desired["metadata"]["name"]
    live = await client.get(resource, namespace, name)
    if live is None:
        try:
            return "created", await client.create(desired)
        except ApiError as error:
            if error.status != 409:
                raise
            # Created by a concurrent reconcile since our read: patch it instead.
            live = await client.get(resource, namespace, name)
            if live is None:
                raise
    if is_subset(desired, live):
        return "unchanged", live
    return "patched", await client.patch(resource, namespace, name, _patch_of(desired, live))
