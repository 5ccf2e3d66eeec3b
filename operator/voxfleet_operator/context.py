"""What every reconcile shares: configuration, API clients, locks, and the voices' index."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from voxfleet_operator.cache import ObjectCache
from voxfleet_operator.config import OperatorConfig
from voxfleet_operator.kube import PLURALS, KubeClient
from voxfleet_operator.metrics import VoiceMetricsReader, empty_status
from voxfleet_operator.names import (
    HEALTH_PORT,
    MEMORY_PATH,
    REPOSITORY_KEY_SECRET,
    REPOSITORY_KEY_SECRET_KEY,
)
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.voices import InvalidVoice, parse_voice

TTSVOICES = PLURALS[("voxfleet.io/v1alpha1", "TTSVoice")]
JOBS = PLURALS[("batch/v1", "Job")]
PODS = PLURALS[("v1", "Pod")]
SECRETS = PLURALS[("v1", "Secret")]
HPAS = PLURALS[("autoscaling/v2", "HorizontalPodAutoscaler")]
PVCS = PLURALS[("v1", "PersistentVolumeClaim")]
SERVICE_MONITOR_API = "/apis/monitoring.coreos.com/v1"
SERVICE_MONITOR_RECHECK_SECONDS = 300.0
# Every pool pod carries this label (render/pool.py); the operator watches and lists by it.
POOL_PODS_LABELS = {"app.kubernetes.io/name": "voxfleet-triton"}
# A pod's memory report is read again after this long, and given up on after the other.
POD_REPORT_SECONDS = 2.0
POD_REPORT_TIMEOUT_SECONDS = 2.0


def _port(pod: Mapping[str, Any], name: str, default: int) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == name:
                return int(port["containerPort"])
    return default


@dataclass
class Runtime:
    """What every reconcile shares: configuration, API clients, per-namespace locks."""

    config: OperatorConfig
    client: KubeClient
    http: aiohttp.ClientSession
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    voice_locks: dict[tuple[str, str], asyncio.Lock] = field(default_factory=dict)
    cache: ObjectCache = field(default_factory=ObjectCache)
    # Uids of voices whose delete handler has run: a pass that began before the deletion
    # must not own shared children with them again.
    deleted: set[str] = field(default_factory=set)
    # namespace -> when its engine-cache claim was last found unusable, and why.
    unusable_claims: dict[str, tuple[float, str]] = field(default_factory=dict)
    # (namespace, voice or pool) with an event-driven repair in flight -> one more wanted.
    repairs: dict[tuple[str, str], bool] = field(default_factory=dict)
    closed: bool = False
    # (namespace, pod, voice, marker) -> (failures so far, retry not before, last error)
    load_failures: dict[tuple[str, str, str, str], tuple[int, float, str]] = field(
        default_factory=dict
    )
    _service_monitor: tuple[float, bool] | None = None
    # (namespace, pod) -> (when read, its memory report or None where it did not answer)
    pod_reports: dict[tuple[str, str], tuple[float, dict[str, Any] | None]] = field(
        default_factory=dict
    )
    # (namespace, pool) -> {voice: MiB} of the voices that fit no ready pod of the pool yet
    pending_memory: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    # (namespace, pool) -> the pods its voices need by memory (the pool HPA's floor)
    memory_pods: dict[tuple[str, str], int] = field(default_factory=dict)
    # Per-voice figures from Prometheus for the status (None: no URL configured).
    voice_metrics: VoiceMetricsReader | None = None
    # (namespace, voice) -> (resourceVersion, status) of the operator's last status write.
    statuses: dict[tuple[str, str], tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.voice_metrics is None and self.config.prometheus_url:
            self.voice_metrics = VoiceMetricsReader(self.config.prometheus_url)

    async def voice_status_metrics(self, namespace: str, voice: str) -> dict[str, Any]:
        """The voice's live streams, first-audio p95 and refusals for its status; every field
        None (removed) without a Prometheus URL."""
        if self.voice_metrics is None:
            return empty_status()
        return await self.voice_metrics.voice_status(namespace, voice)

    def with_latest_status(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """`body` with the status the operator last wrote where `body` is older than that
        write: kopf's index can hand a pass the voice as it was before the previous pass
        wrote its status, and a status built on that would move a condition's
        lastTransitionTime, and be written, for nothing."""
        meta = body.get("metadata") or {}
        written = self.statuses.get((str(meta.get("namespace")), str(meta.get("name"))))
        if written is None:
            return body
        version = resource_version(body)
        if version is not None and version >= written[0]:
            return body
        return {**body, "status": written[1]}

    def status_written(self, answer: Mapping[str, Any]) -> None:
        """Remember the voice's status as the API server answered a status write."""
        meta = answer.get("metadata") or {}
        version = resource_version(answer)
        if version is not None:
            key = (str(meta.get("namespace")), str(meta.get("name")))
            self.statuses[key] = (version, dict(answer.get("status") or {}))

    def lock(self, namespace: str) -> asyncio.Lock:
        return self.locks.setdefault(namespace, asyncio.Lock())

    def voice_lock(self, namespace: str, name: str) -> asyncio.Lock:
        """One pass at a time per voice: its own events, the drift timer, a finished Job and
        a ready pod all start passes, and two at once would load it onto a pod twice."""
        return self.voice_locks.setdefault((namespace, name), asyncio.Lock())

    async def key_secret(self, namespace: str) -> dict[str, Any] | None:
        """The namespace's repository-key Secret (cached, and kept fresh by its watch)."""
        cached = self.cache.lookup(SECRETS.plural, namespace, REPOSITORY_KEY_SECRET)
        if cached is not None:
            return cached
        live = await self.client.get(SECRETS, namespace, REPOSITORY_KEY_SECRET)
        if live is not None:
            self.cache.seen(SECRETS.plural, live)
        return live

    async def repository_key(self, namespace: str) -> str:
        """The key that opens Triton's repository API on this namespace's pools."""
        key = secret_key(await self.key_secret(namespace))
        if key is None:
            raise LookupError(
                f"no repository key: Secret {REPOSITORY_KEY_SECRET} in {namespace} is missing "
                f"or has no {REPOSITORY_KEY_SECRET_KEY!r} entry"
            )
        return key

    async def pool_pods(self, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The namespace's pods with `labels`, from the cache (listed once, then events)."""
        if not self.cache.pods_listed(namespace):
            selector = ",".join(f"{k}={v}" for k, v in POOL_PODS_LABELS.items())
            self.cache.replace_pods(namespace, await self.client.list(PODS, namespace, selector))
        return self.cache.pods(namespace, labels)

    async def pod_memory(self, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """A ready pool pod's memory report (its health port's /memory), read again at most
        every POD_REPORT_SECONDS; None where it does not answer (placement then leaves the
        check to the pod's own voice host)."""
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        key = (str(meta.get("namespace")), str(meta.get("name")))
        now = time.monotonic()
        cached = self.pod_reports.get(key)
        if cached is not None and now - cached[0] < POD_REPORT_SECONDS:
            return cached[1]
        report: dict[str, Any] | None = None
        url = f"http://{status.get('podIP')}:{_port(pod, 'health', HEALTH_PORT)}{MEMORY_PATH}"
        try:
            timeout = aiohttp.ClientTimeout(total=POD_REPORT_TIMEOUT_SECONDS)
            async with self.http.get(url, timeout=timeout) as response:
                if response.status == 200:
                    report = dict(await response.json())
        except (aiohttp.ClientError, TimeoutError, ValueError):
            report = None
        self.pod_reports[key] = (now, report)
        return report

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


def resource_version(obj: Mapping[str, Any]) -> int | None:
    """An object's resourceVersion as a number (opaque in general: None where it is not)."""
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def secret_key(secret: Mapping[str, Any] | None) -> str | None:
    """The repository key a Secret holds, or None."""
    encoded = ((secret or {}).get("data") or {}).get(REPOSITORY_KEY_SECRET_KEY)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded).decode() or None
    except (ValueError, UnicodeDecodeError):
        return None


# The last spec the operator found valid, with its generation (JSON), kept on the voice so
# that an invalid edit leaves the voice serving as it was, even across operator restarts.
LAST_VALID_SPEC = "voxfleet.io/last-valid-spec"


def valid_spec_record(generation: int | None, spec: Mapping[str, Any]) -> str:
    return json.dumps({"generation": generation, "spec": spec}, sort_keys=True)


def last_valid(body: Mapping[str, Any], pools: PoolsConfig) -> tuple[Voice, int | None] | None:
    """The voice as of its last valid spec, and that spec's generation; None if none."""
    meta = body.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(LAST_VALID_SPEC)
    if not raw:
        return None
    try:
        record = json.loads(raw)
        voice = parse_voice(meta["name"], meta["namespace"], record["spec"], pools)
    except (ValueError, KeyError, TypeError):  # InvalidVoice is a ValueError
        return None
    return voice, record.get("generation")


def peer_entry(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the namespace index keeps of a voice: enough to own children and plan pools."""
    meta = body.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    annotations = meta.get("annotations") or {}
    entry = {
        "apiVersion": body.get("apiVersion", TTSVOICES.api_version),
        "kind": body.get("kind", "TTSVoice"),
        "metadata": {
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "namespace": meta.get("namespace"),
        },
        "spec": dict(body.get("spec") or {}),
    }
    if LAST_VALID_SPEC in annotations:
        entry["metadata"]["annotations"] = {LAST_VALID_SPEC: annotations[LAST_VALID_SPEC]}
    return entry


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
        if entry["metadata"].get("uid") in rt.deleted:
            continue
        try:
            voice = parse_voice(
                entry["metadata"]["name"], namespace, entry["spec"], rt.config.pools
            )
        except InvalidVoice:
            # An invalid edit of a voice that was valid: it keeps its place on its pool.
            last = last_valid(
                {**entry, "metadata": {**entry["metadata"], "namespace": namespace}},
                rt.config.pools,
            )
            if last is None:
                continue
            voice = last[0]
        peers.append(Peer(entry, voice, rt.config.pools.get(voice.spec.pool)))
    return sorted(peers, key=lambda p: p.voice.name)
