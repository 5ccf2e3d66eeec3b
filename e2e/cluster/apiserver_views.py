"""How the API emulator shows and changes objects as kubectl expects: server-side tables
(printer columns, a JSONPath subset), label and field selectors, strategic merge patches."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

from kmock._internal import rendering

# Server-side printer columns of the built-in kinds `kubectl get` shows (name, JSONPath, type).
BUILTIN_COLUMNS: dict[str, list[dict[str, str]]] = {
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
AGE_COLUMN = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

def strategic_to_merge(current: Any, patch: Any) -> Any:
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
            out[key] = strategic_to_merge(old, value)
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
        by_key[name] = merge(by_key.get(name), strategic_to_merge(by_key.get(name), item))
    names = [i.get(key) for i in order] if order else list(by_key)
    names += [n for n in by_key if n not in names]
    return [by_key[n] for n in names if n in by_key and n not in deleted]


def nested(path: str, value: Any) -> dict[str, Any]:
    parts = [p for p in path.split(".") if p]
    out: Any = value
    for part in reversed(parts):
        out = {part: out}
    assert isinstance(out, dict)
    return out


_FILTER = re.compile(r'\[\?\(@\.([\w.]+)\s*==\s*["\']([^"\']*)["\']\)\]')


def jsonpath(obj: Any, path: str) -> Any:
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
                        got = jsonpath(item, "." + field_path)
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


def cell(obj: Mapping[str, Any], column: Mapping[str, Any]) -> Any:
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
    value = jsonpath(obj, path)
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
    now = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    seconds = int((now - then).total_seconds())
    if seconds < 120:
        return f"{max(seconds, 0)}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60}s" if seconds < 600 else f"{seconds // 60}m"
    return f"{seconds // 3600}h{(seconds % 3600) // 60}m"


def wants_table(request: rendering.Request) -> bool:
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


def fields_match(selector: str, obj: Mapping[str, Any]) -> bool:
    for term in selector.split(","):
        if not term:
            continue
        negate = "!=" in term
        key, value = term.replace("!=", "=").replace("==", "=").split("=", 1)
        got = jsonpath(obj, "." + key)
        if (str(got) == value) == negate:
            return False
    return True

def merge(base: Any, patch: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge(base.get(key), value)
    return out
