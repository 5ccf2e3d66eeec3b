"""Pure helpers over Kubernetes objects as dicts: times, readiness, quantities."""

from __future__ import annotations

import datetime
from typing import Any

Obj = dict[str, Any]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str) -> float:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return meta.get("namespace") or "default", meta["name"]


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
    units = {
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
        "k": 10**3,
        "M": 10**6,
        "G": 10**9,
        "T": 10**12,
    }
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))
