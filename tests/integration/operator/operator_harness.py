"""The operator really running (kopf, in this process) against a real kube-apiserver.

One control plane per test session (etcd, kube-apiserver, and the controller manager's
garbage collector, namespace, service-account and claim-protection controllers; no
scheduler, no Job controller and no kubelet: tests that need a Job finished or a pod ready
write that status themselves), built by `make setup` (e2e/cluster/controlplane.py), with
the chart's CRD installed. Each test works in the `default` namespace, emptied after it.

The operator reaches the API through `FaultProxy` (faults.py), which passes everything on
and can inject what a real server will not do on request (503s, 429s, 409s, 401s) and
count the operator's requests; the tests' own `Api` talks to the API server directly,
through the official Python client (`kubernetes.aio`, via e2e/cluster/kube.py).

Set `VOXFLEET_E2E_KUBECONFIG` to run the same tests against another cluster (kind): the CRD
must be installed there (`voxfleet crd | kubectl apply -f -`), and the tests that need the
fault proxy are skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster.controlplane import ControlPlane
from cluster.kube import MERGE_PATCH, ApiError, Kube
from cluster.waiting import eventually as poll_until
from faults import FaultProxy

ROOT = Path(__file__).resolve().parents[3]
CRD = ROOT / "charts" / "voxfleet" / "crds" / "ttsvoices.voxfleet.io.yaml"
REAL_CLUSTER = bool(os.environ.get("VOXFLEET_E2E_KUBECONFIG"))
NAMESPACE = "voxfleet-e2e" if REAL_CLUSTER else "default"
TEST_CONTROLLERS = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "persistentvolumeclaim-protection-controller",
)
# What a test may leave in a namespace, emptied after each test.
CLEANED = (
    ("batch/v1", "jobs"),
    ("apps/v1", "deployments"),
    ("v1", "services"),
    ("v1", "secrets"),
    ("v1", "pods"),
    ("autoscaling/v2", "horizontalpodautoscalers"),
    ("policy/v1", "poddisruptionbudgets"),
    ("v1", "persistentvolumeclaims"),
)


class Api:
    """What tests do to the cluster: plain verbs by group/version and plural, objects as
    dicts; 404 is None. `faults` is the proxy in front of the operator (None on kind)."""

    def __init__(self, kube: Kube, faults: FaultProxy | None) -> None:
        self.kube = kube
        self.faults = faults

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            return await self.kube.call(
                method, path, body, content_type=MERGE_PATCH if method == "PATCH" else ""
            )
        except ApiError as error:
            if error.status == 404:
                return None
            raise AssertionError(str(error)) from None

    @staticmethod
    def path(api: str, plural: str, name: str | None = None, ns: str = NAMESPACE) -> str:
        base = f"/api/{api}" if api == "v1" else f"/apis/{api}"
        return f"{base}/namespaces/{ns}/{plural}" + (f"/{name}" if name else "")

    async def get(self, api: str, plural: str, name: str) -> dict[str, Any] | None:
        result: dict[str, Any] | None = await self.call("GET", self.path(api, plural, name))
        return result

    async def list(self, api: str, plural: str) -> list[dict[str, Any]]:
        result = await self.call("GET", self.path(api, plural))
        return list(result["items"]) if result else []

    async def create(self, api: str, plural: str, obj: dict[str, Any]) -> dict[str, Any]:
        """POST the object; a status in it is then written through the status
        subresource, as the controller or kubelet that owns it would."""
        obj.setdefault("metadata", {}).setdefault("namespace", NAMESPACE)
        status = obj.pop("status", None)
        result: dict[str, Any] = await self.call("POST", self.path(api, plural), obj)
        if status:
            name = result["metadata"]["name"]
            await self.patch(api, plural, name, {"status": status}, "status")
            result = await self.get(api, plural, name) or result
        return result

    async def patch(
        self, api: str, plural: str, name: str, patch: dict[str, Any], sub: str = ""
    ) -> None:
        await self.call("PATCH", self.path(api, plural, name) + (f"/{sub}" if sub else ""), patch)

    async def delete(self, api: str, plural: str, name: str) -> None:
        await self.call("DELETE", self.path(api, plural, name))

    def writes(self) -> list[str]:
        """POST, PATCH, PUT and DELETE requests the operator has sent so far."""
        assert self.faults is not None
        return self.faults.writes()


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 10.0, interval: float = 0.05
) -> Any:
    """Poll `check` until it returns something truthy; fail with its last value."""
    return await poll_until(check, timeout=timeout, interval=interval)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane | None]:
    if REAL_CLUSTER:
        yield None
        return
    plane = ControlPlane(
        tmp_path_factory.mktemp("control-plane"), controllers=TEST_CONTROLLERS, scheduler=False
    )
    plane.start(before_controllers=lambda started: asyncio.run(_install_crds(started)))
    try:
        asyncio.run(_wait_for_default_account(plane))
        yield plane
    finally:
        plane.stop()


async def _install_crds(plane: ControlPlane) -> None:
    kube = await Kube.connect(plane.admin_kubeconfig)
    try:
        await _install_crd(kube, yaml.safe_load(CRD.read_text()))
    finally:
        await kube.close()


async def _wait_for_default_account(plane: ControlPlane) -> None:
    """Pods can be created once the service-account controller has made `default`."""
    kube = await Kube.connect(plane.admin_kubeconfig)
    try:
        await poll_until(lambda: kube.get("ServiceAccount", NAMESPACE, "default"), timeout=60)
    finally:
        await kube.close()


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


async def _install_crd(kube: Kube, crd: dict[str, Any]) -> None:
    await kube.call("POST", CRDS, crd)

    async def established() -> bool:
        obj = await kube.call("GET", f"{CRDS}/{crd['metadata']['name']}")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (obj.get("status") or {}).get("conditions") or []
        )

    await poll_until(established, timeout=30)


async def install_service_monitor_crd(api: Api) -> None:
    """Serve the Prometheus Operator's ServiceMonitor API (until the test ends)."""
    await _install_crd(api.kube, SERVICE_MONITOR_CRD)


