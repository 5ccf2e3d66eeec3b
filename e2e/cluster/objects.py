"""Pure helpers over Kubernetes objects as dicts: selectors, owners, readiness, quantities."""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import random
from typing import Any

Obj = dict[str, Any]

# The alphabet Kubernetes uses for generated name suffixes (no vowels, no look-alikes).
_SAFE = "bcdfghjklmnpqrstvwxz2456789"


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def random_suffix(length: int = 5) -> str:
    return "".join(random.choice(_SAFE) for _ in range(length))


def template_hash(template: Obj) -> str:
    """A stable pod-template-hash: equal templates give equal hashes."""
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).digest()
    return "".join(_SAFE[b % len(_SAFE)] for b in digest[:10])


def key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "default", meta["name"]


def labels_match(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a label set."""
    if not selector:
        return False  # an empty selector selects nothing for Services and controllers here
    for name, value in (selector.get("matchLabels") or {}).items():
        if labels.get(name) != value:
            return False
    for expression in selector.get("matchExpressions") or []:
        name, operator = expression["key"], expression["operator"]
        values = expression.get("values") or []
        if operator == "In" and labels.get(name) not in values:
            return False
        if operator == "NotIn" and labels.get(name) in values:
            return False
        if operator == "Exists" and name not in labels:
            return False
        if operator == "DoesNotExist" and name in labels:
            return False
    return True


def owned_by(obj: Obj, owner: Obj) -> bool:
    uid = owner["metadata"].get("uid")
    return any(
        ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or []
    ) and key(obj)[0] == key(owner)[0]


def owner_reference(owner: Obj, kind: str, api_version: str) -> Obj:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def is_deleting(obj: Obj) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def condition(obj: Obj, kind: str) -> Obj | None:
    for item in (obj.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


def is_ready(pod: Obj) -> bool:
    ready = condition(pod, "Ready")
    return bool(ready and ready.get("status") == "True") and not is_deleting(pod)


def cpu_cores(quantity: Any) -> float:
    """A CPU quantity ("2", "500m", 1.5) in cores."""
    text = str(quantity)
    if text.endswith("m"):
        return float(text[:-1]) / 1000
    return float(text)


def memory_bytes(quantity: Any) -> int:
    text = str(quantity)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


def scaled_value(value: Any, total: int, round_up: bool) -> int:
    """An IntOrString such as maxSurge ("25%" or 1) resolved against `total` replicas."""
    if isinstance(value, str) and value.endswith("%"):
        exact = float(value[:-1]) * total / 100
        return math.ceil(exact) if round_up else math.floor(exact)
    return int(value)
