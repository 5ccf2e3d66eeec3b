"""The Job controller (NonIndexed completion mode).

Pods are made from `spec.template`, named `<job>-<5 random>`, labelled `job-name`,
`controller-uid` (and their `batch.kubernetes.io/` forms) and owned by the Job. Up to
`parallelism` (default 1) pods run until `completions` (default 1) have succeeded. A failed
pod (exit code non-zero; restartPolicy Never) counts in `status.failed` and a new pod
replaces it after a back-off, until more than `backoffLimit` (default 6) pods have failed:
then the condition `Failed` with reason `BackoffLimitExceeded` and message "Job has reached
the specified backoff limit". `activeDeadlineSeconds` ends the Job the same way with reason
`DeadlineExceeded` ("Job was active longer than specified deadline"); active pods are
deleted when a Job fails. Success: condition `Complete` (after `SuccessCriteriaMet`, as
Kubernetes 1.31+ reports), with startTime, completionTime, active, ready, succeeded and
failed counts in status. The back-off is 1 s doubling up to 10 s per failure (Kubernetes'
is 10 s doubling up to 6 min). `restartPolicy: OnFailure` restarts the container in place
(the kubelet's job), and those restarts do not count toward backoffLimit here. Not emulated:
Indexed jobs, podFailurePolicy, successPolicy, suspend, ttlSecondsAfterFinished, the
FailureTarget condition.
"""

from __future__ import annotations

import time
from typing import Any

from .api import KubeApi
from .objects import (
    condition,
    is_deleting,
    is_ready,
    key,
    now,
    owned_by,
    owner_reference,
    parse_time,
    random_suffix,
)

Obj = dict[str, Any]


def _phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase", "Pending"))


def _finished(job: Obj) -> bool:
    for kind in ("Complete", "Failed"):
        found = condition(job, kind)
        if found and found.get("status") == "True":
            return True
    return False


def new_pod(job: Obj) -> Obj:
    template = job["spec"]["template"]
    meta = template.get("metadata") or {}
    name, uid = job["metadata"]["name"], job["metadata"]["uid"]
    labels = {
        **(meta.get("labels") or {}),
        "job-name": name,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid,
        "batch.kubernetes.io/controller-uid": uid,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-{random_suffix()}",
            "labels": labels,
            "annotations": dict(meta.get("annotations") or {}),
            "ownerReferences": [owner_reference(job, "Job", "batch/v1")],
        },
        "spec": template["spec"],
    }


class JobController:
    def __init__(self, api: KubeApi, backoff_base_s: float = 1.0) -> None:
        self.api = api
        self.backoff_base_s = backoff_base_s
        self._last_failure: dict[str, tuple[int, float]] = {}  # uid -> (failed count, when)

    async def reconcile(self, job: Obj, pods: list[Obj]) -> None:
        if is_deleting(job):
            return
        namespace, name = key(job)
        spec, previous = job["spec"], job.get("status") or {}
        owned = [p for p in pods if owned_by(p, job)]
        succeeded = sum(_phase(p) == "Succeeded" for p in owned)
        failed = sum(_phase(p) == "Failed" for p in owned)
        active = [p for p in owned if _phase(p) not in ("Succeeded", "Failed")
                  and not is_deleting(p)]
        status: Obj = {
            "startTime": previous.get("startTime") or now(),
            "active": len(active),
            "ready": sum(is_ready(p) for p in active),
            "succeeded": succeeded,
            "failed": failed,
        }
        conditions = list(previous.get("conditions") or [])
        if _finished(job):
            # A finished Job keeps its counts; pods still going are stopped.
            for pod in active:
                await self.api.delete("Pod", namespace, pod["metadata"]["name"])
            status["conditions"] = conditions
        else:
            completions = int(spec.get("completions", 1))
            parallelism = int(spec.get("parallelism", 1))
            deadline = spec.get("activeDeadlineSeconds")
            failure = None
            if failed > int(spec.get("backoffLimit", 6)):
                failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
            elif deadline is not None and time.time() - parse_time(status["startTime"]) > float(
                deadline
            ):
                failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
            if failure is not None:
                for pod in active:
                    await self.api.delete("Pod", namespace, pod["metadata"]["name"])
                conditions.append(_true("Failed", *failure))
                status["completionTime"] = None
            elif succeeded >= completions:
                conditions.append(_true("SuccessCriteriaMet", "CompletionsReached",
                                        "Reached expected number of succeeded pods"))
                conditions.append(_true("Complete", "CompletionsReached",
                                        "Reached expected number of succeeded pods"))
                status["completionTime"] = now()
                status["active"] = 0
            else:
                wanted = min(parallelism, completions - succeeded) - len(active)
                if wanted > 0 and self._backoff_over(job["metadata"]["uid"], failed):
                    for _ in range(wanted):
                        await self.api.create("Pod", namespace, new_pod(job))
            status["conditions"] = conditions
        if any(previous.get(k) != v for k, v in status.items() if v is not None) or (
            len(conditions) != len(previous.get("conditions") or [])
        ):
            status = {k: v for k, v in status.items() if v is not None}
            await self.api.patch("Job", namespace, name, {"status": status}, "status")

    def _backoff_over(self, uid: str, failed: int) -> bool:
        if failed == 0:
            return True
        count, since = self._last_failure.get(uid, (0, 0.0))
        if count != failed:
            self._last_failure[uid] = (failed, time.monotonic())
            return False
        delay = min(10.0, self.backoff_base_s * 2 ** (failed - 1))
        return time.monotonic() - since >= delay


def _true(kind: str, reason: str, message: str) -> Obj:
    stamp = now()
    return {"type": kind, "status": "True", "reason": reason, "message": message,
            "lastProbeTime": stamp, "lastTransitionTime": stamp}