# The Prometheus Operator's ServiceMonitor, as far as the operator writes it: the API group
# and kind (its schema left open). Tests add it, or leave it out, as the cluster would.
SERVICE_MONITOR_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com",
        "names": {
            "kind": "ServiceMonitor",
            "listKind": "ServiceMonitorList",
            "plural": "servicemonitors",
            "singular": "servicemonitor",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "x-kubernetes-preserve-unknown-fields": True,
                    }
                },
            }
        ],
    },
}


def _operator_kubeconfig(path: Path, server: str, token: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "test", "cluster": {"server": server}}],
                "users": [{"name": "operator", "user": {"token": token}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": "operator"}}],
                "current-context": "test",
            }
        )
    )
    return path


@pytest.fixture()
async def api(
    control_plane: ControlPlane | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Api]:
    if control_plane is None:  # another cluster (kind)
        kubeconfig = Path(os.environ["VOXFLEET_E2E_KUBECONFIG"])
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        kube = await Kube.connect(kubeconfig)
        try:
            real = Api(kube, None)
            if await real.call("GET", f"/api/v1/namespaces/{NAMESPACE}") is None:
                await real.call(
                    "POST",
                    "/api/v1/namespaces",
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
                )
            yield real
        finally:
            await kube.close()
        return
    plane = control_plane
    pair = plane.client_certificate("voxfleet-e2e-admin", ("system:masters",))
    faults = await FaultProxy(plane.url, plane.ca_cert, pair.cert, pair.key).start()
    monkeypatch.setenv(
        "KUBECONFIG", str(_operator_kubeconfig(tmp_path / "kubeconfig", faults.url, "operator"))
    )
    kube = await Kube.connect(plane.admin_kubeconfig)
    try:
        yield Api(kube, faults)
    finally:
        try:
            await _empty(kube)
        finally:
            await faults.stop()
            await kube.close()


async def _empty(kube: Kube) -> None:
    """Remove what the test left: voices (their finalizers first, no operator runs now),
    every child kind in every namespace, and namespaces tests made."""
    voices = await kube.call("GET", "/apis/voxfleet.io/v1alpha1/ttsvoices")
    for item in voices["items"]:
        meta = item["metadata"]
        path = Api.path("voxfleet.io/v1alpha1", "ttsvoices", meta["name"], meta["namespace"])
        with contextlib.suppress(ApiError):
            await kube.call(
                "PATCH", path, {"metadata": {"finalizers": None}}, content_type=MERGE_PATCH
            )
            await kube.call("DELETE", path)
    for group, plural in CLEANED:
        base = f"/api/{group}" if group == "v1" else f"/apis/{group}"
        try:
            listing = await kube.call("GET", f"{base}/{plural}")
        except ApiError:
            continue
        for item in listing["items"]:
            meta = item["metadata"]
            if meta["namespace"].startswith("kube-") or (plural, meta["name"]) == (
                "services",
                "kubernetes",
            ):
                continue
            with contextlib.suppress(ApiError):
                await kube.call(
                    "DELETE",
                    Api.path(group, plural, meta["name"], meta["namespace"]),
                    {
                        "apiVersion": "v1",
                        "kind": "DeleteOptions",
                        "gracePeriodSeconds": 0,
                        "propagationPolicy": "Background",
                    },
                )
    monitors = f"{CRDS}/{SERVICE_MONITOR_CRD['metadata']['name']}"
    with contextlib.suppress(ApiError):
        await kube.call("DELETE", monitors)
    namespaces = await kube.call("GET", "/api/v1/namespaces")
    for item in namespaces["items"]:
        name = item["metadata"]["name"]
        if name not in ("default", "kube-system", "kube-public", "kube-node-lease"):
            with contextlib.suppress(ApiError):
                await kube.call("DELETE", f"/api/v1/namespaces/{name}")

    async def emptied() -> bool:
        left = await kube.call("GET", "/apis/voxfleet.io/v1alpha1/ttsvoices")
        claims = await kube.call("GET", "/api/v1/persistentvolumeclaims")
        try:
            await kube.call("GET", monitors)
        except ApiError as error:
            gone = error.status == 404
        else:
            gone = False
        return not left["items"] and not claims["items"] and gone

    await poll_until(emptied, timeout=30)


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
    of its loop, which must not include the tests' own. Cluster-wide, as the chart's default
    installation runs it.
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
    monkeypatch.delenv("VOXFLEET_POOLS_FILE", raising=False)  # restored after the test
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
