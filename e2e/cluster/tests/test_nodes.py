"""The agent's nodes as the control plane sees them: registered with what they advertise,
kept alive by their Leases, and a forced deletion of a running pod stops its processes."""

from __future__ import annotations

import os

from cluster import LocalCluster
from cluster.kube import Kube
from cluster.nodeagent import LEASE_RENEW_S
from cluster.objects import parse_time
from cluster.waiting import eventually
from workloads import ready_pods, web_deployment


async def test_nodes_are_registered_ready_and_renew_their_leases(
    kube: Kube, cluster: LocalCluster
) -> None:
    for spec in cluster.node_specs:
        node = await kube.get("Node", None, spec.name)
        assert node is not None
        assert node["status"]["allocatable"]["cpu"] == spec.cpu
        assert node["metadata"]["labels"]["kubernetes.io/hostname"] == spec.name
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True"
        # The node lifecycle controller lifted the taint every new node gets.
        assert not [
            t
            for t in node["spec"].get("taints") or []
            if t["key"] == "node.kubernetes.io/not-ready"
        ]
    name = cluster.node_specs[0].name
    lease = await kube.get("Lease", "kube-node-lease", name)
    assert lease is not None and lease["spec"]["holderIdentity"] == name
    first = lease

    async def renewed() -> bool:
        lease = await kube.get("Lease", "kube-node-lease", name)
        return lease is not None and parse_time(lease["spec"]["renewTime"][:19] + "Z") > parse_time(
            first["spec"]["renewTime"][:19] + "Z"
        )

    await eventually(renewed, timeout=LEASE_RENEW_S * 2 + 5)


async def test_a_forced_deletion_stops_the_pods_processes(
    kube: Kube, ns: str, cluster: LocalCluster
) -> None:
    await kube.create("Deployment", ns, web_deployment("web", replicas=1))
    (pod,) = await eventually(lambda: ready_pods(kube, ns, "web", 1), timeout=60)
    name = pod["metadata"]["name"]
    pid = cluster.container_pid(ns, name, "web")
    assert pid is not None
    # `kubectl delete --force --grace-period=0`: the object goes at once, without the node.
    await kube.delete("Pod", ns, name, {"gracePeriodSeconds": 0})
    assert await kube.get("Pod", ns, name) is None

    async def stopped() -> bool:
        return not os.path.exists(f"/proc/{pid}")

    await eventually(stopped, timeout=30)
    # The ReplicaSet replaces it, and the replacement runs.
    await eventually(lambda: ready_pods(kube, ns, "web", 1), timeout=60)
