"""A Kubernetes API for tests: the KMock emulator plus what a real API server does.

KMock stores objects as sent and serves them back. A real API server also sets object
metadata, splits `status` from the rest, collects garbage, and serves what `kubectl` needs:
typed lists, discovery of subresources, OpenAPI for client-side validation, server-side
tables (printer columns), strategic merge patches and the `scale` subresource. Those are
scripted here, in one class, so that the operator tests and the e2e suite drive the emulator
with the same requests (and the same `kubectl` commands) a user sends to kind. Tables,
selectors and patches are in apiserver_views.py; OpenAPI and validation in
apiserver_schemas.py.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import itertools
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml
from kmock._internal import enums, parsing, references, rendering

from .apiserver_schemas import (
    builtin_errors,
    builtin_schema_name,
    builtin_v3_schemas,
    reachable,
    schema_errors,
)
from .apiserver_views import (
    AGE_COLUMN,
    BUILTIN_COLUMNS,
    cell,
    fields_match,
    jsonpath,
    merge,
    nested,
    selector_matches,
    strategic_to_merge,
    wants_table,
)

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


class ScriptedKubernetes(kmock.KubernetesEmulator):
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
    # Requests from the operator (they carry a token; the tests' own do not) with these
    # methods answer 503, as an API server in an outage does.
    outage_methods: frozenset[str] = frozenset()
    # Paths whose next requests from the operator answer 429 with `Retry-After: 1`.
    throttled: dict[str, int]
    # Every request from the operator but watches, as "METHOD /path", to count its reads.
    served: list[str]
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
            self.throttled, self.served = {}, []

    async def _serve(self, request: rendering.Request) -> Any:
        self._state()
        from_operator = "Authorization" in request.headers
        if from_operator and request.params.get("watch") not in ("true", "1"):
            self.served.append(f"{request.method} {request.url.path}")
        if from_operator and request.method in self.outage_methods:
            return aiohttp.web.json_response(_status(503, "ServiceUnavailable"), status=503)
        if from_operator and self.throttled.get(request.url.path, 0) > 0:
            self.throttled[request.url.path] -= 1
            return aiohttp.web.json_response(
                _status(429, "TooManyRequests"), status=429, headers={"Retry-After": "1"}
            )
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
        if wants_table(request) and request.action in (enums.action.LIST, enums.action.FETCH):
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
            for field_name in list(data):
                if field_name != "status":
                    del data[field_name]
        else:
            data.pop("status", None)
        meta = data.setdefault("metadata", {})
        meta.pop("generation", None)
        for immutable in ("uid", "creationTimestamp", "namespace", "name"):
            meta.pop(immutable, None)
        meta["resourceVersion"] = str(next(self._versions))
        key: Any = (request.resource, request.namespace, request.name)
        if "spec" in data and key in self._objects and not self._objects[key].deleted:
            current = self._objects[key].raw
            merged = merge(current.get("spec") or {}, data["spec"])
            if merged != current.get("spec"):
                meta["generation"] = int(current["metadata"].get("generation") or 1) + 1

    def _script_replace(self, request: rendering.Request) -> None:
        key: Any = (request.resource, request.namespace, request.name)
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
        key: Any = (request.resource, request.namespace, request.name)
        current: Any = {}
        if key in self._objects and not self._objects[key].deleted:
            current = self._objects[key].raw
        merge = strategic_to_merge(current, request.data)
        request.data.clear()  # the request is frozen; its data is not
        request.data.update(merge)

    async def _script_json_patch(self, request: rendering.Request) -> None:
        # kopf adds and removes finalizers with a JSON patch guarded by a `test` of
        # resourceVersion; a real API server answers 422 when the test fails, and kopf retries
        # on the next watch event, which a real watch (resumed from a resourceVersion) always
        # delivers for the newer version. KMock would answer 500, and its watches replay
        # current objects instead of resuming, so kopf can miss that version: answer 422 and
        # send the current object again.
        key: Any = (request.resource, request.namespace, request.name)
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
        result: Any = await super()._serve_list(request)
        info = self._info(request.resource)
        group_version = _group_version(request.resource)
        selector = request.params.get("labelSelector")
        items = result["items"]
        if selector:
            items = [item for item in items if selector_matches(selector, item)]
        field_selector = request.params.get("fieldSelector")
        if field_selector:
            items = [item for item in items if fields_match(field_selector, item)]
        version = str(max((int(_rv(i)) for i in items), default=0) or next(self._versions))
        return {
            "apiVersion": group_version,
            "kind": f"{info.kind}List" if info and info.kind else "List",
            "metadata": {"resourceVersion": version},
            "items": items,
        }

    async def _serve_version(self, request: rendering.Request) -> Any:
        result: Any = await super()._serve_version(request)
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
        key: Any = (request.resource, request.namespace, request.name)
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
                    nested(paths[0], replicas)
                    | {
                        "metadata": {
                            "resourceVersion": str(next(self._versions)),
                            "generation": int(obj.raw["metadata"].get("generation") or 1) + 1,
                        }
                    }
                )
                await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
            raw = obj.raw
        selector = jsonpath(raw, paths[2]) if paths[2] else None
        if isinstance(selector, dict):
            selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        return {
            "apiVersion": "autoscaling/v1",
            "kind": "Scale",
            "metadata": {
                k: raw["metadata"].get(k)
                for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
            },
            "spec": {"replicas": jsonpath(raw, paths[0]) or 0},
            "status": {"replicas": jsonpath(raw, paths[1]) or 0, "selector": selector or ""},
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
        objects: list[Any]
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
                columns.append(AGE_COLUMN)
        else:
            columns = [*BUILTIN_COLUMNS.get((info.kind if info else None) or "", []), AGE_COLUMN]
        definitions = [{"name": "Name", "type": "string", "format": "name"}] + [
            {"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", "")}
            for c in columns
        ]
        rows = []
        for obj in objects:
            cells: list[Any] = [obj["metadata"]["name"]]
            for column in columns:
                cells.append(cell(obj, column))
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
        schemas = builtin_v3_schemas()
        components: dict[str, Any] = {}
        paths: dict[str, Any] = {}
        for kind, plural in served[gv]:
            gvk = {"group": group, "version": version, "kind": kind}
            custom = self.custom_kinds.get(f"{group}/{version}/{plural}")
            name = f"{'.'.join(reversed(group.split('.')))}.{version}.{kind}" if custom else None
            if custom is not None and name is not None:
                components[name] = dict(custom.schema, **{"x-kubernetes-group-version-kind": [gvk]})
            else:
                name = builtin_schema_name(group, version, kind)
                if name is not None:
                    components.update(reachable(schemas, name))
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
        key: Any = (request.resource, request.namespace, request.name)
        if request.method == "PATCH":
            if key not in self._objects or self._objects[key].deleted:
                return
            data = merge(copy.deepcopy(self._objects[key].raw), data)
        name = f"{request.resource.group}/{request.resource.version}/{request.resource.plural}"
        custom = self.custom_kinds.get(name.lstrip("/"))
        if custom is not None:
            errors = schema_errors(custom.schema, data)
        else:
            errors = builtin_errors(data)
        if errors:
            raise kmock.KubernetesError(
                status=422,
                reason="Invalid",
                message=f"{data.get('kind')} {data.get('metadata', {}).get('name')!r} is "
                f"invalid: " + "; ".join(errors[:5]),
            )


# -- helpers ------------------------------------------------------------------------------------


def _status(code: int, reason: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "code": code,
        "reason": reason,
        "message": reason,
    }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _rv(item: Mapping[str, Any]) -> str:
    value = str((item.get("metadata") or {}).get("resourceVersion") or "0")
    return value if value.isdigit() else "0"


def _group_version(resource: references.resource | None) -> str:
    if resource is None or not resource.group:
        return "v1"
    return f"{resource.group}/{resource.version}"




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


