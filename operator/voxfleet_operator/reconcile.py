"""One level-based pass over a voice: read the world, make children match, report status.

Handlers (create, update, resume, the drift timer, Job and pod events) all call
`reconcile_voice`; it is idempotent, writes only what differs, and never raises for a spec
that can never work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from voxfleet_operator.children import ensure, with_owners
from voxfleet_operator.engine_builds import sync_engine
from voxfleet_operator.names import MANAGED_BY, endpoint, pool_deployment_name
from voxfleet_operator.placement import scale_status
from voxfleet_operator.pods import sync_pods
from voxfleet_operator.render import render_voice
from voxfleet_operator.render.voice_scaling import voice_hpa_name
from voxfleet_operator.runtime import HPAS, TTSVOICES, Peers, Runtime, peer_entry
from voxfleet_operator.serving import voice_engine_key
from voxfleet_operator.shared import leave_previous_pool, sync_shared
from voxfleet_operator.status import (
    AVAILABLE,
    SCHEDULED,
    Cond,
    build_status,
    failed_conditions,
    status_changed,
)
from voxfleet_operator.voices import InvalidVoice, parse_voice


async def write_status(rt: Runtime, body: Mapping[str, Any], new_status: dict[str, Any]) -> bool:
    """Patch the status subresource only when something differs; True when it wrote."""
    if not status_changed(body.get("status"), new_status):
        return False
    meta = body["metadata"]
    await rt.client.patch(
        TTSVOICES, meta["namespace"], meta["name"], {"status": new_status}, subresource="status"
    )
    return True


async def reconcile_voice(rt: Runtime, body: Mapping[str, Any], peers: Peers) -> dict[str, Any]:
    """Bring one voice's world in line with its spec; returns the status it now has."""
    meta = body["metadata"]
    name, namespace = meta["name"], meta["namespace"]
    generation = meta.get("generation")
    old_status = body.get("status")
    try:
        voice = parse_voice(name, namespace, body.get("spec") or {}, rt.config.pools)
    except InvalidVoice as error:
        status = build_status(
            old_status,
            phase="Failed",
            conditions=failed_conditions(error.reason, error.message),
            generation=generation,
        )
        await write_status(rt, body, status)
        return status

    pool = rt.config.pools.get(voice.spec.pool)
    key = voice_engine_key(voice.spec, pool)
    own = peer_entry(body)

    def peers_and_self() -> list[Mapping[str, Any]]:
        # The index may not hold a voice created a moment ago; it is a peer all the same.
        entries = peers()
        if own is not None and not any(e["metadata"]["name"] == name for e in entries):
            entries = [*entries, own]
        return entries

    deployments = await sync_shared(rt, namespace, peers_and_self, pool.name)
    await leave_previous_pool(rt, body, voice, pool, peers)
    for child in render_voice(voice, rt.config.pools, rt.config.engine_cache_pvc):
        if child["kind"] != "Job":
            await ensure(rt.client, with_owners(child, [body]))
    if not voice.spec.autoscaling.per_voice:
        await drop_voice_hpa(rt, name, namespace)

    engine = await sync_engine(rt, body, voice, pool, key)
    ready_pods, serving, errors = await sync_pods(rt, voice, pool, key, engine.status is True)

    deployment = deployments.get(pool.name) or {}
    available_replicas = int((deployment.get("status") or {}).get("availableReplicas") or 0)
    if ready_pods or available_replicas:
        scheduled = Cond(
            SCHEDULED,
            True,
            "PoolReady",
            f"pool {pool.name} ({pool.gpu_product}) has {max(ready_pods, available_replicas)} "
            f"ready pod(s) in Deployment {pool_deployment_name(pool.name)}",
        )
    else:
        scheduled = Cond(
            SCHEDULED,
            False,
            "WaitingForPods",
            f"no ready pod yet in Deployment {pool_deployment_name(pool.name)} of pool "
            f"{pool.name} (needs nodes with {pool.gpu_product})",
        )
    if errors:
        available = Cond(AVAILABLE, False, "LoadFailed", "; ".join(errors)[:1000])
    elif serving:
        available = Cond(AVAILABLE, True, "Serving", f"{serving} pod(s) serve {name}")
    elif engine.status is not True:
        available = Cond(AVAILABLE, False, "EngineNotReady", "waiting for the engines")
    else:
        available = Cond(AVAILABLE, False, "NoPodServing", "no ready pool pod has the voice yet")

    if engine.reason == "BuildFailed":
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
        conditions=[engine, scheduled, available],
        generation=generation,
        pool=pool.name,
        endpoint=endpoint(name, namespace),
        engine_key=key if engine.status is True else None,
        ready_pods=serving,
    )
    status.update(scale_status(name, pool.name, serving))
    await write_status(rt, body, status)
    return status


async def drop_voice_hpa(rt: Runtime, name: str, namespace: str) -> None:
    """A voice that no longer scales on its own loses its HPA (only one we made)."""
    live = await rt.client.get(HPAS, namespace, voice_hpa_name(name))
    if live is None:
        return
    labels = (live.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") == MANAGED_BY:
        await rt.client.delete(HPAS, namespace, voice_hpa_name(name))
