"""The operator really running (kopf, in this process) against a Kubernetes API.

By default the API is the KMock emulator, with the behaviours of a real API server that KMock
lacks scripted below. Set `VOXFLEET_E2E_KUBECONFIG` to run the same tests against a real
cluster (kind): the CRD must be installed there (`voxfleet crd | kubectl apply -f -`), and
tests that count the emulator's requests or play a controller that the cluster has are
skipped or become no-ops.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.web
import kmock
import pytest
import yaml

from e2e.cluster.apiserver import ScriptedKubernetes
from e2e.cluster.waiting import eventually as poll_until

REAL_CLUSTER = bool(os.environ.get("VOXFLEET_E2E_KUBECONFIG"))
NAMESPACE = "voxfleet-e2e" if REAL_CLUSTER else "default"

# The operator watches its children (to repair them at once and to read them from a cache).
CHILD_VERBS = {"get", "list", "watch", "create", "patch", "delete"}
RESOURCES: dict[str, kmock.ResourceInfo] = {
    # kopf waits to discover these two before it starts any watch.
    "v1/namespaces": kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs={"get", "list", "watch"}
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition", namespaced=False, verbs={"get", "list", "watch"}
    ),
    "voxfleet.io/v1alpha1/ttsvoices": kmock.ResourceInfo(
        kind="TTSVoice",
        singular="ttsvoice",
        namespaced=True,
        shortnames={"ttsv"},
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    ),
    "batch/v1/jobs": kmock.ResourceInfo(
        kind="Job",
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment", namespaced=True, verbs=CHILD_VERBS
    ),
    "v1/services": kmock.ResourceInfo(kind="Service", namespaced=True, verbs=CHILD_VERBS),
    "v1/secrets": kmock.ResourceInfo(kind="Secret", namespaced=True, verbs=CHILD_VERBS),
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True, verbs=CHILD_VERBS),
    "v1/pods": kmock.ResourceInfo(
        kind="Pod",
        namespaced=True,
        subresources={"status"},
        verbs={"get", "list", "watch", "create", "patch", "delete"},
    ),
    "v1/events": kmock.ResourceInfo(kind="Event", namespaced=True),
    "autoscaling/v2/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler", namespaced=True, verbs=CHILD_VERBS
    ),
    "policy/v1/poddisruptionbudgets": kmock.ResourceInfo(
        kind="PodDisruptionBudget", namespaced=True, verbs=CHILD_VERBS
    ),
    "v1/persistentvolumeclaims": kmock.ResourceInfo(
        kind="PersistentVolumeClaim", namespaced=True, verbs=CHILD_VERBS
    ),
}


class Api:
    """What tests do to the cluster, the same way for KMock and for a real cluster."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        server: str,
        emulator: Any,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.session = session
        self.server = server.rstrip("/")
        self.emulator: ScriptedKubernetes | None = emulator
        self.headers = dict(headers or {})

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        kwargs: dict[str, Any] = {"headers": dict(self.headers)}
        if body is not None:
            kwargs["json"] = body
            kwargs["headers"]["Content-Type"] = (
                "application/merge-patch+json" if method == "PATCH" else "application/json"
            )
        async with self.session.request(method, self.server + path, **kwargs) as response:
            data = await response.json(content_type=None)
            if response.status == 404:
                return None
            assert response.status < 400, f"{method} {path}: {response.status} {data}"
            return data

    @staticmethod
    def path(api: str, plural: str, name: str | None = None, ns: str = NAMESPACE) -> str:
        base = f"/api/{api}" if api == "v1" else f"/apis/{api}"
        return f"{base}/namespaces/{ns}/{plural}" + (f"/{name}" if name else "")

    async def get(self, api: str, plural: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.call("GET", self.path(api, plural, name))
        return result

    async def list(self, api: str, plural: str) -> list[dict[str, Any]]:
        result = await self.call("GET", self.path(api, plural))
        return list(result["items"])

    async def create(self, api: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        obj.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
        result: dict[str, Any] = await self.call("POST", self.path(api, plural), obj)
        return result

    async def patch(
        self, api: str, plural: str, name: str, patch: dict[str, Any], sub: str = ""
    ) -> None:
        await self.call("PATCH", self.path(api, plural, name) + (f"/{sub}" if sub else ""), patch)

    async def delete(self, api: str, plural: str, name: str) -> None:
        await self.call("DELETE", self.path(api, plural, name))

    def writes(self) -> list[str]:
        """PATCH, PUT and POST requests the emulator has served so far (KMock only)."""
        assert self.emulator is not None
        return list(self.emulator.writes)


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll `check` until it returns something truthy; fail with its last value."""
    return await poll_until(check, timeout=timeout, interval=interval)


@pytest.fixture()
async def api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Api]:
    if REAL_CLUSTER:
        monkeypatch.setenv("KUBECONFIG", os.environ["VOXFLEET_E2E_KUBECONFIG"])
        from voxfleet_operator.kube import KubeClient

        client = await KubeClient.connect()
        auth = {"Authorization": client._authorization} if client._authorization else {}
        real = Api(client._session, client._server, None, auth)
        try:
            namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
            if await real.call("GET", f"/api/v1/namespaces/{NAMESPACE}") is None:
                await real.call("POST", "/api/v1/namespaces", namespace)
            yield real
        finally:
            await client.close()
        return
    async with ScriptedKubernetes() as emulator, kmock.Server(emulator) as server:
        for name, info in RESOURCES.items():
            emulator.resources[name] = info
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": str(server.url)}}],
                    "users": [{"name": "kmock", "user": {"token": "kmock"}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "kmock"}}
                    ],
                    "current-context": "kmock",
                }
            )
        )
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        async with aiohttp.ClientSession() as session:
            yield Api(session, str(server.url), emulator)


POOLS = {
    "defaultPool": "t4",
    "pools": [
        {
            "name": "t4",
            "gpuProduct": "Tesla-T4",
            "maxPods": 4,
            "nodeSelector": {"cloud.google.com/gke-accelerator": "nvidia-tesla-t4"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
        },
        {"name": "l4", "gpuProduct": "NVIDIA-L4", "maxPods": 2},
    ],
}
REPOSITORY_KEY = "e2e-repository-key"
ENGINE_CACHE_CLAIM = "voxfleet-engine-cache"


def engine_cache_claim() -> dict[str, Any]:
    """The engine-cache claim the chart's users create in each voice namespace."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": ENGINE_CACHE_CLAIM},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "20Gi"}},
        },
    }


