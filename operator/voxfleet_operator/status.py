"""The TTSVoice status as a public API: phase, standard conditions, observedGeneration.

Pure functions; `lastTransitionTime` changes only when a condition's status changes, so an
unchanged world produces an identical status and the operator writes nothing.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SPEC_VALID = "SpecValid"
ENGINE_READY = "EngineReady"
SCHEDULED = "Scheduled"
AVAILABLE = "Available"
CONDITION_TYPES = (SPEC_VALID, ENGINE_READY, SCHEDULED, AVAILABLE)

# Every reason of the conditions above, defined here only.
SPEC_ACCEPTED = "Accepted"
INVALID_SPEC = "InvalidSpec"
INVALID_NAME = "InvalidName"
UNKNOWN_POOL = "UnknownPool"
NOT_A_TTSVOICE = "NotATTSVoice"  # `voxfleet render` input only
ENGINES_BUILT = "EnginesBuilt"
BUILDING = "Building"
BUILD_FAILED = "BuildFailed"
ENGINE_CACHE_MISSING = "EngineCacheMissing"
POOL_READY = "PoolReady"
WAITING_FOR_PODS = "WaitingForPods"
SERVING = "Serving"
LOAD_FAILED = "LoadFailed"
ENGINE_NOT_READY = "EngineNotReady"
NO_POD_SERVING = "NoPodServing"
# Pods that had the voice loaded are not ready: its backend is being restarted, or failed.
FAILED_ON_POD = "FailedOnPod"
# No ready pod has the memory the voice needs, and the pool is at its maxPods.
INSUFFICIENT_GPU_MEMORY = "InsufficientGPUMemory"
# No ready pod has the memory the voice needs; the pool is being scaled up for it.
SCALING_FOR_MEMORY = "ScalingUpForMemory"
# The API server refused the operator a verb the voice needs (RBAC): an administrator's fix.
FORBIDDEN = "Forbidden"


@dataclass(frozen=True)
class Cond:
    type: str
    status: bool | None  # None: Unknown
    reason: str
    message: str = ""

    @property
    def status_text(self) -> str:
        return {True: "True", False: "False", None: "Unknown"}[self.status]


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[Cond], generation: int | None, now: str
) -> list[dict[str, Any]]:
    previous = {c.get("type"): c for c in old}
    merged = []
    for cond in new:
        before = previous.get(cond.type)
        changed = before is None or before.get("status") != cond.status_text
        item: dict[str, Any] = {
            "type": cond.type,
            "status": cond.status_text,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": (
                now if changed or before is None else before.get("lastTransitionTime", now)
            ),
        }
        if generation is not None:
            item["observedGeneration"] = generation
        merged.append(item)
    return merged


def build_status(
    old_status: Mapping[str, Any] | None,
    *,
    phase: str,
    conditions: Sequence[Cond],
    generation: int | None,
    pool: str | None = None,
    endpoint: str | None = None,
    engine_key: str | None = None,
    ready_pods: int | None = None,
    now: str | None = None,
) -> dict[str, Any]:
    """The full status to write; fields set to None are removed (merge-patch null)."""
    old_status = old_status or {}
    return {
        "phase": phase,
        "pool": pool,
        "endpoint": endpoint,
        "engineKey": engine_key,
        "readyPods": ready_pods,
        "observedGeneration": generation,
        "conditions": merge_conditions(
            old_status.get("conditions") or [], conditions, generation, now or now_rfc3339()
        ),
    }


def status_changed(old_status: Mapping[str, Any] | None, new_status: Mapping[str, Any]) -> bool:
    old_status = old_status or {}
    for key, value in new_status.items():
        if value is None:
            if old_status.get(key) is not None:
                return True
        elif old_status.get(key) != value:
            return True
    return False


def failed_conditions(reason: str, message: str) -> list[Cond]:
    return [Cond(t, False, reason, message) for t in CONDITION_TYPES]


def forbidden_conditions(old: Sequence[Mapping[str, Any]], message: str) -> list[Cond]:
    """Available turns False for a refused verb; the other conditions stay as they were
    (Unknown where there was none yet)."""
    previous = {c.get("type"): c for c in old}
    out = []
    for kind in CONDITION_TYPES:
        before = previous.get(kind)
        if kind == AVAILABLE or before is None:
            out.append(Cond(kind, False if kind == AVAILABLE else None, FORBIDDEN, message))
        else:
            value = {"True": True, "False": False}.get(str(before.get("status")))
            out.append(
                Cond(kind, value, str(before.get("reason", "")), str(before.get("message", "")))
            )
    return out
