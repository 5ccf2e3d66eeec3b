"""One level-based pass over a voice: read the world, make children match, report status.

Handlers (create, update, resume, the drift timer) all call `reconcile_voice`; it is
idempotent, writes only what differs, and never raises for a spec that can never work.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from voxfleet_operator import loading
from voxfleet_operator.children import ensure, with_owners
from voxfleet_operator.config import OperatorConfig
from voxfleet_operator.kube import PLURALS, KubeClient, Resource
from voxfleet_operator.names import (
    ENGINE_KEY_LABEL,
    MANAGED_BY,
    VOICE_LABEL,
    endpoint,
    engine_job_name,
    engine_key,
    pool_deployment_name,
    pool_selector,
    serving_label,
)
from voxfleet_operator.plan import Voice, plan_pool
from voxfleet_operator.pools import Pool
from voxfleet_operator.render import render_pool, render_voice
from voxfleet_operator.render.voice import build_repository_key_secret
from voxfleet_operator.spec import TTSVoiceSpec
from voxfleet_operator.status import (
    AVAILABLE,
    ENGINE_READY,
    SCHEDULED,
    Cond,
    build_status,
    failed_conditions,
    status_changed,
)
from voxfleet_operator.voices import InvalidVoice, parse_voice

logger = logging.getLogger(__name__)

TTSVOICES = PLURALS[("voxfleet.io/v1alpha1", "TTSVoice")]
JOBS = PLURALS[("batch/v1", "Job")]
PODS = PLURALS[("v1", "Pod")]
DEPLOYMENTS = PLURALS[("apps/v1", "Deployment")]
SECRETS = PLURALS[("v1", "Secret")]
LOADED_PREFIX = "loaded.voxfleet.io/"
SERVICE_MONITOR_API = "/apis/monitoring.coreos.com/v1"
SERVICE_MONITOR_RECHECK_SECONDS = 300.0
# A load Triton refused is tried again after 5 s, 10 s, 20 s ... at most every 5 minutes.
LOAD_RETRY_FIRST_SECONDS = 5.0
LOAD_RETRY_MAX_SECONDS = 300.0


@dataclass
class Runtime:
    """What every reconcile shares: configuration, API clients, per-namespace locks."""

    config: OperatorConfig
    client: KubeClient
    http: aiohttp.ClientSession
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    closed: bool = False
    # (namespace, pod, voice, marker) -> (failures so far, retry not before, last error)
    load_failures: dict[tuple[str, str, str, str], tuple[int, float, str]] = field(
        default_factory=dict
    )
    _service_monitor: tuple[float, bool] | None = None

    def lock(self, namespace: str) -> asyncio.Lock:
        return self.locks.setdefault(namespace, asyncio.Lock())

    async def service_monitor_available(self) -> bool:
        """Whether the ServiceMonitor CRD is served (checked again every few minutes)."""
        now = time.monotonic()
        if (
            self._service_monitor
            and now - self._service_monitor[0] < SERVICE_MONITOR_RECHECK_SECONDS
        ):
            return self._service_monitor[1]
        available = await self.client.exists(SERVICE_MONITOR_API)
        self._service_monitor = (now, available)
        return available


def peer_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the namespace index keeps of a voice: enough to own children and plan pools."""
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    return {
        "apiVersion": body.get("apiVersion", TTSVOICES.api_version),
        "kind": body.get("kind", "TTSVoice"),
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "namespace": meta.get("namespace"),
        },
        "spec": dict(body.get("spec") or {}),
    }


# Reads the voices of a namespace as they are now (kopf's live index); called under the
# namespace's lock, so the last writer of a shared child always saw the latest set of voices.
Peers = Callable[[], list[Mapping[str, Any]]]


@dataclass(frozen=True)
class Peer:
    body: Mapping[str, Any]
    voice: Voice
    pool: Pool


def valid_peers(rt: Runtime, namespace: str, entries: Iterable[Mapping[str, Any]]) -> list[Peer]:
    peers = []
    for entry in entries:
        try:
            voice = parse_voice(
                entry["metadata"]["name"], namespace, entry["spec"], rt.config.pools
            )
        except InvalidVoice:
            continue
        peers.append(Peer(entry, voice, rt.config.pools.get(voice.spec.pool)))
    return sorted(peers, key=lambda p: p.voice.name)


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
        by_pool: dict[str, list[Peer]] = {}
        for peer in members:
            by_pool.setdefault(peer.pool.name, []).append(peer)
        monitor = await rt.service_monitor_available()
        for pool_name, pool_members in sorted(by_pool.items()):
            if pool is not None and pool_name != pool:
                continue
            plan = plan_pool(pool_members[0].pool, namespace, [m.voice for m in pool_members])
            pool_owners = [m.body for m in pool_members]
            for child in render_pool(plan, rt.config.engine_cache_pvc, monitor):
                _, live = await ensure(rt.client, with_owners(child, pool_owners))
                if child["kind"] == "Deployment":
                    deployments[pool_name] = live
    return deployments


async def sync_key_secret(rt: Runtime, namespace: str, owners: list[Mapping[str, Any]]) -> None:
    """The namespace's copy of the repository key, unless someone else manages that Secret.

    In the chart's own namespace the Secret comes from Helm; taking it over would let the
    garbage collector delete it with the last voice.
    """
    secret = build_repository_key_secret(namespace, rt.config.repository_key)
    live = await rt.client.get(SECRETS, namespace, secret["metadata"]["name"])
    if live is not None:
        labels = (live.get("metadata") or {}).get("labels") or {}
        if labels.get("app.kubernetes.io/managed-by") != MANAGED_BY:
            return
    await ensure(rt.client, with_owners(secret, owners))


