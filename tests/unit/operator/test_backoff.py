"""Retry timing of failed passes: the back-off schedule and its early end after an outage."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from voxfleet_operator.handlers import RETRY_DELAYS_SECONDS, retry_delay_seconds, with_backoff
from voxfleet_operator.kube import ApiError, ApiHealth, retry_after_seconds


def test_retries_back_off_to_a_cap() -> None:
    assert [retry_delay_seconds(r) for r in range(7)] == [1, 2, 5, 10, 30, 30, 30]
    assert RETRY_DELAYS_SECONDS[-1] == 30


def test_retry_after_is_read_and_capped() -> None:
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds("3600") == 10.0
    assert retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") is None


def _runtime(health: ApiHealth) -> Any:
    return SimpleNamespace(client=SimpleNamespace(health=health), closed=False)


async def _fail(error: Exception) -> None:
    raise error


async def test_a_failed_pass_asks_kopf_for_the_scheduled_delay() -> None:
    runtime = _runtime(ApiHealth())
    with pytest.raises(kopf.TemporaryError) as raised:
        await with_backoff(runtime, 3, _fail(ApiError(422, "Invalid", "bad field")))
    assert raised.value.delay == 10.0
    assert "422 Invalid: bad field (retry 4)" in str(raised.value)


async def test_an_outage_wait_ends_when_the_api_answers_again() -> None:
    health = ApiHealth()
    answers = iter([ApiError(503, "ServiceUnavailable", ""), None])

    async def probe() -> None:
        answer = next(answers)
        if answer is not None:
            raise answer

    health.mark_down(probe)
    started = time.monotonic()
    with pytest.raises(kopf.TemporaryError) as raised:
        # The 5th retry would wait 30 s; the API answers the second probe, 2 s in.
        await with_backoff(_runtime(health), 4, _fail(ApiError(503, "ServiceUnavailable", "etcd")))
    waited = time.monotonic() - started
    assert raised.value.delay == 0
    assert 1.5 < waited < 5.0
    assert not health.down
    await health.close()


async def test_a_stopping_operator_ends_a_failed_pass_quietly() -> None:
    runtime = _runtime(ApiHealth())
    runtime.closed = True
    await with_backoff(runtime, 0, _fail(RuntimeError("Connector is closed")))
    await asyncio.sleep(0)
