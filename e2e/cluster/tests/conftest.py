"""Fixtures: one local cluster (the real control plane and the node agent's nodes) for the
node agent's tests, stopped when they are done, a namespace of its own per test, and the API
as its administrator."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from cluster import LocalCluster
from cluster.kube import Kube

_namespaces = itertools.count()


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(Path(tmp_path_factory.mktemp("node-agent"))) as running:
        yield running


@pytest.fixture()
async def kube(cluster: LocalCluster) -> AsyncIterator[Kube]:
    client = await Kube.connect(cluster.kubeconfig)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture()
async def ns(kube: Kube, cluster: LocalCluster) -> AsyncIterator[str]:
    """A namespace for one test, with its `default` ServiceAccount; deleted afterwards (the
    namespace controller deletes its pods, which the node agent stops)."""
    from cluster.waiting import eventually

    name = f"agent-{next(_namespaces)}"
    await kube.call(
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
    )

    async def account() -> bool:
        return await kube.get("ServiceAccount", name, "default") is not None

    await eventually(account, timeout=30)
    yield name
    cluster.check()
    await kube.call("DELETE", f"/api/v1/namespaces/{name}")
