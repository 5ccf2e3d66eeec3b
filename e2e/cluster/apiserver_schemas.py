"""OpenAPI v3 documents and strict field validation for the API emulator: the built-in
kinds' schemas from kubernetes-validate (Kubernetes 1.35), the CRDs' own openAPIV3Schema."""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def _gvk_of(name: str, schema: Mapping[str, Any]) -> dict[str, str] | None:
    properties = schema.get("properties") or {}
    api_versions = (properties.get("apiVersion") or {}).get("enum")
    kinds = (properties.get("kind") or {}).get("enum")
    if not api_versions or not kinds or len(kinds) != 1:
        return None
    group, _, version = str(api_versions[0]).rpartition("/")
    return {"group": group, "version": version, "kind": str(kinds[0])}



# -- schemas --------------------------------------------------------------------------------------

_SERVER_FIELDS = ("uid", "resourceVersion", "generation", "creationTimestamp", "managedFields")


def schema_errors(schema: Mapping[str, Any], data: Any) -> list[str]:
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


def builtin_errors(data: Mapping[str, Any]) -> list[str]:
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
def builtin_v3_schemas() -> dict[str, Any]:
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


def builtin_schema_name(group: str, version: str, kind: str) -> str | None:
    for name, schema in builtin_v3_schemas().items():
        for gvk in schema.get("x-kubernetes-group-version-kind") or []:
            if gvk == {"group": group, "version": version, "kind": kind}:
                return name
    return None


def reachable(schemas: Mapping[str, Any], name: str) -> dict[str, Any]:
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

