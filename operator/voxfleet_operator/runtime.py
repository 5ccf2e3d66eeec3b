"""What every reconcile shares: configuration, API clients, locks, and the voices' index."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from voxfleet_operator.config import OperatorConfig
from voxfleet_operator.kube import PLURALS, KubeClient
from voxfleet_operator.plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.voices import InvalidVoice, parse_voice

TTSVOICES = PLURALS[("voxfleet.io/v1alpha1", "TTSVoice")]
JOBS = PLURALS[("batch/v1", "Job")]
PODS = PLURALS[("v1", "Pod")]
SECRETS = PLURALS[("v1", "Secret")]
HPAS = PLURALS[("autoscaling/v2", "HorizontalPodAutoscaler")]
SERVICE_MONITOR_API = "/apis/monitoring.coreos.com/v1"
SERVICE_MONITOR_RECHECK_SECONDS = 300.0


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
