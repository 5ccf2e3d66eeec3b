"""The autoscaling loop on one real pool pod: Triton (`voxfleet serve`) -> the real Prometheus,
scraping what the rendered ServiceMonitor selects -> the chart's adapter rules -> the HPA
algorithm on the operator-rendered HPA."""

from __future__ import annotations

import json
import math
import re
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest
from voxfleet_operator.plan import Voice, plan_pool
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.pool import (
    FIRST_AUDIO_METRIC,
    QUEUE_METRIC,
    build_pool_hpa,
    build_pool_metrics_service,
    build_pool_service_monitor,
)
from voxfleet_operator.spec import TTSVoiceSpec

from autoscale.adapter import ROOT, PrometheusAdapter, rules_from_chart
from autoscale.cluster_objects import pool_pod
from autoscale.hpa import HorizontalPodAutoscaler, MetricUnavailable, Scale, pod_state
from autoscale.prometheus import PrometheusServer, service_monitor_targets
from autoscale.test_adapter import helm
from engines.client import synthesize
from engines.serving import local_server, plan_local_voices
from engines.triton_server import TritonServer

pytestmark = pytest.mark.triton

NAMESPACE = "speech"
POOL = Pool(name="cpu", max_pods=4)
SCRAPE_INTERVAL = "1s"
TEXTS = [
    "Streaming speech starts before the sentence is over.",
    "Every pod reports how long listeners waited for the first sound.",
    "The autoscaler reads a percentile, not a mean.",
    "One more sentence keeps the vocoder busy for a moment.",
]
T = TypeVar("T")
# Grafana's variables, as Grafana fills them in for "All" and a 1-minute rate interval.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$voice": ".*"}


@pytest.fixture(scope="module")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    plan = plan_local_voices(["joe"], tmp_path_factory.mktemp("engine-cache"))
    server = local_server(plan, work_dir=tmp_path_factory.mktemp("triton"))
    with server.start():
        yield server


@pytest.fixture(scope="module")
def pods(triton: TritonServer) -> list[dict[str, Any]]:
    return [
        pool_pod(
            "triton-a",
            NAMESPACE,
            POOL.name,
            triton.metrics_port,
            http_port=triton.http_port,
            grpc_port=triton.grpc_port,
        ),
        # Not ready: the ServiceMonitor's endpoints leave it out, the HPA sets it aside.
        pool_pod("triton-b", NAMESPACE, POOL.name, 9, ready=False),
    ]


@pytest.fixture(scope="module")
def prometheus(
    pods: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PrometheusServer]:
    monitor = build_pool_service_monitor(POOL, NAMESPACE)
    services = [build_pool_metrics_service(POOL, NAMESPACE)]
    server = PrometheusServer(SCRAPE_INTERVAL, work_dir=tmp_path_factory.mktemp("prometheus"))
    server.set_targets(service_monitor_targets(monitor, services, pods))
    with server:
        yield server


@pytest.fixture(scope="module")
def first_audio_seconds(triton: TritonServer, prometheus: PrometheusServer) -> list[float]:
    """First audio of 8 streams, 2 at a time, as the client measured it."""

    def one(text: str) -> float:
        result = synthesize(triton.grpc_url, text, voice="joe")
        assert result.first_audio_s is not None
        return result.first_audio_s

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(one, TEXTS * 2))


def adapter_for(
    prometheus: PrometheusServer, pods: Sequence[Mapping[str, Any]]
) -> PrometheusAdapter:
    def list_pods(namespace: str, selector: Mapping[str, str] | None) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in pods
            if p["metadata"]["namespace"] == namespace
            and all(p["metadata"]["labels"].get(k) == v for k, v in (selector or {}).items())
        ]

    return PrometheusAdapter(prometheus.url, rules_from_chart(helm()), list_pods)


