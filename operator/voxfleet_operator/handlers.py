"""kopf wiring: thin handlers around `reconcile.reconcile_voice`.

`build_registry()` registers the handlers on a fresh kopf registry, so that each run (the
`voxfleet operator` command, or a test) chooses its own drift-correction interval.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import aiohttp
import kopf

from voxfleet_operator.config import load_config
from voxfleet_operator.kube import KubeClient, login_info
from voxfleet_operator.names import POOL_LABEL, VOICE_LABEL
from voxfleet_operator.pods import LOADED_PREFIX, pod_load_marker, pod_ready, unload_from_pods
from voxfleet_operator.reconcile import reconcile_voice
from voxfleet_operator.runtime import TTSVOICES, Peers, Runtime, peer_entry
from voxfleet_operator.shared import remove_from_pool
from voxfleet_operator.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

RESOURCE = (GROUP, VERSION, PLURAL)
RESYNC_SECONDS_ENV = "VOXFLEET_RESYNC_SECONDS"
DEFAULT_RESYNC_SECONDS = 30.0


def resync_seconds() -> float:
    """How often every voice is re-checked for drift (a deleted or edited child comes back)."""
    raw = os.environ.get(RESYNC_SECONDS_ENV) or str(DEFAULT_RESYNC_SECONDS)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{RESYNC_SECONDS_ENV} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{RESYNC_SECONDS_ENV} must be positive, got {value}")
    return value


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
    # kopf's own retries for a crashing handler back off; a voice never waits forever.
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60, 120]
    memo.runtime = Runtime(
        config=load_config(),
        client=await KubeClient.connect(),
        # No keep-alive to Triton pods: an idle connection would hold a stopping pod's
        # HTTP server open until Triton's exit timeout.
        http=aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)),
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
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    await reconcile_voice(memo.runtime, body, _peers(voices_by_namespace, namespace))


async def correct_drift(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    if body.metadata.get("deletionTimestamp") or memo.runtime.closed:
        return
    await reconcile_voice(memo.runtime, body, _peers(voices_by_namespace, namespace))


async def _reconcile_named(
    runtime: Runtime, namespace: str, names: list[str], index: kopf.Index[str, Any] | None
) -> None:
    for name in names:
        body = await runtime.client.get(TTSVOICES, namespace, name)
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            continue
        await reconcile_voice(runtime, body, _peers(index, namespace))


async def engine_job_changed(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    """A finished engine build moves its voice on now, not at the next drift pass."""
    conditions = (body.get("status") or {}).get("conditions") or []
    finished = any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )
    voice = (body.metadata.labels or {}).get(VOICE_LABEL)
    if finished and voice and namespace and not memo.runtime.closed:
        await _reconcile_named(memo.runtime, namespace, [voice], voices_by_namespace)


async def pool_pod_changed(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    """A pool pod that is ready without its voices (new, or restarted) gets them now.

    This is what makes a scale-up serve as soon as the new pod is ready.
    """
    runtime: Runtime = memo.runtime
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
    await _reconcile_named(runtime, namespace, sorted(missing), voices_by_namespace)


async def delete(
    body: kopf.Body,
    name: str,
    namespace: str | None,
    memo: Any,
    logger: kopf.Logger,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    """Unload the voice and re-own (or delete) the shared pool; its own children go by GC."""
    runtime: Runtime = memo.runtime
    pool_name = (body.get("spec") or {}).get("pool")
    try:
        pool = runtime.config.pools.get(pool_name)
    except KeyError:
        return  # never placed on a pool: nothing shared to release
    assert namespace is not None  # TTSVoice is namespaced
    errors = await unload_from_pods(runtime, name, namespace, pool)
    for error in errors:
        # The pod is unlabelled already, so no new stream reaches it; the model stays loaded
        # until the pod restarts. Not worth blocking the deletion on.
        logger.warning(f"unloading {name}: {error}")
    await remove_from_pool(
        runtime, namespace, pool, _peers(voices_by_namespace, namespace, leaving=name)
    )


def login(settings: kopf.OperatorSettings, **_: Any) -> kopf.ConnectionInfo | None:
    """$KUBECONFIG, else the service account inside a pod, else ~/.kube/config."""
    info: kopf.ConnectionInfo | None = login_info(settings)
    return info


def build_registry(resync: float | None = None) -> kopf.OperatorRegistry:
    """A kopf registry with every voxfleet handler; `resync` defaults to the environment's."""
    interval = resync if resync is not None else resync_seconds()
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login)
    kopf.on.startup(registry=registry)(startup)
    kopf.on.cleanup(registry=registry)(cleanup)
    kopf.index(*RESOURCE, registry=registry)(voices_by_namespace)
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
    kopf.on.event(
        "", "v1", "pods", labels={"app.kubernetes.io/name": "voxfleet-triton"}, registry=registry
    )(pool_pod_changed)
    return registry
