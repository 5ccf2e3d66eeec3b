"""kopf wiring: thin handlers around `reconcile.reconcile_voice`.

`build_registry()` registers the handlers on a fresh kopf registry, so that each run (the
`voxfleet operator` command, or a test) chooses its own drift-correction interval.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Mapping
from typing import Any

import aiohttp
import kopf

from voxfleet_operator.cache import ObjectCache
from voxfleet_operator.config import load_config
from voxfleet_operator.context import (
    JOBS,
    PODS,
    POOL_PODS_LABELS,
    Peers,
    Runtime,
    last_valid,
    peer_entry,
)
from voxfleet_operator.kube import ApiError, KubeClient, is_transient
from voxfleet_operator.names import MANAGED_BY, POOL_LABEL, REPOSITORY_KEY_SECRET, VOICE_LABEL
from voxfleet_operator.pods import LOADED_PREFIX, pod_load_marker, pod_ready, unload_from_pods
from voxfleet_operator.pools import Pool
from voxfleet_operator.reconcile import reconcile_voice, report_forbidden
from voxfleet_operator.render.speech_api import is_speech_api_child
from voxfleet_operator.shared import remove_from_pool, sync_shared
from voxfleet_operator.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

RESOURCE = (GROUP, VERSION, PLURAL)
# A failed pass is tried again after these delays, the last one repeating; a success resets
# the count (kopf keeps it per handler and per object, and resets it when a handler succeeds).
RETRY_DELAYS_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
KOPF_REQUEST_BACKOFFS_SECONDS = (1.0, 1.0, 2.0, 3.0, 5.0, 5.0, 5.0, 5.0)


def retry_delay_seconds(retry: int) -> float:
    """The delay before retry number `retry + 1` of a failed pass."""
    return RETRY_DELAYS_SECONDS[min(max(retry, 0), len(RETRY_DELAYS_SECONDS) - 1)]


def forbidden_message(error: ApiError) -> str:
    return (
        f"the API server refused the operator: {error.message}. Grant it to the operator's "
        "ServiceAccount (the chart's RBAC, `rbac.create`); the operator tries again every "
        f"{RETRY_DELAYS_SECONDS[-1]:g} s"
    )


async def with_backoff(
    runtime: Runtime,
    retry: int,
    work: Awaitable[Any],
    body: Mapping[str, Any] | None = None,
) -> None:
    """Run one pass; on failure, back off and ask kopf to try again.

    kopf's own delay for a failing handler is a flat 60 s; a `TemporaryError` carries ours
    instead. During an API outage the wait ends as soon as the API answers again, so that
    the operator converges right after the outage, whatever the delay had reached.

    A 403 is no outage: RBAC refused a verb, which only an administrator can change. The
    voice (`body`) says so in its status (phase Failed, Available False, reason Forbidden,
    the server's message), and the pass is tried again at the longest delay, not in a
    quiet loop.
    """
    try:
        await work
    except (kopf.TemporaryError, kopf.PermanentError):
        raise
    except ApiError as error:
        if error.status != 403 or runtime.closed:
            await _back_off(runtime, retry, error)
            return
        message = forbidden_message(error)
        logger.error("%s", message)
        if body is not None:
            try:
                await report_forbidden(runtime, body, message)
            except Exception as status_error:  # the status itself may be refused
                logger.error("reporting the refusal in the status failed: %s", status_error)
        raise kopf.TemporaryError(message, delay=RETRY_DELAYS_SECONDS[-1]) from error
    except Exception as error:
        await _back_off(runtime, retry, error)


async def _back_off(runtime: Runtime, retry: int, error: Exception) -> None:
    if runtime.closed:
        return  # the operator is stopping: the pass ends with it, and is no error
    delay = retry_delay_seconds(retry)
    if is_transient(error):
        await runtime.client.health.wait_up(delay)
        delay = 0.0  # waited already, or the API is back
    raise kopf.TemporaryError(
        f"{type(error).__name__}: {error} (retry {retry + 1})", delay=delay
    ) from error


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base live in annotations, never in status: status is the public API
    # (and a CRD with a typed status schema would prune kopf's fields anyway).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    # A voice being deleted waits for its drift timer's pass in flight to end; check for
    # that often instead of kopf's default minute.
    settings.background.cancellation_polling = 0.5
    settings.watching.server_timeout = 300
    # The API server filters the watches of children and pods by label, so the operator does
    # not receive every Service, Deployment or pod of the cluster to drop them itself.
    for group, version, plural in WATCHED_CHILDREN:
        settings.watching.label_selectors[group, version, plural] = ",".join(
            f"{k}={v}" for k, v in OWN_LABELS.items()
        )
    settings.watching.label_selectors["", "v1", "pods"] = ",".join(
        f"{k}={v}" for k, v in POOL_PODS_LABELS.items()
    )
    settings.watching.label_selectors["batch", "v1", "jobs"] = VOICE_LABEL
    # The one Secret the operator may read, by name: RBAC grants its watch by that name only.
    settings.watching.field_selectors["", "v1", "secrets"] = (
        f"metadata.name={REPOSITORY_KEY_SECRET}"
    )
    # kopf's delays after its own failures (a status or annotation patch refused during an
    # outage): the same schedule as the handlers'.
    settings.queueing.error_delays = list(RETRY_DELAYS_SECONDS)
    # kopf retries each of its own requests up to 8 times; at most 5 s apart (not up to 21 s),
    # so that its writes go through within seconds of an outage's end.
    settings.networking.error_backoffs = KOPF_REQUEST_BACKOFFS_SECONDS
    memo.runtime = Runtime(
        config=load_config(),
        client=await KubeClient.connect(),
        # No keep-alive to Triton pods: an idle connection would hold a stopping pod's
        # HTTP server open until Triton's exit timeout.
        http=aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)),
        # Kept fresh by the watches below: never read again on a timer.
        cache=ObjectCache(watched=WATCHED_PLURALS),
    )


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = getattr(memo, "runtime", None)
    if runtime is not None:
        runtime.closed = True
        await runtime.client.close()
        await runtime.http.close()


def voices_by_namespace(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, Any] | None:
    entry = peer_entry(body)
    return None if entry is None or not namespace else {namespace: entry}


def _peers(
    index: kopf.Index[str, Any] | None, namespace: str | None, leaving: str | None = None
) -> Peers:
    # kopf always passes the index; the default only satisfies kopf's handler protocols.
    assert index is not None
    live = index

    def read() -> list[Mapping[str, Any]]:
        entries: list[Mapping[str, Any]] = list(live.get(namespace or "", []))
        return [e for e in entries if e["metadata"]["name"] != leaving]

    return read


async def reconcile(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    retry: int = 0,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    peers = _peers(voices_by_namespace, namespace)
    await with_backoff(memo.runtime, retry, reconcile_voice(memo.runtime, body, peers), body)


async def correct_drift(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    retry: int = 0,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    if body.metadata.get("deletionTimestamp") or memo.runtime.closed:
        return
    peers = _peers(voices_by_namespace, namespace)
    await with_backoff(memo.runtime, retry, reconcile_voice(memo.runtime, body, peers), body)


def voice_bodies(body: kopf.Body, namespace: str | None, name: str | None, **_: Any) -> Any:
    """Each voice's latest body by (namespace, name), so that events never read the API."""
    if not namespace or not name or body.metadata.get("deletionTimestamp"):
        return None
    return {(namespace, name): dict(body)}


async def _reconcile_named(
    runtime: Runtime,
    namespace: str,
    names: list[str],
    index: kopf.Index[str, Any] | None,
    bodies: kopf.Index[Any, Any] | None,
) -> None:
    for name in names:
        found = list(bodies.get((namespace, name), [])) if bodies is not None else []
        if not found or runtime.closed:
            continue
        try:
            await reconcile_voice(runtime, found[-1], _peers(index, namespace))
        except Exception:
            if runtime.closed:
                return  # the operator is stopping: no error to report
            raise


async def engine_job_changed(
    body: kopf.Body,
    type: str | None,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    voice_bodies: kopf.Index[Any, Any] | None = None,
    **_: Any,
) -> None:
    """A finished engine build moves its voice on now, not at the next drift pass; a Job
    deleted before it built its engines (running, or failed) is made again now: until it
    is, the voice's pool pods have nothing to load."""
    _remember(memo.runtime, JOBS.plural, type, body)
    conditions = (body.get("status") or {}).get("conditions") or []
    ended = {str(c.get("type")) for c in conditions if c.get("status") == "True"} & {
        "Complete",
        "Failed",
    }
    # A built Job deleted is no news to its voice, whose status has the engine key.
    wanted = "Complete" not in ended if type == "DELETED" else bool(ended)
    voice = (body.metadata.labels or {}).get(VOICE_LABEL)
    if wanted and voice and namespace and not memo.runtime.closed:
        await _reconcile_named(memo.runtime, namespace, [voice], voices_by_namespace, voice_bodies)


async def pool_pod_changed(
    body: kopf.Body,
    type: str | None,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    voice_bodies: kopf.Index[Any, Any] | None = None,
    **_: Any,
) -> None:
    """A pool pod that is ready without its voices (new, or restarted) gets them now.

    This is what makes a scale-up serve as soon as the new pod is ready.
    """
    runtime: Runtime = memo.runtime
    _remember(runtime, PODS.plural, type, body)
    pool = (body.metadata.labels or {}).get(POOL_LABEL)
    if not pool or not namespace or runtime.closed or not pod_ready(body):
        return
    annotations = body.metadata.annotations or {}
    suffix = pod_load_marker("", body)
    missing = []
    for entry in _peers(voices_by_namespace, namespace)():
        name = entry["metadata"]["name"]
        try:
            voice_pool = runtime.config.pools.get((entry.get("spec") or {}).get("pool")).name
        except KeyError:
            continue
        if voice_pool == pool and not annotations.get(LOADED_PREFIX + name, "").endswith(suffix):
            missing.append(name)
    await _reconcile_named(runtime, namespace, sorted(missing), voices_by_namespace, voice_bodies)


def _remember(runtime: Runtime, plural: str, event: str | None, body: kopf.Body) -> bool:
    """Keep the cache in line with a watch event; True when it told us something new."""
    meta = body.metadata
    if event == "DELETED":
        runtime.cache.forget(plural, meta.get("namespace") or "", meta.get("name") or "")
        return True
    # False for our own write coming back, or an event older than what the cache holds.
    return runtime.cache.seen(plural, dict(body))


async def child_changed(
    body: kopf.Body,
    type: str | None,
    resource: kopf.Resource,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    voice_bodies: kopf.Index[Any, Any] | None = None,
    **_: Any,
) -> None:
    """A child changed or went away: repair it now, not at the next drift pass.

    The event also feeds the cache, which is what lets a converged pass read nothing.
    Events of the initial listing (type None) only fill the cache: every voice is
    reconciled at start anyway.
    """
    runtime: Runtime = memo.runtime
    if not _remember(runtime, resource.plural, type, body) or type is None:
        return
    if runtime.closed or not namespace:
        return
    labels = body.metadata.labels or {}
    # One repair at a time per voice or pool: events during a repair ask for one more pass
    # after it, not for one pass each.
    target = (namespace, labels.get(VOICE_LABEL) or labels.get(POOL_LABEL) or "")
    if target in runtime.repairs:
        runtime.repairs[target] = True
        return
    runtime.repairs[target] = False
    try:
        while True:
            await _repair(runtime, namespace, body, labels, voices_by_namespace, voice_bodies)
            if not runtime.repairs.get(target) or runtime.closed:
                break
            runtime.repairs[target] = False
    except Exception as error:  # the timer repairs it if this attempt fails
        if not runtime.closed:
            logger.warning(
                "repairing %s %s/%s failed: %s",
                resource.plural,
                namespace,
                body.metadata.name,
                error,
            )
    finally:
        runtime.repairs.pop(target, None)


async def _repair(
    runtime: Runtime,
    namespace: str,
    body: kopf.Body,
    labels: Mapping[str, str],
    voices_by_namespace: kopf.Index[str, Any] | None,
    voice_bodies: kopf.Index[Any, Any] | None,
) -> None:
    if VOICE_LABEL in labels:
        await _reconcile_named(
            runtime, namespace, [labels[VOICE_LABEL]], voices_by_namespace, voice_bodies
        )
    elif POOL_LABEL in labels:
        try:
            pool = runtime.config.pools.get(labels[POOL_LABEL])
        except KeyError:
            return
        await sync_shared(runtime, namespace, _peers(voices_by_namespace, namespace), pool.name)
    elif body.metadata.name == REPOSITORY_KEY_SECRET or is_speech_api_child(labels):
        await sync_shared(runtime, namespace, _peers(voices_by_namespace, namespace))


async def delete(
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: Any,
    logger: kopf.Logger,
    retry: int = 0,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    """Unload the voice and re-own (or delete) the shared pool; its own children go by GC."""
    runtime: Runtime = memo.runtime
    runtime.deleted.add(body.metadata.uid or "")
    runtime.statuses.pop((namespace or "", name), None)
    pool_name = (body.get("spec") or {}).get("pool")
    try:
        pool = runtime.config.pools.get(pool_name)
    except KeyError:
        last = last_valid(body, runtime.config.pools)
        if last is None:
            return  # never placed on a pool: nothing shared to release
        pool = runtime.config.pools.get(last[0].spec.pool)  # an invalid edit left it there
    assert namespace is not None  # TTSVoice is namespaced
    await with_backoff(
        runtime, retry, _release(runtime, name, namespace, pool, logger, voices_by_namespace)
    )


async def _release(
    runtime: Runtime,
    name: str,
    namespace: str,
    pool: Pool,
    logger: kopf.Logger,
    index: kopf.Index[str, Any] | None,
) -> None:
    errors = await unload_from_pods(runtime, name, namespace, pool)
    for error in errors:
        # The pod is unlabelled already, so no new stream reaches it; the model stays loaded
        # until the pod restarts. Not worth blocking the deletion on.
        logger.warning(f"unloading {name}: {error}")
    await remove_from_pool(runtime, namespace, pool, _peers(index, namespace, leaving=name))


def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
    """The service account inside a pod, else the kubeconfig (no client library needed)."""
    return kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(
        settings=settings
    )


# The children the operator watches to repair them at once; Jobs and pods have their own
# handlers above, and the key Secret is watched by its name (it may be someone else's, without
# our labels). kopf watches ServiceMonitors only while their API is served.
WATCHED_CHILDREN = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("monitoring.coreos.com", "v1", "servicemonitors"),
)
OWN_LABELS = {"app.kubernetes.io/managed-by": MANAGED_BY}
# What the cache may keep without reading it again (its watch keeps it fresh). Not the
# ServiceMonitors: their watch ends with their API, which may go away.
WATCHED_PLURALS = (
    "deployments",
    "services",
    "horizontalpodautoscalers",
    "poddisruptionbudgets",
    "jobs",
    "secrets",
)


def build_registry(resync: float | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with every voxfleet handler; `resync` (the drift timer's interval)
    defaults to the environment's (`VOXFLEET_RESYNC_SECONDS`)."""
    interval = resync if resync is not None else load_config().resync_seconds
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.index(*RESOURCE, registry=registry)(voices_by_namespace)
    kopf.index(*RESOURCE, registry=registry)(voice_bodies)
    kopf.on.create(*RESOURCE, registry=registry)(reconcile)
    kopf.on.update(*RESOURCE, field="spec", registry=registry)(reconcile)
    kopf.on.resume(*RESOURCE, registry=registry)(reconcile)
    kopf.timer(*RESOURCE, interval=interval, initial_delay=interval, registry=registry)(
        correct_drift
    )
    kopf.on.delete(*RESOURCE, registry=registry)(delete)
    kopf.on.event("batch", "v1", "jobs", labels={VOICE_LABEL: kopf.PRESENT}, registry=registry)(
        engine_job_changed
    )
    kopf.on.event("", "v1", "pods", labels=dict(POOL_PODS_LABELS), registry=registry)(
        pool_pod_changed
    )
    for group, version, plural in WATCHED_CHILDREN:
        kopf.on.event(group, version, plural, labels=OWN_LABELS, registry=registry)(child_changed)
    kopf.on.event("", "v1", "secrets", registry=registry)(child_changed)
    return registry
