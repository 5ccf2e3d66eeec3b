"""Scrape targets from the operator-rendered ServiceMonitor and metrics Service (no server)."""

from __future__ import annotations

from voxfleet_operator.pools import Pool
from voxfleet_operator.render.pool import build_pool_metrics_service, build_pool_service_monitor

from hpa.cluster_objects import pool_pod
from hpa.prometheus import scrape_interval, service_monitor_targets

POOL = Pool(name="cpu")


def test_targets_are_the_ready_pool_pods_on_their_metrics_port() -> None:
    monitor = build_pool_service_monitor(POOL, "speech")
    services = [
        build_pool_metrics_service(POOL, "speech"),
        build_pool_metrics_service(POOL, "elsewhere"),
    ]
    pods = [
        pool_pod("triton-a", "speech", "cpu", 18002, ip="127.0.0.11"),
        pool_pod("triton-b", "speech", "cpu", 18002, ip="127.0.0.12"),
        pool_pod("triton-starting", "speech", "cpu", 18002, ip="127.0.0.13", ready=False),
        pool_pod("other-pool", "speech", "gpu", 18002, ip="127.0.0.14"),
        pool_pod("triton-a", "elsewhere", "cpu", 18002, ip="127.0.0.15"),
    ]
    targets = service_monitor_targets(monitor, services, pods)
    assert [t.address for t in targets] == ["127.0.0.11:18002", "127.0.0.12:18002"]
    assert dict(targets[0].labels) == {
        "namespace": "speech",
        "pod": "triton-a",
        "service": "voxfleet-triton-cpu-metrics",
        "endpoint": "metrics",
        "container": "triton",
        "job": "voxfleet-triton-cpu-metrics",
    }


def test_a_terminating_pod_is_no_target_any_more() -> None:
    monitor = build_pool_service_monitor(POOL, "speech")
    pod = pool_pod("triton-a", "speech", "cpu", 18002)
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    assert (
        service_monitor_targets(monitor, [build_pool_metrics_service(POOL, "speech")], [pod]) == []
    )


def test_interval_comes_from_the_service_monitor_unless_set() -> None:
    monitor = build_pool_service_monitor(POOL, "speech")
    assert scrape_interval(monitor) == "15s"
    assert scrape_interval(monitor, "2s") == "2s"
