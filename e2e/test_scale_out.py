"""A pool that scales out relieves its load (issue 44), on the local cluster:

1. one client (`engines.client.tts.TtsClient`: a connection per pod, a pod per stream) keeps
   streaming while a scale-out adds a pod to the voice: its new streams land on both pods;
2. a pod at capacity refuses a new stream at once with RESOURCE_EXHAUSTED, and the client's
   retry is spoken by the other pod;
3. a pool pod leaves while streams are in flight on it: none is cut.

The scenarios use a voice of their own (`spread`, the joe voice under another name), so the
other scenarios' voices are not touched. The client finds the voice's pods as it would in a
cluster, through its headless Service (`status.podsEndpoint`): the test process runs on the
host, outside cluster DNS, so the Service's EndpointSlices (what CoreDNS answers a lookup of
that name with; test_node.py checks that a pod's lookup does) answer it, again every
RESOLVE_TTL_S as DNS would. Local only: on kind the test process cannot reach pods but
through one port-forward each.
"""

from __future__ import annotations

import statistics
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from e2e_support import NAMESPACE, REAL_CLUSTER, eventually
from installation import Installation
from speech import LONG_TEXT
from voices import POOL_DEPLOYMENT, POOL_PODS, pool_pods, ready_voice, voice

from engines.client.balancing import ResolvedEndpoints
from engines.client.tts import RESOLVE_TTL_S, SynthesisError, TtsClient

pytestmark = pytest.mark.skipif(
    REAL_CLUSTER, reason="reaches pods by their addresses: the local cluster only"
)

VOICE = "spread"
SHORT = "Streams spread over every pod."
GRPC_PORT = 8001


def pods_of(installation: Installation) -> Callable[[], list[str]]:
    """The ready pods serving VOICE, as its headless Service lists them (a DNS lookup's
    answer), looked up again every RESOLVE_TTL_S."""
    service = f"{VOICE}-tts-pods"

    def lookup(_: str) -> list[str]:
        return list(installation.cluster.endpoints(NAMESPACE, service, GRPC_PORT))

    return ResolvedEndpoints(f"{service}.{NAMESPACE}.svc:{GRPC_PORT}", RESOLVE_TTL_S, lookup)


def listed(installation: Installation) -> list[str]:
    return list(installation.cluster.endpoints(NAMESPACE, f"{VOICE}-tts-pods", GRPC_PORT))


def refused_total(address: str) -> float:
    """The pod's `voxfleet_refused_streams_total` for VOICE, from its Triton metrics port."""
    host = address.rsplit(":", 1)[0]
    with urllib.request.urlopen(f"http://{host}:8002/metrics", timeout=5) as reply:
        text = reply.read().decode()
    prefix = f'voxfleet_refused_streams_total{{model="{VOICE}"}} '
    return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def spread(installation: Installation) -> Iterator[dict[str, Any]]:
    """VOICE on one pod of the pool (`spec.replicas: 1`)."""
    installation.kubectl.apply(voice(VOICE, replicas=1))
    obj = ready_voice(installation, VOICE, timeout=300)
    eventually(lambda: len(listed(installation)) == 1, timeout=60, what="one pod is listed")
    yield obj
    installation.kubectl.run("delete", "ttsv", VOICE, "--wait=true", timeout=120)


class Listeners:
    """`count` threads streaming `text` through one client, back to back, until stopped."""

    def __init__(self, client: TtsClient, count: int, text: str) -> None:
        self.client, self.text = client, text
        self.results: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(count)
        self._futures = [self._pool.submit(self._listen) for _ in range(count)]

    def _listen(self) -> None:
        while not self._stop.is_set():
            record: dict[str, Any] = {"started": time.monotonic()}
            try:
                record["audio_seconds"] = self.client.synthesize(self.text, VOICE).audio_seconds
            except SynthesisError as error:
                record["error"] = f"{error.code}: {error}"
            record["ended"] = time.monotonic()
            self.results.append(record)

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        for future in self._futures:
            future.result(timeout=180)
        self._pool.shutdown()
        return self.results


