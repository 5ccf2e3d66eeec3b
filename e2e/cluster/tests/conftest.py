"""Fixtures: an API emulator (KMock with the harness's scripted API-server behaviours) and a
LocalCluster running against it, plus a small client for the tests' own API calls."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

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