@contextlib.asynccontextmanager
async def running_operator(tmp_path: Path, resync_seconds: float) -> AsyncIterator[None]:
    """kopf running the voxfleet handlers cluster-wide in a thread of its own, until exit.

    A thread and event loop of its own, as `kopf run` has: at exit kopf waits for every task
    of its loop, which must not include the emulator's. Cluster-wide on purpose: KMock answers
    500 to `GET /api/v1/namespaces`, which kopf needs to watch a namespace list.
    """
    import kopf
    from voxfleet_operator.handlers import build_registry

    pools = tmp_path / "pools.yaml"
    pools.write_text(yaml.safe_dump(POOLS))
    # Set for the operator's thread, and put back afterwards for the tests that follow.
    saved = {k: os.environ.get(k) for k in ("VOXFLEET_POOLS_FILE", "VOXFLEET_WATCH_NAMESPACES")}
    os.environ["VOXFLEET_POOLS_FILE"] = str(pools)
    os.environ.pop("VOXFLEET_WATCH_NAMESPACES", None)
    stop = threading.Event()
    ready = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                kopf.operator(
                    registry=build_registry(resync_seconds),
                    clusterwide=True,
                    standalone=True,
                    stop_flag=stop,
                    ready_flag=ready,
                )
            )
        except BaseException as error:  # reported to the test below
            errors.append(error)

    thread = threading.Thread(target=run, name="kopf", daemon=True)
    thread.start()
    for _ in range(200):
        if ready.is_set() or errors:
            break
        await asyncio.sleep(0.05)
    try:
        assert not errors, f"the operator failed to start: {errors[0]!r}"
        yield
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 15)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    assert not errors, f"the operator crashed: {errors[0]!r}"


@pytest.fixture()
async def operator(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    """The operator with a short drift-correction interval (0.5 s)."""
    for name in ("VOXFLEET_POOLS_FILE", "VOXFLEET_REPOSITORY_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    if await api.get("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM) is None:
        await api.create("v1", "persistentvolumeclaims", engine_cache_claim())
    async with running_operator(tmp_path, resync_seconds=0.5):
        yield
        if REAL_CLUSTER:
            # A real cluster outlives the test: delete its voices while the operator still
            # runs to release their finalizers.
            for item in await api.list("voxfleet.io/v1alpha1", "ttsvoices"):
                await api.delete("voxfleet.io/v1alpha1", "ttsvoices", item["metadata"]["name"])

            async def no_voices() -> bool:
                return not await api.list("voxfleet.io/v1alpha1", "ttsvoices")

            await eventually(no_voices, timeout=60)
