"""Passes of one voice run one at a time: its own events, the drift timer, a finished engine
Job and a ready pool pod each start a pass, and two at once loaded a voice onto a pod twice
(Triton then restarted to heal a stub it saw go). Passes of different voices still overlap."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from voxfleet_operator import reconcile
from voxfleet_operator.context import Runtime
from voxfleet_operator.reconcile import reconcile_voice


def _body(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "tts"}, "spec": {}}


async def test_passes_of_one_voice_never_overlap_and_of_two_voices_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    overlapped = asyncio.Event()

    async def slow_pass(rt: Any, body: Any, peers: Any) -> dict[str, Any]:
        name = body["metadata"]["name"]
        running[name] = running.get(name, 0) + 1
        most[name] = max(most.get(name, 0), running[name])
        if len([n for n, count in running.items() if count]) > 1:
            overlapped.set()
        await asyncio.sleep(0.05)
        running[name] -= 1
        return {"phase": "Ready"}

    monkeypatch.setattr(reconcile, "_reconcile_voice", slow_pass)
    rt = Runtime.__new__(Runtime)  # only the locks are used by the wrapper
    rt.voice_locks = {}
    passes = [reconcile_voice(rt, _body(name), lambda: []) for name in ["joe"] * 4 + ["amy"] * 4]
    started = asyncio.get_running_loop().time()
    await asyncio.gather(*passes)
    elapsed = asyncio.get_running_loop().time() - started
    assert most == {"joe": 1, "amy": 1}
    assert overlapped.is_set()  # joe's and amy's passes ran side by side
    assert elapsed < 0.05 * 8  # four after four, not eight in a row
