"""kopf wiring: thin handlers around `reconcile.reconcile_voice`.

Importing this module registers the handlers; `voxfleet operator` (runner.py) runs them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import aiohttp
import kopf

from voxfleet_operator.config import load_config
from voxfleet_operator.kube import KubeClient
from voxfleet_operator.reconcile import (
    Runtime,
    peer_entry,
    reconcile_voice,
    remove_from_pool,
    unload_from_pods,
)
from voxfleet_operator.spec import GROUP, PLURAL, VERSION

logger = logging.getLogger(__name__)

RESOURCE = (GROUP, VERSION, PLURAL)
RESYNC_SECONDS_ENV = "VOXFLEET_RESYNC_SECONDS"
# How often every voice is re-checked for drift (a deleted or edited child comes back).
RESYNC_SECONDS = float(os.environ.get(RESYNC_SECONDS_ENV) or 30)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # Progress and diff-base live in annotations, never in status: status is the public API
    # (and a CRD with a typed status schema would prune kopf's fields anyway).
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration"
    )
    settings.persistence.finalizer = f"{GROUP}/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    # kopf's own retries for a crashing handler back off; a voice never waits forever.
    settings.queueing.error_delays = [1, 2, 5, 10, 30, 60, 120]
    memo.runtime = Runtime(
        config=load_config(),
        client=await KubeClient.connect(),
        http=aiohttp.ClientSession(),
    )


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = getattr(memo, "runtime", None)
    if runtime is not None:
        await runtime.client.close()
        await runtime.http.close()


@kopf.index(*RESOURCE)
def voices_by_namespace(body: kopf.Body, namespace: str | None, **_: Any) -> dict[str, Any] | None:
    entry = peer_entry(body)
    return None if entry is None or not namespace else {namespace: entry}


def _entries(index: kopf.Index[str, Any] | None, namespace: str | None) -> list[dict[str, Any]]:
    # kopf always passes the index; the default only satisfies kopf's handler protocols.
    assert index is not None
    return list(index.get(namespace or "", []))


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
@kopf.on.resume(*RESOURCE)
async def reconcile(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    await reconcile_voice(memo.runtime, body, _entries(voices_by_namespace, namespace))


@kopf.timer(*RESOURCE, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS)
async def correct_drift(
    body: kopf.Body,
    namespace: str | None,
    memo: Any,
    voices_by_namespace: kopf.Index[str, Any] | None = None,
    **_: Any,
) -> None:
    if body.metadata.get("deletionTimestamp"):
        return
    await reconcile_voice(memo.runtime, body, _entries(voices_by_namespace, namespace))


@kopf.on.delete(*RESOURCE)
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
    remaining = [
        e for e in _entries(voices_by_namespace, namespace) if e["metadata"]["name"] != name
    ]
    await remove_from_pool(runtime, namespace, pool, remaining)