def test_one_client_spreads_new_streams_over_a_pod_added_by_a_scale_out(
    installation: Installation, spread: dict[str, Any]
) -> None:
    assert spread["status"]["podsEndpoint"] == f"{VOICE}-tts-pods.{NAMESPACE}.svc:{GRPC_PORT}"
    with TtsClient(spread["status"]["podsEndpoint"], pods=pods_of(installation)) as client:
        listeners = Listeners(client, 3, SHORT)
        try:
            eventually(lambda: len(listeners.results) >= 3, timeout=60, what="streams on one pod")
            (first,) = listed(installation)
            # The voice on two pods: a second pool pod if the pool had one (the pool HPA's
            # floor follows the voice's replicas), or the second of the pool's pods.
            installation.kubectl.run("scale", "ttsv", VOICE, "--replicas=2")
            both = eventually(
                lambda: listed(installation) if len(listed(installation)) == 2 else None,
                timeout=240,
                what=f"two pods serve {VOICE}",
            )
            (second,) = set(both) - {first}
            seen = time.monotonic()
            first_on_new = eventually(
                lambda: client.balancer.counts().get(second, None),
                timeout=30,
                what="a stream of the one client on the new pod",
            )
            assert first_on_new.streams >= 1
            lag = time.monotonic() - seen
            before = {e: c.streams for e, c in client.balancer.counts().items()}
            time.sleep(10)
            after = {e: c.streams for e, c in client.balancer.counts().items()}
        finally:
            results = listeners.stop()
    # While the one pod is full (three listeners can be more than it holds on a busy machine)
    # it refuses a stream before its first audio, which is asked again: no failure.
    refused = [r for r in results if r.get("error", "").startswith("RESOURCE_EXHAUSTED")]
    assert not [r for r in results if "error" in r and r not in refused], results
    installation.timings["scale_out_refused_streams"] = float(len(refused))
    new_streams = {e: after.get(e, 0) - before.get(e, 0) for e in (first, second)}
    # One client, new streams on both pods, neither left out.
    assert min(new_streams.values()) >= 0.3 * sum(new_streams.values()) > 0, new_streams
    # Within one HPA sync period (Kubernetes' default, 15 s) of the pod being listed.
    assert lag <= 15, f"the client took {lag:.1f} s to send a stream to the new pod"
    installation.timings["scale_out_first_stream_on_new_pod_s"] = lag


def test_a_full_pod_refuses_at_once_and_the_retry_is_spoken_by_the_other(
    installation: Installation, spread: dict[str, Any]
) -> None:
    pods = eventually(
        lambda: listed(installation) if len(listed(installation)) == 2 else None,
        timeout=240,
        what=f"two pods serve {VOICE}",
    )
    full, other = sorted(pods)
    refused_before = refused_total(full)
    # Listeners that only reach `full` fill it past what it holds: the rest are refused, and
    # they ask again at once, keeping it full.
    with TtsClient(full, pods=lambda: [full]) as filling:
        fillers = Listeners(filling, 16, LONG_TEXT)
        try:
            eventually(
                lambda: refused_total(full) > refused_before,
                timeout=60,
                what=f"{full} refuses streams (it holds its capacity)",
            )
            with TtsClient(full, pods=lambda: [full]) as direct:
                started = time.monotonic()
                with pytest.raises(SynthesisError) as refused:
                    direct.synthesize(SHORT, VOICE)
                took = time.monotonic() - started
            with TtsClient("x:1", pods=lambda: [full, other]) as balanced:
                spoken = [balanced.synthesize(SHORT, VOICE) for _ in range(6)]
                counts = balanced.balancer.counts()
                refused_streams = balanced.balancer.refused_streams
        finally:
            fillers.stop()
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert "this server is full" in str(refused.value)
    # At once: far sooner than a stream's first audio (the 50 ms goal is a benchmark's,
    # lab/refusals.py, not a timed test's).
    assert took < 1.0, f"the refusal took {took:.3f} s"
    assert all(result.audio_seconds > 0.5 for result in spoken)
    assert counts[full].refusals >= 1, counts  # round-robin asked the full pod too ...
    assert counts[other].streams >= counts[full].refusals  # ... and the other spoke
    assert refused_streams == 0
    installation.timings["full_pod_refusal_ms"] = took * 1000


