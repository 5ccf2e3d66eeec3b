"""Per-stream pod choice (engines/client/balancing.py): fewest streams in flight, refusals retried
on another pod within a budget, never after audio has started."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from engines.client.balancing import (
    Balancer,
    NoEndpoints,
    ResolvedEndpoints,
    StreamRefused,
    stream_balanced,
    stream_balanced_sync,
)

PODS = ["10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.3:8001"]


class Refused(Exception):
    def __init__(self, code: str) -> None:
        super().__init__(f"[{code}] no")
        self.code = code


def code_of(error: BaseException) -> str | None:
    return getattr(error, "code", None)


def test_new_streams_go_to_the_pod_with_the_fewest_in_flight() -> None:
    balancer = Balancer()
    balancer.started(PODS[0])
    balancer.started(PODS[0])
    balancer.started(PODS[1])
    assert balancer.choose(PODS) == PODS[2]
    balancer.started(PODS[2])
    assert balancer.choose(PODS) in (PODS[1], PODS[2])
    balancer.ended(PODS[0])
    balancer.ended(PODS[0])
    assert balancer.choose(PODS) == PODS[0]


def test_one_stream_at_a_time_still_visits_every_pod() -> None:
    balancer = Balancer()
    chosen = []
    for _ in range(6):
        endpoint = balancer.choose(PODS)
        assert endpoint is not None
        balancer.started(endpoint)
        balancer.ended(endpoint)
        chosen.append(endpoint)
    assert sorted(set(chosen)) == PODS
    assert all(chosen.count(pod) == 2 for pod in PODS)


def test_clients_started_together_do_not_all_pick_the_same_pod() -> None:
    """Fifty fresh clients, one stream each, two pods: a round that started at the same pod
    in every process would send all fifty there."""
    first = [Balancer().choose(PODS[:2]) for _ in range(50)]
    assert 10 <= first.count(PODS[0]) <= 40


def test_a_pod_added_by_a_scale_out_takes_the_next_streams() -> None:
    balancer = Balancer()
    for _ in range(4):
        balancer.started(PODS[0])
    new = [balancer.choose(PODS[:2]) for _ in range(3)]
    assert new == [PODS[1]] * 3


def test_a_refused_stream_is_retried_on_another_pod_and_refusals_are_counted() -> None:
    balancer = Balancer()
    balancer.started(PODS[1])  # pod 0 is chosen first: it has the fewest streams
    balancer.started(PODS[2])
    balancer.started(PODS[2])
    opened = []

    async def open_stream(endpoint: str) -> AsyncIterator[str]:
        opened.append(endpoint)
        if endpoint == PODS[0]:
            raise Refused("RESOURCE_EXHAUSTED")
        yield f"audio from {endpoint}"

    async def collect() -> list[str]:
        return [c async for c in stream_balanced(balancer, "joe", PODS, open_stream, code_of)]

    assert asyncio.run(collect()) == [f"audio from {PODS[1]}"]
    assert opened == [PODS[0], PODS[1]]
    counts = balancer.counts()
    assert counts[PODS[0]].refusals == 1 and balancer.refusals == 1
    assert counts[PODS[0]].in_flight == 0
    assert counts[PODS[1]].in_flight == 1  # the one started above; ours ended


def test_the_budget_bounds_the_attempts_and_the_last_refusal_is_reported() -> None:
    balancer = Balancer(max_attempts=2)
    opened = []

    def open_stream(endpoint: str) -> Iterator[str]:
        opened.append(endpoint)
        raise Refused("RESOURCE_EXHAUSTED")
        yield "never"

    with pytest.raises(StreamRefused) as refused:
        list(stream_balanced_sync(balancer, "joe", PODS, open_stream, code_of))
    assert len(opened) == 2 and len(set(opened)) == 2
    assert refused.value.code == "RESOURCE_EXHAUSTED"
    assert len(refused.value.refusals) == 2
    assert balancer.refusals == 2
    assert all(c.in_flight == 0 for c in balancer.counts().values())


def test_an_error_after_the_first_chunk_is_never_retried() -> None:
    balancer = Balancer()
    opened = []

    def open_stream(endpoint: str) -> Iterator[str]:
        opened.append(endpoint)
        yield "first chunk"
        raise Refused("UNAVAILABLE")

    received = []
    with pytest.raises(Refused):
        for chunk in stream_balanced_sync(balancer, "joe", PODS, open_stream, code_of):
            received.append(chunk)
    assert received == ["first chunk"] and len(opened) == 1
    assert balancer.refusals == 0
    assert balancer.counts()[opened[0]].failures == 1


def test_other_errors_are_not_retried() -> None:
    balancer = Balancer()
    opened = []

    def open_stream(endpoint: str) -> Iterator[str]:
        opened.append(endpoint)
        raise Refused("INVALID_ARGUMENT")
        yield "never"

    with pytest.raises(Refused):
        list(stream_balanced_sync(balancer, "joe", PODS, open_stream, code_of))
    assert len(opened) == 1


def test_no_endpoint_is_its_own_error() -> None:
    balancer = Balancer()

    def open_stream(endpoint: str) -> Iterator[str]:
        yield endpoint

    with pytest.raises(NoEndpoints, match="joe"):
        list(stream_balanced_sync(balancer, "joe", [], open_stream, code_of))


def test_endpoints_are_read_again_before_each_attempt() -> None:
    balancer = Balancer()
    ready = [[PODS[0]], [PODS[0], PODS[1]]]

    def open_stream(endpoint: str) -> Iterator[str]:
        if endpoint == PODS[0]:
            raise Refused("UNAVAILABLE")
        yield endpoint

    assert list(
        stream_balanced_sync(balancer, "joe", lambda: ready.pop(0), open_stream, code_of)
    ) == [PODS[1]]


def test_forget_drops_idle_pods_that_are_gone() -> None:
    balancer = Balancer()
    balancer.started(PODS[0])
    balancer.started(PODS[1])
    balancer.ended(PODS[1])
    balancer.forget(keep={PODS[2]})
    assert set(balancer.counts()) == {PODS[0]}  # still has a stream in flight


def test_streams_no_pod_took_are_counted_apart_from_refusals_a_retry_absorbed() -> None:
    balancer = Balancer(max_attempts=3)

    tried: list[str] = []

    def refuse_first(endpoint: str) -> Iterator[str]:
        tried.append(endpoint)
        if len(tried) == 1:  # the first pod asked is full
            raise Refused("RESOURCE_EXHAUSTED")
        yield endpoint

    def refuse_all(endpoint: str) -> Iterator[str]:
        raise Refused("RESOURCE_EXHAUSTED")
        yield "never"

    assert list(stream_balanced_sync(balancer, "joe", PODS[:2], refuse_first, code_of))
    assert balancer.refusals == 1 and balancer.refused_streams == 0
    with pytest.raises(StreamRefused):
        list(stream_balanced_sync(balancer, "joe", PODS[:2], refuse_all, code_of))
    assert balancer.refusals == 3 and balancer.refused_streams == 1
    with pytest.raises(NoEndpoints):
        list(stream_balanced_sync(balancer, "joe", [], refuse_all, code_of))
    assert balancer.refused_streams == 1 and balancer.unserved_streams == 1


def test_resolved_endpoints_answer_at_once_and_look_up_again_once_stale() -> None:
    answers = [[PODS[0]], [PODS[0], PODS[1]]]
    lookups: list[str] = []
    looked_up = threading.Event()

    def resolve(address: str) -> list[str]:
        lookups.append(address)
        if len(lookups) > 1:
            looked_up.set()
        return answers[min(len(lookups), len(answers)) - 1]

    endpoints = ResolvedEndpoints("joe-tts-pods.tts.svc:8001", ttl_s=0.05, resolve=resolve)
    assert endpoints() == [PODS[0]]  # the first call waits for its lookup
    assert endpoints() == [PODS[0]]  # fresh: no lookup
    assert len(lookups) == 1
    time.sleep(0.1)
    assert endpoints() == [PODS[0]]  # stale: the old answer now, a lookup in the background
    assert looked_up.wait(5)
    deadline = time.monotonic() + 5
    while endpoints() != PODS[:2] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert endpoints() == PODS[:2]  # a pod added by a scale-out is listed


def test_a_failed_lookup_keeps_the_last_answer() -> None:
    calls = [0]

    def resolve(address: str) -> list[str]:
        calls[0] += 1
        if calls[0] > 1:
            raise OSError("resolver down")
        return [PODS[0]]

    endpoints = ResolvedEndpoints("x:1", ttl_s=0.0, resolve=resolve)
    assert endpoints() == [PODS[0]]
    for _ in range(20):
        assert endpoints() == [PODS[0]]
        time.sleep(0.01)
    assert calls[0] > 1
