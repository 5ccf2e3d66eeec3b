"""How long the operator takes to reconcile 200 voices against the emulator (goal: < 60 s)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from operator_harness import REAL_CLUSTER, Api, eventually, running_operator

pytestmark = pytest.mark.kube

VOICE_COUNT = 200


@pytest.mark.skipif(REAL_CLUSTER, reason="a measurement of the operator against the emulator")
async def test_two_hundred_voices_reconcile_within_a_minute(api: Api, tmp_path: Path) -> None:
    # A long drift interval: the figure is the event-driven path, not the timer's.
    async with running_operator(tmp_path, resync_seconds=600):
        started = time.monotonic()
        names = [f"voice-{i:03d}" for i in range(VOICE_COUNT)]
        for index, name in enumerate(names):
            source = {"url": f"https://voices.example.com/{name}.onnx", "sha256": "cd" * 32}
            await api.create(
                "voxfleet.io/v1alpha1",
                "ttsvoices",
                {
                    "apiVersion": "voxfleet.io/v1alpha1",
                    "kind": "TTSVoice",
                    "metadata": {"name": name},
                    "spec": {"source": source, "pool": "t4" if index % 2 else "l4"},
                },
            )
        created = time.monotonic() - started

        async def all_reconciled() -> bool:
            voices = await api.list("voxfleet.io/v1alpha1", "ttsvoices")
            done = [v for v in voices if (v.get("status") or {}).get("observedGeneration") == 1]
            return len(done) == VOICE_COUNT

        await eventually(all_reconciled, timeout=120, interval=0.5)
        elapsed = time.monotonic() - started
        services = {s["metadata"]["name"] for s in await api.list("v1", "services")}
        jobs = await api.list("batch/v1", "jobs")
        deployment = await api.get("apps/v1", "deployments", "voxfleet-triton-t4")
        await asyncio.sleep(0)
    print(
        f"\n{VOICE_COUNT} voices: created in {created:.1f} s, all reconciled (status written) "
        f"{elapsed:.1f} s after the first create"
    )
    assert {f"{n}-tts" for n in names} <= services
    assert len(jobs) == VOICE_COUNT
    assert deployment is not None
    assert len(deployment["metadata"]["ownerReferences"]) == VOICE_COUNT // 2
    assert elapsed < 60, f"{VOICE_COUNT} voices took {elapsed:.1f} s"
