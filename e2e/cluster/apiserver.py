"""A Kubernetes API for tests: the KMock emulator plus what a real API server does.

KMock stores objects as sent and serves them back. A real API server also sets object
metadata, splits `status` from the rest, collects garbage, and serves what `kubectl` needs:
typed lists, discovery of subresources, OpenAPI for client-side validation, server-side
tables (printer columns), strategic merge patches and the `scale` subresource. Those are
scripted here, in one class, so that the operator tests and the e2e suite drive the emulator
with the same requests (and the same `kubectl` commands) a user sends to kind.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import functools
import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock
import yaml
from kmock._internal import enums, parsing, references, rendering

_parse_path = parsing.parse_path


def _parse_path_with_namespaces(path: str) -> parsing.ParsedPath:
    """KMock 0.8 reads `/api/v1/namespaces[/NAME[/status]]` as a namespace scope without a
    resource (and fails on the bare list); they are the `namespaces` resource itself."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and (
        len(parts) <= 4 or (len(parts) == 5 and parts[4] in ("status", "finalize"))
    ):
        return parsing.ParsedPath(
            group="",
            version="v1",
            plural="namespaces",
            name=parts[3] if len(parts) > 3 else None,
            subresource=parts[4] if len(parts) > 4 else None,
        )
    return _parse_path(path)


parsing.parse_path = _parse_path_with_namespaces

# The built-in kinds the chart, the operator and the local cluster use, as a 1.35 API server
# serves them (verbs and subresources as in its discovery documents).
_ALL_VERBS = frozenset(
    {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}
)


@dataclass(frozen=True)
class BuiltinKind:
    resource: str  # "group/version/plural"
    kind: str
    namespaced: bool = True
    shortnames: frozenset[str] = frozenset()
    subresources: frozenset[str] = frozenset()
    categories: frozenset[str] = frozenset()


BUILTIN_KINDS: tuple[BuiltinKind, ...] = (
    BuiltinKind("v1/namespaces", "Namespace", False, frozenset({"ns"}), frozenset({"status"})),
    BuiltinKind("v1/pods", "Pod", True, frozenset({"po"}), frozenset({"status"}),
                frozenset({"all"})),
    BuiltinKind("v1/services", "Service", True, frozenset({"svc"}), frozenset({"status"}),
                frozenset({"all"})),
    BuiltinKind("v1/endpoints", "Endpoints", True, frozenset({"ep"})),
    BuiltinKind("v1/configmaps", "ConfigMap", True, frozenset({"cm"})),
    BuiltinKind("v1/secrets", "Secret"),
    BuiltinKind("v1/serviceaccounts", "ServiceAccount", True, frozenset({"sa"})),
    BuiltinKind("v1/persistentvolumeclaims", "PersistentVolumeClaim", True, frozenset({"pvc"}),
                frozenset({"status"})),
    BuiltinKind("v1/events", "Event", True, frozenset({"ev"})),
    BuiltinKind("apps/v1/deployments", "Deployment", True, frozenset({"deploy"}),
                frozenset({"status", "scale"}), frozenset({"all"})),
    BuiltinKind("apps/v1/replicasets", "ReplicaSet", True, frozenset({"rs"}),
                frozenset({"status", "scale"}), frozenset({"all"})),
    BuiltinKind("batch/v1/jobs", "Job", True, frozenset(), frozenset({"status"}),
                frozenset({"all"})),
    BuiltinKind("autoscaling/v2/horizontalpodautoscalers", "HorizontalPodAutoscaler", True,
                frozenset({"hpa"}), frozenset({"status"}), frozenset({"all"})),
    BuiltinKind("policy/v1/poddisruptionbudgets", "PodDisruptionBudget", True,
                frozenset({"pdb"}), frozenset({"status"})),
    BuiltinKind("rbac.authorization.k8s.io/v1/roles", "Role"),
    BuiltinKind("rbac.authorization.k8s.io/v1/rolebindings", "RoleBinding"),
    BuiltinKind("rbac.authorization.k8s.io/v1/clusterroles", "ClusterRole", False),
    BuiltinKind("rbac.authorization.k8s.io/v1/clusterrolebindings", "ClusterRoleBinding", False),
    BuiltinKind("apiextensions.k8s.io/v1/customresourcedefinitions", "CustomResourceDefinition",
                False, frozenset({"crd", "crds"}), frozenset({"status"})),
    BuiltinKind("coordination.k8s.io/v1/leases", "Lease"),
)

# Where a subresource lives in its object; the `scale` of built-in kinds.
_BUILTIN_SCALE = {
    "deployments": (".spec.replicas", ".status.replicas", ".status.selector"),
    "replicasets": (".spec.replicas", ".status.replicas", ".status.selector"),
}

