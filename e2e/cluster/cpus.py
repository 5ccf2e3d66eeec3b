"""CPU sets for pods from their CPU requests.

The rule: a pod asks for n = ceil(sum of its containers' CPU requests) cores (at least 1; a pod
without requests gets every core, as a BestEffort pod may use any). It gets the n cores with
the fewest cores already promised to running pods (ties: the lowest core number), so pods that
request 1 CPU get distinct cores while there are free ones, and share the least-loaded ones
after that. A pod asking for more cores than there are gets them all. The set is applied with
`sched_setaffinity` to the container process and inherited by its children. CPU limits (CFS
quotas) are not enforced.
"""

from __future__ import annotations

import math
import os
from typing import Any

from .objects import cpu_cores


def pod_cpu_request(pod: dict[str, Any]) -> float:
    total = 0.0
    for container in pod["spec"].get("containers") or []:
        requests = (container.get("resources") or {}).get("requests") or {}
        limits = (container.get("resources") or {}).get("limits") or {}
        value = requests.get("cpu", limits.get("cpu"))  # a limit alone defaults the request
        if value is not None:
            total += cpu_cores(value)
    return total


class CpuAllocator:
    def __init__(self, cores: set[int] | None = None) -> None:
        self.cores = sorted(cores if cores is not None else os.sched_getaffinity(0))
        self._load = dict.fromkeys(self.cores, 0)
        self._held: dict[str, list[int]] = {}  # pod uid -> cores counted as promised to it

    def allocate(self, uid: str, request_cores: float) -> list[int]:
        if uid in self._held:
            return self._held[uid] or list(self.cores)
        if request_cores <= 0:
            self._held[uid] = []
            return list(self.cores)
        wanted = min(len(self.cores), max(1, math.ceil(request_cores - 1e-9)))
        chosen = sorted(sorted(self.cores, key=lambda core: (self._load[core], core))[:wanted])
        for core in chosen:
            self._load[core] += 1
        self._held[uid] = chosen
        return chosen

    def release(self, uid: str) -> None:
        for core in self._held.pop(uid, []):
            if self._load[core] > 0:
                self._load[core] -= 1
