"""Create-or-patch of children, writing nothing when the live object already matches."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from voxfleet_operator.cache import ObjectCache
from voxfleet_operator.kube import ApiError, KubeClient, resource_of

logger = logging.getLogger(__name__)

Outcome = Literal["created", "patched", "unchanged"]

# Fields Kubernetes (or the HPA) sets on objects like ours, with whatever value it chose:
# `replicas` belongs to the HPA, the rest to the API server.
SERVER_OWNED = frozenset(
    {"metadata", "status", "replicas", "clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"}
)
# Fields the API server fills in with a default when we leave them out, and the values it
# uses. Present with another value, or absent from this table, an extra field is drift.
# Kept to what our rendered kinds (Deployment, Service, HPA, PDB, Secret, ServiceMonitor) get.
SERVER_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "restartPolicy": ("Always",),
    "dnsPolicy": ("ClusterFirst",),
    "schedulerName": ("default-scheduler",),
    "serviceAccountName": ("default",),
    "serviceAccount": ("default",),
    "securityContext": ({},),
    "terminationGracePeriodSeconds": (30,),
    "terminationMessagePath": ("/dev/termination-log",),
    "terminationMessagePolicy": ("File",),
    "imagePullPolicy": ("IfNotPresent", "Always"),
    "priority": (0,),
    "enableServiceLinks": (True,),
    "resources": ({},),
    "protocol": ("TCP",),
    "scheme": ("HTTP",),
    "timeoutSeconds": (1,),
    "periodSeconds": (10,),
    "successThreshold": (1,),
    "failureThreshold": (3,),
    "defaultMode": (420,),
    "revisionHistoryLimit": (10,),
    "progressDeadlineSeconds": (600,),
    "sessionAffinity": ("None",),
    "internalTrafficPolicy": ("Cluster",),
    "type": ("ClusterIP", "Opaque"),
    "selectPolicy": ("Max",),
    "apiVersion": ("v1",),  # env valueFrom.fieldRef
}


def _extra_allowed(key: str, value: Any, live: Mapping[str, Any]) -> bool:
    if key in SERVER_OWNED:
        return True
    if key == "targetPort":  # defaults to the port itself
        return bool(value == live.get("port"))
    return any(_same(default, value) for default in SERVER_DEFAULTS.get(key, ()))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def drift(desired: Any, live: Any, path: str = "", lenient: bool = False) -> list[str]:
    """Where `live` departs from what we render, as JSON-ish paths (empty: in line).

    Every rendered field must be there with its value (an empty list or map may be absent,
    as the API server omits them) and every list must match element by element. A field we
    do not render counts too (someone added `hostNetwork` or `privileged`), unless
    Kubernetes owns it (`SERVER_OWNED`) or it holds the server's default (`SERVER_DEFAULTS`).
    Under `metadata` only our own keys count: other tools' labels, annotations and the
    server's bookkeeping are not ours to remove.
    """
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return [path or "."]
        found: list[str] = []
        for key, value in desired.items():
            where = f"{path}.{key}"
            if key not in live:
                # The API server leaves empty lists and maps out of what it returns
                # (`tolerations: []` of a pool without any): absent is what we asked for.
                if value != [] and value != {}:
                    found.append(where)
            else:
                found += drift(value, live[key], where, lenient or key == "metadata")
        if not lenient:
            found += [
                f"{path}.{key}"
                for key, value in live.items()
                if key not in desired and not _extra_allowed(key, value, live)
            ]
        return found
    if isinstance(desired, list):
        if not isinstance(live, list) or len(desired) != len(live):
            return [path or "."]
        found = []
        for index, (d, x) in enumerate(zip(desired, live, strict=True)):
            found += drift(d, x, f"{path}[{index}]", lenient)
        return found
    return [] if _same(desired, live) else [path or "."]


def in_line(desired: Any, live: Any) -> bool:
    """Whether `live` already is what we render (see `drift`)."""
    return not drift(_content(desired), _content(live))


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    # apiVersion and kind identify the object (the URL says them); some answers omit them.
    return {k: v for k, v in obj.items() if k not in ("apiVersion", "kind")}


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


def _with_removals(desired: Any, live: Any, lenient: bool = False) -> Any:
    """`desired` as a merge patch over `live`: fields that are drift are set to null."""
    if not isinstance(desired, Mapping):
        return desired
    live_map = live if isinstance(live, Mapping) else {}
    patch = {
        k: _with_removals(v, live_map.get(k), lenient or k == "metadata")
        for k, v in desired.items()
    }
    if not lenient:
        patch.update(
            {
                k: None
                for k, v in live_map.items()
                if k not in desired and not _extra_allowed(k, v, live_map)
            }
        )
    return patch


def _patch_of(desired: Mapping[str, Any], live: Mapping[str, Any]) -> dict[str, Any]:
    # apiVersion/kind/name/namespace identify the object; everything else is ours to set.
    patch = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind")}
    meta = {k: v for k, v in desired["metadata"].items() if k not in ("name", "namespace")}
    patch["metadata"] = meta
    result: dict[str, Any] = _with_removals(patch, _content(live))
    return result


async def ensure(
    client: KubeClient,
    desired: dict[str, Any],
    cache: ObjectCache | None = None,
    patch_existing: bool = True,
) -> tuple[Outcome, dict[str, Any]]:
    """Make the live object hold `desired`: create it, patch it, or leave it alone.

    With a cache, the live object is the cached one when there is one (no read); a child the
    cache lacks is read. `patch_existing=False` creates only: an object that exists (made by
    a concurrent pass meanwhile) is returned as it is, for kinds whose spec the API server
    will not let us patch (a Job's pod template and selector are immutable).
    """
    resource = resource_of(desired)
    namespace = desired["metadata"]["namespace"]
    name = desired["metadata"]["name"]
    live = cache.lookup(resource.plural, namespace, name) if cache is not None else None
    if live is None:
        live = await client.get(resource, namespace, name)
    if live is None:
        try:
            created = await client.create(desired)
        except ApiError as error:
            if error.status != 409:
                raise
            # Created by a concurrent reconcile since our read: patch it instead.
            live = await client.get(resource, namespace, name)
            if live is None:
                raise
        else:
            if cache is not None:
                cache.seen(resource.plural, created)
            return "created", created
    if cache is not None:
        cache.seen(resource.plural, live)
    if not patch_existing or in_line(desired, live):
        return "unchanged", live
    patched = await client.patch(resource, namespace, name, _patch_of(desired, live))
    if cache is not None:
        cache.seen(resource.plural, patched)
    left = drift(_content(desired), _content(patched))
    if left:
        # The server put back what we removed: a default SERVER_DEFAULTS lacks. Say so, since
        # every pass would patch the object again.
        logger.warning(
            "%s %s/%s still differs after a patch at %s",
            desired["kind"],
            namespace,
            name,
            ", ".join(left),
        )
    return "patched", patched