def test_a_pod_leaving_with_streams_in_flight_cuts_none(
    installation: Installation, spread: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    # On every pod of the pool, so that the pool's floor no longer keeps two pods.
    kubectl.run(
        "patch", "ttsv", VOICE, "--type=json", "-p", '[{"op": "remove", "path": "/spec/replicas"}]'
    )
    eventually(lambda: len(listed(installation)) == 2, timeout=120, what=f"two pods serve {VOICE}")
    hpa = POOL_DEPLOYMENT
    eventually(
        lambda: (kubectl.get("hpa", hpa) or {}).get("spec", {}).get("minReplicas") == 1,
        timeout=60,
        what="the pool HPA's floor is back at one pod",
    )
    with TtsClient(spread["status"]["podsEndpoint"], pods=pods_of(installation)) as client:
        listeners = Listeners(client, 4, LONG_TEXT)
        try:
            eventually(lambda: len(listeners.results) >= 2, timeout=120, what="streams done")
            before = {p["metadata"]["name"] for p in pool_pods(installation)}

            def each_pod_streaming() -> dict[str, Any] | None:
                counts = client.balancer.counts()
                streaming = [c for c in counts.values() if c.in_flight >= 1]
                return counts if len(streaming) >= len(before) else None

            # The scale-in starts while every pod has a stream in flight, so that the one that
            # leaves has one whichever it is (read at the start: it drains from then on).
            counts = eventually(each_pod_streaming, timeout=60, what="a stream on every pod")
            # What the pool HPA writes when it scales in (it has no metrics in this suite).
            kubectl.run("scale", "deployment", POOL_DEPLOYMENT, "--replicas=1")
            leaving = eventually(
                lambda: next(
                    (
                        p
                        for p in kubectl.items("pods", POOL_PODS)
                        if p["metadata"].get("deletionTimestamp")
                        and p["metadata"]["name"] in before
                    ),
                    None,
                ),
                timeout=60,
                what="a pool pod is leaving",
            )
            address = f"{leaving['status']['podIP']}:{GRPC_PORT}"
            in_flight = counts.get(address)
            left_at = time.monotonic()
            eventually(
                lambda: (
                    leaving["metadata"]["name"]
                    not in {p["metadata"]["name"] for p in kubectl.items("pods", POOL_PODS)}
                ),
                timeout=120,
                what="the pod is gone",
            )
            gone_s = time.monotonic() - left_at
            eventually(
                lambda: (
                    len(
                        [
                            r
                            for r in listeners.results
                            if r["started"] > left_at + gone_s and "audio_seconds" in r
                        ]
                    )
                    >= 2
                ),
                timeout=120,
                what="streams spoken after the pod left",
            )
        finally:
            results = listeners.stop()
    # A stream the one pod left refuses before its first audio, because it is full (four
    # listeners may be more than it holds on a busy machine), is asked again; it is no cut.
    refused = [r for r in results if r.get("error", "").startswith("RESOURCE_EXHAUSTED")]
    errors = [r["error"] for r in results if "error" in r and r not in refused]
    assert not errors, f"{len(errors)} of {len(results)} streams failed: {errors[:3]}"
    installation.timings["scale_in_refused_streams"] = float(len(refused))
    lengths = [r["audio_seconds"] for r in results if "audio_seconds" in r]
    short = [s for s in lengths if s < 0.9 * statistics.median(lengths)]
    assert not short, f"streams cut short: {short} (median {statistics.median(lengths):.2f} s)"
    assert in_flight is not None and in_flight.in_flight >= 1, (
        f"no stream was in flight on the leaving pod: nothing tested ({in_flight})"
    )
    installation.timings["scale_in_pod_gone_s"] = gone_s
