"""Fixtures: an API emulator (KMock with the harness's scripted API-server behaviours) and a
LocalCluster running against it, plus a small client for the tests' own API calls."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import kmock
import pytest
from cluster import LocalCluster
from cluster.api import KubeApi

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "integration" / "operator"))
from operator_harness import RESOURCES, ScriptedKubernetes  # noqa: E402

CLUSTER_RESOURCES: dict[str, kmock.ResourceInfo] = {
    **RESOURCES,
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment",
        namespaced=True,
        subresources={"status", "scale"},
        verbs={"get", "list", "watch", "create", "update", "patch", "delete"},
    ),
    "v1/configmaps": kmock.ResourceInfo(kind="ConfigMap", namespaced=True),
}


@pytest.fixture()
async def api() -> AsyncIterator[tuple[KubeApi, str]]:
    async with ScriptedKubernetes() as emulator, kmock.Server(emulator) as server:
        for name, info in CLUSTER_RESOURCES.items():
            emulator.resources[name] = info
        async with aiohttp.ClientSession() as session:
            yield KubeApi(session, str(server.url)), str(server.url)


@pytest.fixture()
async def cluster(api: tuple[KubeApi, str], tmp_path: Path) -> AsyncIterator[LocalCluster]:
    async with LocalCluster(api[1], tmp_path / "cluster", tick_s=0.1) as running:
        yield running


@pytest.fixture()
def kube(api: tuple[KubeApi, str]) -> KubeApi:
    return api[0]


async def eventually(
    check: Callable[[], Awaitable[Any]], timeout: float = 20.0, interval: float = 0.1
) -> Any:
    """Poll `check` until it returns something truthy; fail with its last value."""
    deadline = asyncio.get_running_loop().time() + timeout
    last: Any = None
    while True:
        try:
            last = await check()
        except AssertionError as error:
            last = error
        if last and not isinstance(last, AssertionError):
            return last
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout} s; last: {last!r}")
        await asyncio.sleep(interval)