def eventually(read: Callable[[], T], timeout_s: float = 30.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return read()
        except (MetricUnavailable, AssertionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def triton_counters(triton: TritonServer) -> dict[str, float]:
    with urllib.request.urlopen(triton.metrics_url, timeout=5) as response:
        text = response.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(voxfleet_[a-z_]+)\{([^}]*)\} ([0-9.eE+-]+)$", line)
        if match and 'model="joe"' in match.group(2):
            key = match.group(1)
            le = re.search(r'le="([^"]+)"', match.group(2))
            values[f"{key}[{le.group(1)}]" if le else key] = float(match.group(3))
    return values


def test_prometheus_scrapes_only_the_ready_pod(prometheus: PrometheusServer) -> None:
    def scraped() -> list[dict[str, Any]]:
        targets = prometheus.active_targets()
        assert [t["health"] for t in targets] == ["up"]
        return targets

    (target,) = eventually(scraped)
    assert target["labels"]["pod"] == "triton-a"
    assert target["labels"]["namespace"] == NAMESPACE
    assert target["labels"]["job"] == "voxfleet-triton-cpu-metrics"


def test_queue_rule_reads_the_pods_mean_wait(
    triton: TritonServer,
    prometheus: PrometheusServer,
    pods: list[dict[str, Any]],
    first_audio_seconds: list[float],
) -> None:
    adapter = adapter_for(prometheus, pods)
    counters = triton_counters(triton)
    # All traffic lies inside the rate window, so the ratio of rates is the ratio of totals.
    mean = counters["voxfleet_queue_seconds_sum"] / counters["voxfleet_queue_seconds_count"]

    def read() -> float:
        samples = adapter.pod_metric(NAMESPACE, QUEUE_METRIC, None)
        assert set(samples) == {"triton-a"}
        value = samples["triton-a"].value
        # Stamped with Prometheus's evaluation time: the HPA sets aside older samples of a
        # pod that became ready recently.
        assert abs(samples["triton-a"].timestamp - time.time()) < 30
        assert value == pytest.approx(mean, abs=0.002)
        return value

    eventually(read)


def test_p95_rule_and_hpa_recommendation(
    triton: TritonServer,
    prometheus: PrometheusServer,
    pods: list[dict[str, Any]],
    first_audio_seconds: list[float],
) -> None:
    adapter = adapter_for(prometheus, pods)
    p95 = eventually(lambda: adapter.pod_metric(NAMESPACE, FIRST_AUDIO_METRIC, None))[
        "triton-a"
    ].value
    # The histogram's p95 lies in the bucket range the client's own measurements span.
    bounds = sorted(
        float(k.split("[")[1].rstrip("]"))
        for k in triton_counters(triton)
        if k.startswith("voxfleet_first_audio_seconds_bucket[") and "+Inf" not in k
    )
    below = max([b for b in bounds if b <= min(first_audio_seconds) / 2] or [0.0])
    above = min([b for b in bounds if b >= max(first_audio_seconds)] or [math.inf])
    assert below <= p95 <= above, (p95, first_audio_seconds)

    # The voice's HPA target (10 ms) is far below a CPU's first audio: scale up.
    spec = TTSVoiceSpec.model_validate(
        {
            "source": {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32},
            "autoscaling": {"maxReplicas": 4, "targetFirstAudioP95Ms": 10, "targetQueueMs": 1000},
        }
    )
    hpa = build_pool_hpa(plan_pool(POOL, NAMESPACE, [Voice("joe", NAMESPACE, spec)]))
    controller = HorizontalPodAutoscaler(hpa)
    now = time.time()
    decision = controller.sync(Scale(1, 1), [pod_state(p) for p in pods], adapter, now)
    proposals = {p.metric: p for p in decision.proposals}
    p95_proposal = proposals[FIRST_AUDIO_METRIC]
    usage = p95_proposal.usage_milli
    # Read again by the HPA a moment later: the window has slid a little.
    assert usage is not None and usage == pytest.approx(p95 * 1000, rel=0.1)
    # triton-b is not ready and has no sample: on a scale-up the HPA takes it at 0, so the
    # two pods' integer mean in milli-units (as the controller's ratio is) over the 10 ms
    # target, times two pods. (Setting it aside would give ceil(usage / 10): 8, not 7, at
    # 71 ms.)
    assert p95_proposal.replicas == math.ceil((usage // 2) / 10 * 2)
    # The rendered scale-up window (15 s) holds the count the controller started with ...
    assert (decision.desired_replicas, decision.reason) == (1, "DesiredWithinRange")
    # ... and after it, the rendered policy allows 2 more pods per minute (maxReplicas 4).
    later = controller.sync(Scale(1, 1), [pod_state(p) for p in pods], adapter, now + 16)
    assert later.desired_replicas == min(3, p95_proposal.replicas)
    assert adapter.queries and all("<<" not in q for q in adapter.queries)


def test_targets_follow_pods_without_a_restart(
    prometheus: PrometheusServer, pods: list[dict[str, Any]], tmp_path: Path
) -> None:
    prometheus.set_targets([])

    def gone() -> None:
        assert prometheus.active_targets() == []

    eventually(gone, timeout_s=20)
    monitor = build_pool_service_monitor(POOL, NAMESPACE)
    prometheus.set_targets(
        service_monitor_targets(monitor, [build_pool_metrics_service(POOL, NAMESPACE)], pods)
    )
    prometheus.reload("2s")

    def back() -> None:
        targets = prometheus.active_targets()
        assert [t["labels"]["pod"] for t in targets] == ["triton-a"]
        assert targets[0]["scrapeInterval"] == "2s"

    eventually(back, timeout_s=20)


def test_dashboard_queries_run_on_the_scraped_metrics(
    prometheus: PrometheusServer, pods: list[dict[str, Any]], first_audio_seconds: list[float]
) -> None:
    dashboard = json.loads(
        (ROOT / "charts" / "voxfleet" / "dashboards" / "voxfleet.json").read_text()
    )
    client = adapter_for(prometheus, pods).prometheus

    def run_all() -> dict[str, list[dict[str, Any]]]:
        results: dict[str, list[dict[str, Any]]] = {}
        for panel in dashboard["panels"]:
            for target in panel["targets"]:
                query = target["expr"]
                for variable, value in GRAFANA_VARIABLES.items():
                    query = query.replace(variable, value)
                # Prometheus refuses a bad query (the client raises); an empty result is fine.
                results.setdefault(panel["title"], []).extend(client.custom_query(query))
        # Panels fed by the stream model show the voice (once a scrape has happened since the
        # targets came back); replicas need kube-state-metrics.
        for title in ("Live streams", "First audio p50 / p95", "Pods per voice", "Queue time"):
            assert results[title], f"{title}: no data"
        return results

    results = eventually(run_all, timeout_s=30)
    assert {r["metric"].get("model") for r in results["Pods per voice"]} == {"joe"}
