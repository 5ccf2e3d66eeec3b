"""Engine builds: one Job per (voice, engine key), and what its outcome means for the voice."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxfleet_operator.children import ensure, with_owners
from voxfleet_operator.names import ENGINE_KEY_LABEL, VOICE_LABEL, engine_job_name
from voxfleet_operator.plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render import render_voice
from voxfleet_operator.runtime import JOBS, Runtime
from voxfleet_operator.status import ENGINE_READY, Cond


def _job_condition(job: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind and cond.get("status") == "True":
            return dict(cond)
    return None


async def sync_engine(
    rt: Runtime, body: Mapping[str, Any], voice: Voice, pool: Pool, key: str
) -> Cond:
    """Make sure the engines for `key` exist, building them once; report EngineReady."""
    status = body.get("status") or {}
    if status.get("engineKey") == key:
        return Cond(ENGINE_READY, True, "EnginesBuilt", f"engines {key} are in the cache")
    job_name = engine_job_name(voice.name, key)
    job_doc = next(
        o
        for o in render_voice(voice, rt.config.pools, rt.config.engine_cache_pvc)
        if o["kind"] == "Job"
    )
    job = rt.cache.lookup(JOBS.plural, voice.namespace, job_name)
    if job is None:
        job = await rt.client.get(JOBS, voice.namespace, job_name)
    if job is None:
        _, job = await ensure(rt.client, with_owners(job_doc, [body]), rt.cache)
        # Jobs of an older key are of no further use to this voice.
        for old in await rt.client.list(JOBS, voice.namespace, f"{VOICE_LABEL}={voice.name}"):
            old_key = (old["metadata"].get("labels") or {}).get(ENGINE_KEY_LABEL)
            if old_key and old_key != key:
                await rt.client.delete(JOBS, voice.namespace, old["metadata"]["name"])
    if _job_condition(job, "Complete"):
        return Cond(ENGINE_READY, True, "EnginesBuilt", f"Job {job_name} built engines {key}")
    failed = _job_condition(job, "Failed")
    if failed:
        # The Job already retried within its backoffLimit; a new key (spec change) or
        # deleting the Job starts another build. No retry loop here.
        return Cond(
            ENGINE_READY,
            False,
            "BuildFailed",
            f"Job {job_name} failed: {failed.get('reason', '')}: {failed.get('message', '')}",
        )
    active = (job.get("status") or {}).get("active") or 0
    return Cond(
        ENGINE_READY,
        False,
        "Building",
        f"Job {job_name} is building engines {key} for {pool.gpu_product} ({active} pod active)",
    )