# Server-side printer columns of the built-in kinds `kubectl get` shows (name, JSONPath, type).
_BUILTIN_COLUMNS: dict[str, list[dict[str, str]]] = {
    "Deployment": [
        {"name": "Ready", "type": "string", "jsonPath": "@ready"},
        {"name": "Up-to-date", "type": "integer", "jsonPath": ".status.updatedReplicas"},
        {"name": "Available", "type": "integer", "jsonPath": ".status.availableReplicas"},
    ],
    "Pod": [
        {"name": "Ready", "type": "string", "jsonPath": "@ready"},
        {"name": "Status", "type": "string", "jsonPath": ".status.phase"},
        {"name": "Restarts", "type": "integer", "jsonPath": "@restarts"},
        {"name": "IP", "type": "string", "jsonPath": ".status.podIP"},
    ],
    "Job": [
        {"name": "Status", "type": "string", "jsonPath": "@job"},
        {"name": "Completions", "type": "string", "jsonPath": "@completions"},
    ],
    "Service": [
        {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
        {"name": "Cluster-IP", "type": "string", "jsonPath": ".spec.clusterIP"},
    ],
}
_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


@dataclass
class CustomKind:
    """What the API server keeps of an applied CustomResourceDefinition."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    schema: dict[str, Any]
    columns: list[dict[str, Any]] = field(default_factory=list)
    scale: tuple[str, str, str] | None = None


class ScriptedKubernetes(kmock.KubernetesEmulator):  # type: ignore[misc]
    """KMock plus the parts of a real API server the operator and `kubectl` rely on.

    KMock stores objects as sent. A real API server also: sets `metadata.namespace`, `uid`,
    `resourceVersion`, `creationTimestamp` and `generation` (bumped on spec changes only);
    keeps `status` out of main-resource writes and everything but `status` out of
    `/status` writes; and garbage-collects objects whose owners are all gone. Those are
    scripted here. CEL validation and conflicts (409 on a stale resourceVersion) are not:
    the operator sends no resourceVersion, and CEL is checked offline in tests/unit/operator.

    For `kubectl`, it also: names lists (`DeploymentList`), lists subresources in discovery
    as a real server does (no short names of their own), serves `/openapi/v2` built from the
    built-in types' schemas (kubernetes-validate) and the applied CRDs' own schemas, renders
    `as=Table` responses with the CRDs' printer columns, applies strategic merge patches
    (lists merged by their merge key), serves `scale` of Deployments and of CRDs that declare
    it, filters lists by `labelSelector`, fills `metadata.generateName`, and registers a
    CustomResourceDefinition's resource when one is applied.
    """

    _versions = itertools.count(1)
    # Every write served, as "METHOD /path", for the tests' zero-write assertions.
    writes: list[str]
    # Paths whose next PATCHes answer 409 Conflict, as a busy API server sometimes does.
    conflicts: dict[str, int]
    # When set, requests without this bearer token get 401 (an expired service-account token).
    required_token: str | None = None
    # Applied CRDs by "group/version/plural".
    custom_kinds: dict[str, CustomKind]

    async def _handle(self, request: rendering.Request) -> Any:
        try:
            return await self._serve(request)
        finally:
            # KMock matches each request against its whole request log, so serving N requests
            # would cost O(N^2); the log keeps only requests in flight (counts: `writes`).
            self._requests[:] = [r for r in self._requests if r is not request]

    def _state(self) -> None:
        if not hasattr(self, "writes"):
            self.writes, self.conflicts, self.custom_kinds = [], {}, {}

    async def _serve(self, request: rendering.Request) -> Any:
        self._state()
        if request.method in ("PATCH", "PUT", "POST"):
            self.writes.append(f"{request.method} {request.url.path}")
        if self.required_token is not None:
            if request.headers.get("Authorization") != f"Bearer {self.required_token}":
                raise kmock.KubernetesError(status=401, reason="Unauthorized", message="token")
        if request.method == "PATCH" and self.conflicts.get(request.url.path, 0) > 0:
            self.conflicts[request.url.path] -= 1
            raise kmock.KubernetesError(
                status=409, reason="Conflict", message="the object has been modified"
            )
        if "protobuf" in request.headers.get("Content-Type", ""):
            # kubectl's typed generators (`create namespace`, `create secret`) send protobuf;
            # `kubectl apply -f` and `create -f` send JSON, which is all that is emulated.
            raise kmock.KubernetesError(
                status=415, reason="UnsupportedMediaType",
                message="protobuf bodies are not emulated: use kubectl apply -f with JSON/YAML",
            )
        if request.url.path.startswith("/openapi/v3"):
            return await self._respond(request, self._openapi_v3(request.url.path))
        if request.url.path.startswith("/openapi/v2"):
            # kubectl asks for v2 in protobuf only, which is not served: with v3 documents
            # that offer `fieldValidation`, it validates on the server instead (below).
            raise kmock.KubernetesError(
                status=406, reason="NotAcceptable", message="OpenAPI v2 is served as JSON only"
            )
        if request.subresource == "scale" and request.resource is not None:
            return await self._respond(request, await self._serve_scale(request))
        if request.resource is not None and request.params.get("dryRun"):
            raise kmock.KubernetesError(
                status=400, reason="BadRequest", message="dry runs are not emulated"
            )
        content_type = request.headers.get("Content-Type", "")
        if "strategic-merge-patch" in content_type and isinstance(request.data, dict):
            self._script_strategic_patch(request)
        if request.method == "PUT" and isinstance(request.data, dict) and request.name:
            # A replace: fields the new object lacks go away (KMock would merge them).
            self._script_replace(request)
        if request.params.get("fieldValidation") in ("Strict", "Warn") and isinstance(
            request.data, dict
        ):
            self._validate(request)
        if request.resource is not None and isinstance(request.data, dict):
            if request.action == enums.action.CREATE:
                meta = request.data.setdefault("metadata", {})
                if request.namespace and not meta.get("namespace"):
                    meta["namespace"] = request.namespace
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
                meta["uid"] = str(uuid.uuid4())
                meta["resourceVersion"] = str(next(self._versions))
                meta["generation"] = 1
                meta["creationTimestamp"] = _now()
            elif request.action == enums.action.UPDATE:
                self._script_update(request)
        elif request.action == enums.action.UPDATE and isinstance(request.data, list):
            await self._script_json_patch(request)
        if _wants_table(request) and request.action in (enums.action.LIST, enums.action.FETCH):
            return await self._respond(request, await self._table(request))
        response = await super()._handle(request)
        if request.resource is not None and request.resource.plural == "customresourcedefinitions":
            if request.action in (enums.action.CREATE, enums.action.UPDATE):
                self._register_crds()
        # Owners disappear on DELETE, or on the JSON patch that removes their last finalizer.
        if request.action == enums.action.DELETE or (
            request.action == enums.action.UPDATE and isinstance(request.data, list)
        ):
            await self._collect_garbage()
        return response

    async def _respond(self, request: rendering.Request, payload: Any) -> Any:
        return await kmock.Response(payload=payload)(request)

    # -- metadata, status split, generations -------------------------------------------------

    def _script_update(self, request: rendering.Request) -> None:
        data = request.data
        if request.subresource == "status":
            for key in list(data):
                if key != "status":
                    del data[key]
        else:
            data.pop("status", None)
        meta = data.setdefault("metadata", {})
        meta.pop("generation", None)
        for immutable in ("uid", "creationTimestamp", "namespace", "name"):
            meta.pop(immutable, None)
        meta["resourceVersion"] = str(next(self._versions))
        key = (request.resource, request.namespace, request.name)
        if "spec" in data and key in self._objects and not self._objects[key].deleted:
            current = self._objects[key].raw
            merged = _merge(current.get("spec") or {}, data["spec"])
            if merged != current.get("spec"):
                meta["generation"] = int(current["metadata"].get("generation") or 1) + 1

    def _script_replace(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return
        current = self._objects[key].raw
        # KMock merges dicts: delete, as null, every top-level field the new object lacks.
        scope = ("status",) if request.subresource == "status" else ("spec", "data", "rules")
        for name in scope:
            if name in current and name not in request.data:
                request.data[name] = None
            elif isinstance(current.get(name), dict) and isinstance(request.data.get(name), dict):
                request.data[name] = _replacement(current[name], request.data[name])

    def _script_strategic_patch(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        current: Any = {}
        if key in self._objects and not self._objects[key].deleted:
            current = self._objects[key].raw
        merge = _strategic_to_merge(current, request.data)
        request.data.clear()  # the request is frozen; its data is not
        request.data.update(merge)

    async def _script_json_patch(self, request: rendering.Request) -> None:
        # kopf adds and removes finalizers with a JSON patch guarded by a `test` of
        # resourceVersion; a real API server answers 422 when the test fails, and kopf retries
        # on the next watch event, which a real watch (resumed from a resourceVersion) always
        # delivers for the newer version. KMock would answer 500, and its watches replay
        # current objects instead of resuming, so kopf can miss that version: answer 422 and
        # send the current object again.
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            return
        current = self._objects[key].raw["metadata"].get("resourceVersion")
        for op in request.data:
            if op.get("op") == "test" and op.get("path") == "/metadata/resourceVersion":
                if op.get("value") != current:
                    raw = self._objects[key].raw
                    await self._buses[key[0]].put({"type": "MODIFIED", "object": raw})
                    raise kmock.KubernetesError(
                        status=422, reason="Invalid", message="resourceVersion test failed"
                    )
        request.data.append(
            {
                "op": "replace",
                "path": "/metadata/resourceVersion",
                "value": str(next(self._versions)),
            }
        )

    async def _collect_garbage(self) -> None:
        # As Kubernetes' garbage collector: delete dependents whose owners are all gone, and
        # drop the references to deleted owners from dependents that still have a live one.
        while True:
            alive = {
                obj.raw["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted
            }
            orphans = [
                (key, obj)
                for key, obj in self._objects.items()
                if not obj.deleted
                and obj.raw["metadata"].get("ownerReferences")
                and not any(
                    ref.get("uid") in alive for ref in obj.raw["metadata"]["ownerReferences"]
                )
            ]
            for key, obj in list(self._objects.items()):
                refs = [] if obj.deleted else obj.raw["metadata"].get("ownerReferences") or []
                kept = [r for r in refs if r.get("uid") in alive]
                if kept and len(kept) != len(refs):
                    obj.patch({"metadata": {"ownerReferences": kept}})
                    await self._buses[key[0]].put({"type": "MODIFIED", "object": obj.raw})
            if not orphans:
                return
            for (resource, _, _), obj in orphans:
                raw = obj.raw
                obj.delete()
                await self._buses[resource].put({"type": "DELETED", "object": raw})

    # -- lists, discovery ---------------------------------------------------------------------

    async def _serve_list(self, request: rendering.Request) -> Any:
        result = await super()._serve_list(request)
        info = self._info(request.resource)
        group_version = _group_version(request.resource)
        selector = request.params.get("labelSelector")
        items = result["items"]
        if selector:
            items = [item for item in items if selector_matches(selector, item)]
        field_selector = request.params.get("fieldSelector")
        if field_selector:
            items = [item for item in items if _fields_match(field_selector, item)]
        version = str(max((int(_rv(i)) for i in items), default=0) or next(self._versions))
        return {
            "apiVersion": group_version,
            "kind": f"{info.kind}List" if info and info.kind else "List",
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    async def _serve_version(self, request: rendering.Request) -> Any:
        result = await super()._serve_version(request)
        result["groupVersion"] = result["groupVersion"].lstrip("/")
        for entry in result["resources"]:
            name = entry["name"]
            if "/" not in name:
                continue
            sub = name.split("/", 1)[1]
            entry["singularName"] = ""
            entry["shortNames"] = []
            entry["categories"] = []
            entry["verbs"] = ["get", "patch", "update"]
            if sub == "scale":
                entry.update({"kind": "Scale", "group": "autoscaling", "version": "v1"})
        return result

    def _info(self, resource: references.resource | None) -> references.ResourceInfo | None:
        if resource is None:
            return None
        for known in self._resources:
            if known == resource:
                info: references.ResourceInfo = self._resources[known]
                return info
        return None

    def add_builtin_kinds(self) -> None:
        """Declare the built-in kinds the chart, the operator and the local cluster use."""
        for builtin in BUILTIN_KINDS:
            singular = builtin.kind.lower()
            self.resources[builtin.resource] = kmock.ResourceInfo(
                kind=builtin.kind,
                singular=singular,
                namespaced=builtin.namespaced,
                shortnames=set(builtin.shortnames),
                categories=set(builtin.categories),
                subresources=set(builtin.subresources),
                verbs=set(_ALL_VERBS),
            )

    def _register_crds(self) -> None:
        self._state()
        for (resource, _, _), obj in list(self._objects.items()):
            if resource.plural != "customresourcedefinitions" or obj.deleted:
                continue
            spec = obj.raw.get("spec") or {}
            names = spec.get("names") or {}
            for version in spec.get("versions") or []:
                if not version.get("served", True):
                    continue
                name = f"{spec['group']}/{version['name']}/{names['plural']}"
                subresources = version.get("subresources") or {}
                scale = subresources.get("scale")
                self.custom_kinds[name] = CustomKind(
                    group=spec["group"],
                    version=version["name"],
                    plural=names["plural"],
                    kind=names["kind"],
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    schema=(version.get("schema") or {}).get("openAPIV3Schema") or {},
                    columns=list(version.get("additionalPrinterColumns") or []),
                    scale=(
                        scale["specReplicasPath"],
                        scale["statusReplicasPath"],
                        scale.get("labelSelectorPath", ""),
                    )
                    if scale
                    else None,
                )
                self.resources[name] = kmock.ResourceInfo(
                    kind=names["kind"],
                    singular=names.get("singular") or names["kind"].lower(),
                    namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                    shortnames=set(names.get("shortNames") or []),
                    categories=set(names.get("categories") or []),
                    subresources=set(subresources),
                    verbs=set(_ALL_VERBS),
                )

    # -- scale ---------------------------------------------------------------------------------

    async def _serve_scale(self, request: rendering.Request) -> dict[str, Any]:
        assert request.resource is not None
        paths = self._scale_paths(request.resource)
        if paths is None:
            raise kmock.KubernetesNotFoundError(message="this resource has no scale subresource")
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self._objects or self._objects[key].deleted:
                raise kmock.KubernetesObjectNotFoundError()
            obj = self._objects[key]
            if request.method in ("PUT", "PATCH"):
                self.writes.append(f"{request.method} {request.url.path}")
                data = request.data if isinstance(request.data, dict) else {}
                replicas = (data.get("spec") or {}).get("replicas")
                if not isinstance(replicas, int) or replicas < 0:
                    raise kmock.KubernetesError(
                        status=422, reason="Invalid",
                        message=f"spec.replicas: must be a non-negative integer, got {replicas!r}",
                    )
                obj.patch(
                    _nested(paths[0], replicas)
                    | {
                        "metadata": {
                            "resourceVersion": str(next(self._versions)),
                            "generation": int(obj.raw["metadata"].get("generation") or 1) + 1,
                        }
                    }
                )
                await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
            raw = obj.raw
        selector = _jsonpath(raw, paths[2]) if paths[2] else None
        if isinstance(selector, dict):
            selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: raw["metadata"].get(k)
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            },
            "spec": {"replicas": _jsonpath(raw, paths[0]) or 0},
            "status": {"replicas": _jsonpath(raw, paths[1]) or 0, "selector": selector or ""},
        }

    def _scale_paths(self, resource: references.resource) -> tuple[str, str, str] | None:
        name = f"{resource.group}/{resource.version}/{resource.plural}".lstrip("/")
        custom = self.custom_kinds.get(name)
        if custom is not None:
            return custom.scale
        builtin = _BUILTIN_SCALE.get(resource.plural or "")
        if builtin and resource.plural == "deployments":
            # A Deployment's scale selector is its spec's, as a string.
            return builtin[0], builtin[1], ".spec.selector.matchLabels"
        return builtin

    # -- tables --------------------------------------------------------------------------------

    async def _table(self, request: rendering.Request) -> dict[str, Any]:
        assert request.resource is not None
        if request.action == enums.action.FETCH:
            objects = [await self._serve_fetch(request)]
        else:
            objects = (await self._serve_list(request))["items"]
        name = f"{request.resource.group}/{request.resource.version}/{request.resource.plural}"
        custom = self.custom_kinds.get(name.lstrip("/"))
        info = self._info(request.resource)
        if custom is not None:
            columns = [c for c in custom.columns if c.get("priority", 0) == 0]
            if not any(c["name"] == "Age" for c in columns):
                columns.append(_AGE)
        else:
            columns = [*_BUILTIN_COLUMNS.get(info.kind if info else "", []), _AGE]
        definitions = [{"name": "Name", "type": "string", "format": "name"}] + [
            {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", "")}
            for c in columns
        ]
        rows = []
        for obj in objects:
            cells: list[Any] = [obj["metadata"]["name"]]
            for column in columns:
                cells.append(_cell(obj, column))
            partial = {
                "apiVersion": "meta.k8s.io/v1",
                "kind": "PartialObjectMetadata",
                "metadata": obj["metadata"],
            }
            rows.append({"cells": cells, "object": partial})
        return {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "Table",
            "metadata": {"resourceVersion": str(next(self._versions))},
            "columnDefinitions": definitions,
            "rows": rows,
        }

    # -- OpenAPI and validation --------------------------------------------------------------

    def _served_kinds(self) -> dict[str, list[tuple[str, str]]]:
        """Served kinds by group-version path ("api/v1", "apis/apps/v1"): (kind, plural)."""
        out: dict[str, list[tuple[str, str]]] = {}
        for resource in self._get_resources():
            info = self._info(resource)
            if info is None or info.kind is None or resource.plural is None:
                continue
            path = f"apis/{resource.group}/{resource.version}" if resource.group else "api/v1"
            out.setdefault(path, []).append((info.kind, resource.plural))
        return out

    def _openapi_v3(self, path: str) -> dict[str, Any]:
        served = self._served_kinds()
        if path.rstrip("/") == "/openapi/v3":
            return {
                "paths": {
                    gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={len(kinds)}"}
                    for gv, kinds in served.items()
                }
            }
        gv = path.removeprefix("/openapi/v3/").strip("/")
        if gv not in served:
            raise kmock.KubernetesNotFoundError(message=f"no OpenAPI document for {gv}")
        group, _, version = gv.removeprefix("apis/").removeprefix("api/").rpartition("/")
        schemas = _builtin_v3_schemas()
        components: dict[str, Any] = {}
        paths: dict[str, Any] = {}
        for kind, plural in served[gv]:
            gvk = {"group": group, "version": version, "kind": kind}
            custom = self.custom_kinds.get(f"{group}/{version}/{plural}")
            name = f"{'.'.join(reversed(group.split('.')))}.{version}.{kind}" if custom else None
            if custom is not None and name is not None:
                components[name] = dict(custom.schema, **{"x-kubernetes-group-version-kind": [gvk]})
            else:
                name = _builtin_schema_name(group, version, kind)
                if name is not None:
                    components.update(_reachable(schemas, name))
            operation = {
                "x-kubernetes-group-version-kind": gvk,
                "parameters": [
                    {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}},
                    {"name": "fieldManager", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": {"description": "OK"}},
            }
            base = f"/{gv}/namespaces/{{namespace}}/{plural}/{{name}}"
            paths[base] = {"patch": operation, "put": operation}
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.35.0"},
            "paths": paths,
            "components": {"schemas": components},
        }

    def _validate(self, request: rendering.Request) -> None:
        """Strict field validation as `kubectl apply` asks: schema errors and unknown fields."""
        if request.resource is None or request.subresource:
            return
        data: Any = request.data
        key = (request.resource, request.namespace, request.name)
        if request.method == "PATCH":
            if key not in self._objects or self._objects[key].deleted:
                return
            data = _merge(copy.deepcopy(self._objects[key].raw), data)
        name = f"{request.resource.group}/{request.resource.version}/{request.resource.plural}"
        custom = self.custom_kinds.get(name.lstrip("/"))
        if custom is not None:
            errors = _schema_errors(custom.schema, data)
        else:
            errors = _builtin_errors(data)
        if errors:
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f"{data.get('kind')} {data.get('metadata', {}).get('name')!r} is "
                f"invalid: " + "; ".join(errors[:5]),
            )


# -- helpers ------------------------------------------------------------------------------------


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rv(item: Mapping[str, Any]) -> str:
    value = str((item.get("metadata") or {}).get("resourceVersion") or "0")
    return value if value.isdigit() else "0"


def _group_version(resource: references.resource | None) -> str:
    if resource is None or not resource.group:
        return "v1"
    return f"{resource.group}/{resource.version}"


def _merge(base: Any, patch: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(base.get(key), value)
    return out


def _replacement(current: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A merge patch that turns `current` into `new` (keys it lacks become null)."""
    out: dict[str, Any] = {}
    for key, value in new.items():
        old = current.get(key)
        out[key] = _replacement(old, value) if isinstance(old, dict) and isinstance(
            value, dict
        ) else value
    for key in current:
        if key not in new:
            out[key] = None
    return out


def _strategic_to_merge(current: Any, patch: Any) -> Any:
    """A strategic merge patch as the JSON merge patch it amounts to on `current`.

    Lists with a merge key (`$setElementOrder/<field>` names it, as kubectl sends) are merged
    element by element by that key, with `$patch: delete` removing one; other lists replace.
    `$retainKeys` and `$deleteFromPrimitiveList` are not emulated.
    """
    if not isinstance(patch, dict):
        return patch
    current = current if isinstance(current, dict) else {}
    out: dict[str, Any] = {}
    if patch.get("$patch") == "replace":
        return {k: v for k, v in patch.items() if not k.startswith("$")}
    orders = {k.split("/", 1)[1]: v for k, v in patch.items() if k.startswith("$setElementOrder/")}
    for key, value in patch.items():
        if key.startswith("$"):
            continue
        old = current.get(key)
        if isinstance(value, list) and (key in orders or _has_merge_key(value)):
            out[key] = _merge_list(old if isinstance(old, list) else [], value, orders.get(key))
        elif isinstance(value, dict):
            out[key] = _strategic_to_merge(old, value)
        else:
            out[key] = value
    for key, order in orders.items():
        if key not in out and isinstance(current.get(key), list):
            out[key] = _merge_list(current[key], [], order)
    return out


_MERGE_KEYS = ("name", "mountPath", "containerPort", "port", "type", "ip", "topologyKey")


def _has_merge_key(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "$patch" in i for i in items)


def _merge_key(items: Iterable[Any]) -> str | None:
    for key in _MERGE_KEYS:
        if all(isinstance(i, dict) and key in i for i in items):
            return key
    return None


def _merge_list(current: list[Any], patch: list[Any], order: list[Any] | None) -> list[Any]:
    key = _merge_key([*(order or []), *patch])
    if key is None:
        return [item for item in patch if not (isinstance(item, dict) and "$patch" in item)]
    by_key = {item.get(key): item for item in current if isinstance(item, dict)}
    deleted = set()
    for item in patch:
        name = item.get(key)
        if item.get("$patch") == "delete":
            deleted.add(name)
            continue
        by_key[name] = _merge(by_key.get(name), _strategic_to_merge(by_key.get(name), item))
    names = [i.get(key) for i in order] if order else list(by_key)
    names += [n for n in by_key if n not in names]
    return [by_key[n] for n in names if n in by_key and n not in deleted]


def _nested(path: str, value: Any) -> dict[str, Any]:
    parts = [p for p in path.split(".") if p]
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    assert isinstance(out, dict)
    return out


_FILTER = re.compile(r'\[\?\(@\.([\w.]+)\s*==\s*["\']([^"\']*)["\']\)\]')


def _jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath CRD printer columns use: `.a.b`, `[N]`, `[?(@.k=="v")]`."""
    tokens = re.findall(r"\[\?\([^\]]*\)\]|\[\d+\]|\.[\w-]+|\[\*\]", path)
    values: list[Any] = [obj]
    for token in tokens:
        found: list[Any] = []
        for value in values:
            if token.startswith("."):
                if isinstance(value, dict) and token[1:] in value:
                    found.append(value[token[1:]])
            elif token == "[*]":
                found.extend(value if isinstance(value, list) else [])
            elif token.startswith("[?"):
                match = _FILTER.fullmatch(token)
                if match and isinstance(value, list):
                    field_path, wanted = match.groups()
                    for item in value:
                        got = _jsonpath(item, "." + field_path)
                        if got is not None and str(got) == wanted:
                            found.append(item)
            else:
                index = int(token[1:-1])
                if isinstance(value, list) and index < len(value):
                    found.append(value[index])
        values = found
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _cell(obj: Mapping[str, Any], column: Mapping[str, Any]) -> Any:
    path = str(column["jsonPath"])
    status = obj.get("status") or {}
    if path == "@ready" and obj.get("kind") == "Pod":
        statuses = status.get("containerStatuses") or []
        total = len((obj.get("spec") or {}).get("containers") or [])
        return f"{sum(1 for s in statuses if s.get('ready'))}/{total}"
    if path == "@ready":
        return f"{status.get('readyReplicas') or 0}/{(obj.get('spec') or {}).get('replicas', 1)}"
    if path == "@restarts":
        return sum(int(s.get("restartCount") or 0) for s in status.get("containerStatuses") or [])
    if path == "@job":
        for condition in status.get("conditions") or []:
            if condition.get("status") == "True" and condition.get("type") in (
                "Complete", "Failed"
            ):
                return str(condition["type"])
        return "Running"
    if path == "@completions":
        wanted = (obj.get("spec") or {}).get("completions", 1)
        return f"{status.get('succeeded') or 0}/{wanted}"
    value = _jsonpath(obj, path)
    if value is None:
        return None
    if column.get("type") == "date" and isinstance(value, str):
        return _age(value)
    if column.get("type") == "integer" and isinstance(value, (int, float)):
        return value
    return value if isinstance(value, str) else json.dumps(value)


def _age(timestamp: str) -> str:
    """A timestamp as the short age `kubectl get` shows (the server renders it)."""
    try:
        then = datetime.datetime.strptime(timestamp, "%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return timestamp
    seconds = int((datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - then).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds < 600 else f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60}m"


def _wants_table(request: rendering.Request) -> bool:
    accept = request.headers.get("Accept", "")
    return "as=Table" in accept and request.resource is not None


def selector_matches(selector: str, obj: Mapping[str, Any]) -> bool:
    """Label selector syntax: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a)`."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    terms = re.findall(r"[^,(]+(?:\([^)]*\))?", selector)
    for raw in terms:
        term = raw.strip()
        if not term:
            continue
        set_match = re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term)
        if set_match:
            key, op, values = set_match.groups()
            allowed = {v.strip() for v in values.split(",")}
            if (labels.get(key) in allowed) != (op == "in"):
                return False
        elif "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _fields_match(selector: str, obj: Mapping[str, Any]) -> bool:
    for term in selector.split(","):
        if not term:
            continue
        negate = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        got = _jsonpath(obj, "." + key)
        if (str(got) == value) == negate:
            return False
    return True


def _gvk_of(name: str, schema: Mapping[str, Any]) -> dict[str, str] | None:
    properties = schema.get("properties") or {}
    api_versions = (properties.get("apiVersion") or {}).get("enum")
    kinds = (properties.get("kind") or {}).get("enum")
    if not api_versions or not kinds or len(kinds) != 1:
        return None
    group, _, version = str(api_versions[0]).rpartition("/")
    return {"group": group, "version": version, "kind": str(kinds[0])}


# -- serving ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServedApi:
    """A running emulator: its URL, a kubeconfig that points at it, and the emulator."""

    url: str
    kubeconfig: Path
    emulator: ScriptedKubernetes


def write_kubeconfig(path: Path, server: str, token: str = "kmock") -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "kmock", "user": {"token": token}}],
                "contexts": [
                    {
                        "name": "kmock",
                        "context": {"cluster": "kmock", "user": "kmock", "namespace": "default"},
                    }
                ],
                "current-context": "kmock",
            }
        )
    )
    return path


@contextlib.asynccontextmanager
async def serve_api(
    workdir: Path,
    host: str = "127.0.0.1",
    setup: Callable[[ScriptedKubernetes], None] | None = None,
) -> AsyncIterator[ServedApi]:
    """The emulator with the built-in kinds on a loopback port, and a kubeconfig for it."""
    async with ScriptedKubernetes() as emulator, kmock.Server(emulator, host=host) as server:
        emulator.add_builtin_kinds()
        if setup is not None:
            setup(emulator)
        url = str(server.url).rstrip("/")
        workdir.mkdir(parents=True, exist_ok=True)
        kubeconfig = write_kubeconfig(workdir / "kubeconfig", url)
        yield ServedApi(url=url, kubeconfig=kubeconfig, emulator=emulator)


# -- schemas --------------------------------------------------------------------------------------

_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")


def _schema_errors(schema: Mapping[str, Any], data: Any) -> list[str]:
    """A CRD's structural schema on an object: JSON Schema errors plus unknown fields."""
    import jsonschema

    body = {k: v for k, v in data.items() if k not in ("metadata", "status")}
    plain = {k: v for k, v in schema.items() if k != "properties"}
    properties = {
        k: v for k, v in (schema.get("properties") or {}).items() if k not in ("metadata", "status")
    }
    validator = jsonschema.Draft7Validator(dict(plain, properties=properties))
    errors = [
        f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(body)
    ]
    return errors + [f'unknown field "{p}"' for p in _unknown_fields(schema, body, "")]


def _unknown_fields(schema: Mapping[str, Any], value: Any, at: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    if isinstance(value, dict) and "properties" in schema:
        found = []
        for key, item in value.items():
            if key not in schema["properties"]:
                found.append(f"{at}{key}")
            else:
                found += _unknown_fields(schema["properties"][key], item, f"{at}{key}.")
        return found
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return [
            p
            for key, item in value.items()
            for p in _unknown_fields(schema["additionalProperties"], item, f"{at}{key}.")
        ]
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [
            p
            for index, item in enumerate(value)
            for p in _unknown_fields(schema["items"], item, f"{at}[{index}].")
        ]
    return []


def _builtin_errors(data: Mapping[str, Any]) -> list[str]:
    import kubernetes_validate

    plain = copy.deepcopy(dict(data))
    meta = plain.get("metadata") or {}
    for name in _SERVER_FIELDS:
        meta.pop(name, None)
    try:
        kubernetes_validate.validate(plain, _schema_version(), strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.absolute_path)
        return [f"{where or '<root>'}: {error.message}"]
    except kubernetes_validate.SchemaNotFoundError:
        return []  # a kind kubernetes-validate does not know (e.g. ServiceMonitor)
    return []


def _schema_dir() -> Path:
    import kubernetes_validate

    return Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"


@functools.cache
def _schema_version() -> str:
    versions = sorted(
        p.name[1:].split("-")[0] for p in _schema_dir().iterdir() if p.name.endswith("-local")
    )
    for version in versions:
        if version.startswith("1.35."):
            return version
    return versions[-1]


@functools.cache
def _builtin_v3_schemas() -> dict[str, Any]:
    """The built-in types' schemas as OpenAPI v3 components, from kubernetes-validate."""
    path = _schema_dir() / f"v{_schema_version()}-local" / "_definitions.json"
    data = json.loads(path.read_text())
    out: dict[str, Any] = {}
    for name, schema in data["$defs"].items():
        converted = _json_schema_to_v3(schema)
        gvk = _gvk_of(name, schema)
        if gvk is not None:
            converted["x-kubernetes-group-version-kind"] = [gvk]
        out[name] = converted
    return out


def _builtin_schema_name(group: str, version: str, kind: str) -> str | None:
    for name, schema in _builtin_v3_schemas().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            if gvk == {"group": group, "version": version, "kind": kind}:
                return name
    return None


def _reachable(schemas: Mapping[str, Any], name: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    todo = [name]
    while todo:
        current = todo.pop()
        if current in out or current not in schemas:
            continue
        out[current] = schemas[current]
        todo += re.findall(r'"#/components/schemas/([^"]+)"', json.dumps(schemas[current]))
    return out


def _json_schema_to_v3(schema: Any) -> Any:
    """kubernetes-validate's JSON Schema back to the OpenAPI v3 the API server serves."""
    if isinstance(schema, list):
        return [_json_schema_to_v3(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "$ref":
            out["allOf"] = [{"$ref": value.replace("#/$defs/", "#/components/schemas/")}]
        elif key == "type" and isinstance(value, list):
            types = [t for t in value if t != "null"]
            if len(types) == 1:
                out[key] = types[0]
            if "null" in value:
                out["nullable"] = True
        elif key == "enum" and isinstance(schema.get("type"), list):
            continue  # the apiVersion/kind enums kubernetes-validate adds
        elif key in ("oneOf", "anyOf", "not"):
            continue
        elif key in ("properties", "patternProperties"):
            out[key] = {k: _json_schema_to_v3(v) for k, v in value.items()}
        else:
            out[key] = _json_schema_to_v3(value)
    return out
