"""One level-based pass over a voice: read the world, make children match, report status.

Handlers (create, update, resume, the drift timer, Job and pod events) all call
`reconcile_voice`; it is idempotent, writes only what differs, and never raises for a spec
that can never work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxfleet_operator.children import ensure, with_owners
from voxfleet_operator.context import (
    HPAS,
    LAST_VALID_SPEC,
    TTSVOICES,
    Peers,
    Runtime,
    last_valid,
    peer_entry,
    valid_spec_record,
)
from voxfleet_operator.engine_builds import sync_engine
from voxfleet_operator.names import MANAGED_BY, endpoint, pods_endpoint, pool_deployment_name
from voxfleet_operator.placement import scale_status
from voxfleet_operator.pods import sync_pods
from voxfleet_operator.render import render_voice
from voxfleet_operator.render.voice_scaling import voice_hpa_name
from voxfleet_operator.shared import leave_previous_pool, sync_shared
from voxfleet_operator.status import (
    AVAILABLE,
    BUILD_FAILED,
    ENGINE_NOT_READY,
    FAILED_ON_POD,
    INSUFFICIENT_GPU_MEMORY,
    LOAD_FAILED,
    NO_POD_SERVING,
    POOL_READY,
    SCALING_FOR_MEMORY,
    SCHEDULED,
    SERVING,
    SPEC_ACCEPTED,
    SPEC_VALID,
    WAITING_FOR_PODS,
    Cond,
    build_status,
    failed_conditions,
    forbidden_conditions,
    status_changed,
)
from voxfleet_operator.voice_plan import voice_engine_key
from voxfleet_operator.voices import InvalidVoice, parse_voice


async def write_status(rt: Runtime, body: Mapping[str, Any], new_status: dict[str, Any]) -> bool:
    """Patch the status subresource only when something differs; True when it wrote."""
    if not status_changed(body.get("status"), new_status):
        return False
    meta = body["metadata"]
    answer = await rt.client.patch(
        TTSVOICES, meta["namespace"], meta["name"], {"status": new_status}, subresource="status"
    )
    rt.status_written(answer)
    return True


async def report_forbidden(rt: Runtime, body: Mapping[str, Any], message: str) -> None:
    """Say in the voice's status that the API server refused the operator something the
    voice needs: phase Failed, Available False with reason Forbidden and `message`."""
    old_status = body.get("status") or {}
    status = build_status(
        old_status,
        phase="Failed",
        conditions=forbidden_conditions(old_status.get("conditions") or [], message),
        generation=body["metadata"].get("generation"),
        pool=old_status.get("pool"),
        endpoint=old_status.get("endpoint"),
        engine_key=old_status.get("engineKey"),
        ready_pods=old_status.get("readyPods"),
    )
    await write_status(rt, body, status)


async def remember_valid_spec(rt: Runtime, body: Mapping[str, Any]) -> None:
    """Record the spec as the last valid one (an annotation), if it is not already."""
    meta = body["metadata"]
    record = valid_spec_record(meta.get("generation"), body.get("spec") or {})
    if (meta.get("annotations") or {}).get(LAST_VALID_SPEC) == record:
        return
    patch = {"metadata": {"annotations": {LAST_VALID_SPEC: record}}}
    await rt.client.patch(TTSVOICES, meta["namespace"], meta["name"], patch)


async def reconcile_voice(rt: Runtime, body: Mapping[str, Any], peers: Peers) -> dict[str, Any]:
    """Bring one voice's world in line with its spec; returns the status it now has.

    Passes of one voice run one at a time (a second waits for the first), so a pod the
    first one loaded the voice onto is seen as serving it by the next, not loaded again."""
    meta = body["metadata"]
    async with rt.voice_lock(meta["namespace"], meta["name"]):
        return await _reconcile_voice(rt, body, peers)


async def _reconcile_voice(rt: Runtime, body: Mapping[str, Any], peers: Peers) -> dict[str, Any]:
    body = rt.with_latest_status(body)
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    generation = meta.get("generation")
    old_status = body.get("status")
    if meta.get("uid") in rt.deleted:
        return dict(old_status or {})  # a pass that began before the voice was deleted
    try:
        voice = parse_voice(name, namespace, body.get("spec") or {}, rt.config.pools)
    except InvalidVoice as error:
        last = last_valid(body, rt.config.pools)
        if last is None:
            status = build_status(
                old_status,
                phase="Failed",
                conditions=failed_conditions(error.reason, error.message),
                generation=generation,
            )
            await write_status(rt, body, status)
            return status
        # As a Deployment with a bad rollout: the last valid generation keeps serving, and
        # the status says which one that is and what is wrong with the new one.
        voice, valid_generation = last
        spec_valid = Cond(
            SPEC_VALID,
            False,
            error.reason,
            f"generation {generation} is not applied: {error.message}; still serving "
            f"generation {valid_generation}",
        )
    else:
        spec_valid = Cond(SPEC_VALID, True, SPEC_ACCEPTED, "the spec is valid")
        await remember_valid_spec(rt, body)

    pool = rt.config.pools.get(voice.spec.pool)
    key = voice_engine_key(voice.spec, pool)
    own = peer_entry(body)

    def peers_and_self() -> list[Mapping[str, Any]]:
        # The index may not hold a voice created a moment ago; it is a peer all the same.
        entries = peers()
        if meta.get("uid") in rt.deleted:
            return entries
        if own is not None and not any(e["metadata"]["name"] == name for e in entries):
            entries = [*entries, own]
        return entries

    deployments = await sync_shared(rt, namespace, peers_and_self, pool.name)
    await leave_previous_pool(rt, body, voice, pool, peers)
    for child in render_voice(voice, rt.config.pools, rt.config.engine_cache_pvc):
        if child["kind"] != "Job":
            await ensure(rt.client, with_owners(child, [body]), rt.cache)
    if not voice.spec.autoscaling.per_voice:
        await drop_voice_hpa(rt, name, namespace)

    engine = await sync_engine(rt, body, voice, pool, key)
    synced = await sync_pods(rt, voice, pool, key, engine.status is True)
    ready_pods, serving, errors, failing = (
        synced.ready,
        synced.serving,
        synced.errors,
        synced.failing,
    )
    if synced.shortfall is not None and not synced.shortfall.at_max_pods:
        # The pool's HPA floor follows what its voices need by memory (sync_pods measured it).
        deployments = await sync_shared(rt, namespace, peers_and_self, pool.name)

    deployment = deployments.get(pool.name) or {}
    available_replicas = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if synced.shortfall is not None and not serving:
        scheduled = Cond(
            SCHEDULED,
            False,
            INSUFFICIENT_GPU_MEMORY if synced.shortfall.at_max_pods else SCALING_FOR_MEMORY,
            synced.shortfall.message(),
        )
    elif ready_pods or available_replicas:
        scheduled = Cond(
            SCHEDULED,
            True,
            POOL_READY,
            f"pool {pool.name} ({pool.gpu_product}) has {max(ready_pods, available_replicas)} "
            f"ready pod(s) in Deployment {pool_deployment_name(pool.name)}",
        )
    else:
        scheduled = Cond(
            SCHEDULED,
            False,
            WAITING_FOR_PODS,
            f"no ready pod yet in Deployment {pool_deployment_name(pool.name)} of pool "
            f"{pool.name} (needs nodes with {pool.gpu_product})",
        )
    if errors:
        available = Cond(AVAILABLE, False, LOAD_FAILED, "; ".join(errors + failing)[:1000])
    elif serving:
        served = "; ".join([f"{serving} pod(s) serve {name}", *failing])
        available = Cond(AVAILABLE, True, SERVING, served[:1000])
    elif failing:
        available = Cond(AVAILABLE, False, FAILED_ON_POD, "; ".join(failing)[:1000])
    elif engine.status is not True:
        available = Cond(AVAILABLE, False, ENGINE_NOT_READY, "waiting for the engines")
    else:
        available = Cond(AVAILABLE, False, NO_POD_SERVING, "no ready pool pod has the voice yet")

    if engine.reason == BUILD_FAILED:
        phase = "Failed"
    elif engine.status is not True:
        phase = "Building"
    elif serving:
        phase = "Ready"
    else:
        phase = "Pending"
    status = build_status(
        old_status,
        phase=phase,
        conditions=[spec_valid, engine, scheduled, available],
        generation=generation,
        pool=pool.name,
        endpoint=endpoint(name, namespace),
        engine_key=key if engine.status is True else None,
        ready_pods=serving,
    )
    status.update(scale_status(name, pool.name, serving))
    status["podsEndpoint"] = pods_endpoint(name, namespace)
    status.update(await rt.voice_status_metrics(namespace, name))
    await write_status(rt, body, status)
    return status


async def drop_voice_hpa(rt: Runtime, name: str, namespace: str) -> None:
    """A voice that no longer scales on its own loses its HPA (only one we made).

    The HPA is read once; an HPA the API said is missing is not asked for again until a
    watch event or the operator's own write names it, so a converged pass reads nothing.
    """
    hpa = voice_hpa_name(name)
    live = rt.cache.lookup(HPAS.plural, namespace, hpa)
    if live is None:
        if rt.cache.known_absent(HPAS.plural, namespace, hpa):
            return
        live = await rt.client.get(HPAS, namespace, hpa)
    if live is None:
        rt.cache.mark_absent(HPAS.plural, namespace, hpa)
        return
    labels = (live.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") == MANAGED_BY:
        await rt.client.delete(HPAS, namespace, hpa)
        rt.cache.mark_absent(HPAS.plural, namespace, hpa)
