"""Polling for tests: `await eventually(check)` until a condition holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


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
