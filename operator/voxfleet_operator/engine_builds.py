"""Engine builds: one Job per (voice, engine key), and what its outcome means for the voice."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from voxfleet_operator.children import ensure, with_owners
from voxfleet_operator.context import JOBS, PVCS, Runtime
from voxfleet_operator.names import ENGINE_KEY_LABEL, VOICE_LABEL, engine_job_name
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render import render_voice
from voxfleet_operator.status import (
    BUILD_FAILED,
    BUILDING,
    ENGINE_CACHE_MISSING,
    ENGINE_READY,
    ENGINES_BUILT,
    Cond,
)


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


CLAIM_RECHECK_SECONDS = 5.0


async def _claim_problem(rt: Runtime, namespace: str) -> str | None:
    """What keeps the engine-cache claim from a build pod, or None when it is usable.

    Asked only while a build has no pod running. A usable claim is remembered for the
    cache's lifetime; a missing one is asked for again after `CLAIM_RECHECK_SECONDS`, so
    that its creation shows soon without every voice of the namespace asking on every pass.
    A claim being deleted (a `deletionTimestamp`, held by the pvc-protection finalizer) is
    as good as missing: no new pod can mount it, and it is gone once its last user is.
    """
    claim = rt.config.engine_cache_pvc
    if rt.cache.lookup(PVCS.plural, namespace, claim) is not None:
        return None
    checked = rt.unusable_claims.get(namespace)
    if checked is not None and time.monotonic() - checked[0] < CLAIM_RECHECK_SECONDS:
        return checked[1]
    live = await rt.client.get(PVCS, namespace, claim)
    if live is None or (live.get("metadata") or {}).get("deletionTimestamp"):
        problem = "does not exist" if live is None else "is being deleted"
        rt.unusable_claims[namespace] = (time.monotonic(), problem)
        return problem
    rt.unusable_claims.pop(namespace, None)
    rt.cache.seen(PVCS.plural, live)
    return None


async def sync_engine(
    rt: Runtime, body: Mapping[str, Any], voice: Voice, pool: Pool, key: str
) -> Cond:
    """Make sure the engines for `key` exist, building them once; report EngineReady."""
    status = body.get("status") or {}
    job_name = engine_job_name(voice.name, key)
    # One wording before and after status records the key: a message that changed once
    # after every build would cost a status write for nothing.
    built = Cond(ENGINE_READY, True, ENGINES_BUILT, f"Job {job_name} built engines {key}")
    if status.get("engineKey") == key:
        return built
    job_doc = next(
        o
        for o in render_voice(voice, rt.config.pools, rt.config.engine_cache_pvc)
        if o["kind"] == "Job"
    )
    job = rt.cache.lookup(JOBS.plural, voice.namespace, job_name)
    if job is None:
        job = await rt.client.get(JOBS, voice.namespace, job_name)
    if job is None:
        # Created, never patched: a concurrent pass may have made it a moment ago, and a
        # Job's selector and pod template cannot change (the API server answers 422).
        _, job = await ensure(
            rt.client, with_owners(job_doc, [body]), rt.cache, patch_existing=False
        )
        # Jobs of an older key are of no further use to this voice.
        for old in await rt.client.list(JOBS, voice.namespace, f"{VOICE_LABEL}={voice.name}"):
            old_key = (old["metadata"].get("labels") or {}).get(ENGINE_KEY_LABEL)
            if old_key and old_key != key:
                await rt.client.delete(JOBS, voice.namespace, old["metadata"]["name"])
    if _job_condition(job, "Complete"):
        return built
    failed = _job_condition(job, "Failed")
    if failed:
        # The Job already retried within its backoffLimit; a new key (spec change) or
        # deleting the Job starts another build. No retry loop here.
        return Cond(
            ENGINE_READY,
            False,
            BUILD_FAILED,
            f"Job {job_name} failed: {failed.get('reason', '')}: {failed.get('message', '')}",
        )
    active = (job.get("status") or {}).get("active") or 0
    problem = None if active else await _claim_problem(rt, voice.namespace)
    if problem:
        return Cond(
            ENGINE_READY,
            False,
            ENGINE_CACHE_MISSING,
            f"PersistentVolumeClaim {rt.config.engine_cache_pvc} {problem} in namespace "
            f"{voice.namespace}: Job {job_name} cannot start until it exists (create it, "
            "ReadWriteMany, or set the chart's engineCache.claimName)",
        )
    return Cond(
        ENGINE_READY,
        False,
        BUILDING,
        f"Job {job_name} is building engines {key} for {pool.gpu_product} ({active} pod active)",
    )