async def remove_from_pool(rt: Runtime, namespace: str, pool: Pool, peers: Peers) -> None:
    """After a voice leaves: re-own the shared children, or delete its pool's if it was last."""
    await sync_shared(rt, namespace, peers, pool.name)
    async with rt.lock(namespace):
        if any(p.pool.name == pool.name for p in valid_peers(rt, namespace, peers())):
            return
        plan_objects = render_pool(
            plan_pool(pool, namespace, [_placeholder_voice(namespace, pool)]),
            rt.config.engine_cache_pvc,
            await rt.service_monitor_available(),
        )
        for obj in plan_objects:
            resource = PLURALS[(obj["apiVersion"], obj["kind"])]
            await rt.client.delete(resource, namespace, obj["metadata"]["name"])


def _placeholder_voice(namespace: str, pool: Pool) -> Voice:
    # Only the names of a pool's objects are needed to delete them; they do not depend on
    # the voices, so any valid voice gives the same names.
    spec = TTSVoiceSpec.model_validate({"source": {"url": "https://x/v.onnx", "sha256": "0" * 64}})
    return Voice(name="placeholder", namespace=namespace, spec=spec)


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


# --- engines -------------------------------------------------------------------------------


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
    job = await rt.client.get(JOBS, voice.namespace, job_name)
    if job is None:
        _, job = await ensure(rt.client, with_owners(job_doc, [body]))
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


# --- pods ----------------------------------------------------------------------------------


def pod_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _http_port(pod: Mapping[str, Any]) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == "http":
                return int(port["containerPort"])
    return 8000


def _restarts(pod: Mapping[str, Any]) -> int:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return sum(int(s.get("restartCount") or 0) for s in statuses)


def pod_load_marker(digest: str, pod: Mapping[str, Any]) -> str:
    """What a pod's annotation must say for the voice to count as loaded on it now.

    A restarted Triton container has lost its loaded models although the pod keeps its
    labels, so the restart count is part of the marker.
    """
    return f"{digest}.r{_restarts(pod)}"


async def sync_pods(
    rt: Runtime, voice: Voice, pool: Pool, key: str, engine_ready: bool
) -> tuple[int, int, list[str]]:
    """Load the voice on ready pool pods that lack it; return (ready pods, serving, errors)."""
    selector = ",".join(f"{k}={v}" for k, v in pool_selector(pool.name).items())
    pods = await rt.client.list(PODS, voice.namespace, selector)
    plan = loading.serving_plan(voice, pool, key)
    digest = loading.load_digest(plan)
    ready = [p for p in pods if pod_ready(p)]
    serving = 0
    errors: list[str] = []
    body: dict[str, Any] | None = None
    for pod in ready:
        meta = pod["metadata"]
        marker = pod_load_marker(digest, pod)
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if (
            annotations.get(LOADED_PREFIX + voice.name) == marker
            and labels.get(serving_label(voice.name)) == "true"
        ):
            serving += 1
            continue
        if not engine_ready:
            continue
        attempt = (voice.namespace, meta["name"], voice.name, marker)
        failures, retry_at, last_error = rt.load_failures.get(attempt, (0, 0.0, ""))
        if time.monotonic() < retry_at:
            errors.append(last_error)
            continue
        try:
            if body is None:
                body = loading.load_request(voice.name, loading.model_repository_files(plan))
            url = f"http://{pod['status']['podIP']}:{_http_port(pod)}"
            await loading.load_voice(rt.http, url, voice.name, body, rt.config.repository_key)
        except Exception as error:  # an import, a refusal or a network error: all reported
            message = f"pod {meta['name']}: {error}"
            delay = min(LOAD_RETRY_FIRST_SECONDS * 2**failures, LOAD_RETRY_MAX_SECONDS)
            rt.load_failures[attempt] = (failures + 1, time.monotonic() + delay, message)
            errors.append(message)
            continue
        rt.load_failures.pop(attempt, None)
        await rt.client.patch(
            PODS,
            voice.namespace,
            meta["name"],
            {
                "metadata": {
                    "labels": {serving_label(voice.name): "true"},
                    "annotations": {LOADED_PREFIX + voice.name: marker},
                }
            },
        )
        serving += 1
    return len(ready), serving, errors


async def unload_from_pods(rt: Runtime, name: str, namespace: str, pool: Pool) -> list[str]:
    selector = ",".join(f"{k}={v}" for k, v in pool_selector(pool.name).items())
    errors = []
    for pod in await rt.client.list(PODS, namespace, selector):
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if serving_label(name) not in labels and LOADED_PREFIX + name not in annotations:
            continue
        # Unlabel first so that the Service stops routing new streams before the unload.
        await rt.client.patch(
            PODS,
            namespace,
            meta["name"],
            {
                "metadata": {
                    "labels": {serving_label(name): None},
                    "annotations": {LOADED_PREFIX + name: None},
                }
            },
        )
        if pod_ready(pod):
            url = f"http://{pod['status']['podIP']}:{_http_port(pod)}"
            try:
                await loading.unload_voice(rt.http, url, name, rt.config.repository_key)
            except loading.LoadError as error:
                errors.append(str(error))
    return errors


# --- the pass ------------------------------------------------------------------------------


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
    key = engine_key(voice.spec, pool)
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
    await write_status(rt, body, status)
    return status


__all__ = [
    "Resource",
    "Runtime",
    "peer_entry",
    "reconcile_voice",
    "remove_from_pool",
    "unload_from_pods",
]
