"""Children shared by the voices of a namespace: the key Secret and each pool's objects."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from voxfleet_operator.children import ensure, with_owners
from voxfleet_operator.context import Peer, Peers, Runtime, secret_key, valid_peers
from voxfleet_operator.kube import PLURALS, Resource
from voxfleet_operator.names import (
    MANAGED_BY,
    REPOSITORY_KEY_SECRET,
    REPOSITORY_KEY_SECRET_KEY,
    pool_deployment_name,
    pool_metrics_service_name,
)
from voxfleet_operator.pods import unload_from_pods
from voxfleet_operator.pool_plan import Voice, plan_pool
from voxfleet_operator.pools import Pool
from voxfleet_operator.render import render_pool, render_speech_api
from voxfleet_operator.render.voice import build_repository_key_secret, new_repository_key

logger = logging.getLogger(__name__)


async def sync_shared(
    rt: Runtime, namespace: str, peers: Peers, pool: str | None = None
) -> dict[str, dict[str, Any]]:
    """The namespace's shared children (key Secret, pool objects), owned by its voices.

    Only `pool`'s objects when it is given (a voice's reconcile touches its own pool), every
    pool's otherwise. Returns the live pool Deployments by pool name.
    """
    deployments: dict[str, dict[str, Any]] = {}
    async with rt.lock(namespace):
        members = valid_peers(rt, namespace, peers())
        if not members:
            return deployments
        owners = [p.body for p in members]
        await sync_key_secret(rt, namespace, owners)
        # The gateway serves every voice of the namespace: owned by all of them, gone with
        # the last (as the key Secret).
        for child in render_speech_api(namespace, [m.voice for m in members], rt.config.speech_api):
            await ensure(rt.client, with_owners(child, owners), rt.cache)
        by_pool: dict[str, list[Peer]] = {}
        for peer in members:
            by_pool.setdefault(peer.pool.name, []).append(peer)
        monitor = await rt.service_monitor_available()
        for pool_name, pool_members in sorted(by_pool.items()):
            if pool is not None and pool_name != pool:
                continue
            plan = plan_pool(
                pool_members[0].pool,
                namespace,
                [m.voice for m in pool_members],
                memory_pods=rt.memory_pods.get((namespace, pool_name), 0),
            )
            pool_owners = [m.body for m in pool_members]
            for child in render_pool(plan, rt.config.engine_cache_pvc, monitor):
                _, live = await ensure(rt.client, with_owners(child, pool_owners), rt.cache)
                if child["kind"] == "Deployment":
                    deployments[pool_name] = live
    return deployments


async def sync_key_secret(rt: Runtime, namespace: str, owners: list[Mapping[str, Any]]) -> str:
    """The namespace's repository key: made once at random, kept in the namespace's Secret.

    Each namespace has its own key, so reading Secrets in one namespace gives no control
    over another namespace's pools. A Secret of that name that someone else manages (it
    lacks our managed-by label) is used as it is and never changed or owned.
    """
    live = await rt.key_secret(namespace)
    key = secret_key(live) if live is not None else None
    if live is not None:
        labels = (live.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != MANAGED_BY:
            if key is None:
                raise ValueError(
                    f"Secret {REPOSITORY_KEY_SECRET} in {namespace} has no "
                    f"{REPOSITORY_KEY_SECRET_KEY!r} entry"
                )
            return key
    secret = build_repository_key_secret(namespace, key or new_repository_key())
    _, live = await ensure(rt.client, with_owners(secret, owners), rt.cache)
    return secret_key(live) or ""


async def remove_from_pool(rt: Runtime, namespace: str, pool: Pool, peers: Peers) -> None:
    """After a voice leaves: re-own the shared children, or delete its pool's if it was last."""
    await sync_shared(rt, namespace, peers, pool.name)
    async with rt.lock(namespace):
        if any(p.pool.name == pool.name for p in valid_peers(rt, namespace, peers())):
            return
        monitor = await rt.service_monitor_available()
        for resource, name in pool_object_names(pool.name, monitor):
            await rt.client.delete(resource, namespace, name)
            rt.cache.forget(resource.plural, namespace, name)


def pool_object_names(pool: str, service_monitor: bool) -> list[tuple[Resource, str]]:
    """Every object `render_pool` makes for a pool, by API resource and name."""
    names = [
        (PLURALS[("apps/v1", "Deployment")], pool_deployment_name(pool)),
        (PLURALS[("v1", "Service")], pool_metrics_service_name(pool)),
        (PLURALS[("autoscaling/v2", "HorizontalPodAutoscaler")], pool_deployment_name(pool)),
        (PLURALS[("policy/v1", "PodDisruptionBudget")], pool_deployment_name(pool)),
    ]
    if service_monitor:
        names.append(
            (PLURALS[("monitoring.coreos.com/v1", "ServiceMonitor")], pool_deployment_name(pool))
        )
    return names


async def leave_previous_pool(
    rt: Runtime, body: Mapping[str, Any], voice: Voice, pool: Pool, peers: Peers
) -> None:
    """After a move to another pool: unload from the old pool's pods and release it."""
    previous = (body.get("status") or {}).get("pool")
    if not previous or previous == pool.name:
        return
    try:
        old_pool = rt.config.pools.get(previous)
    except KeyError:
        return  # the pool left the configuration; nothing of it is rendered any more
    errors = await unload_from_pods(rt, voice.name, voice.namespace, old_pool)
    for error in errors:
        logger.warning("unloading %s from pool %s: %s", voice.name, previous, error)
    await remove_from_pool(rt, voice.namespace, old_pool, peers)
