"""Many voices in one pool pod: twenty TTSVoices applied with kubectl share a CPU pod's one
voice host (each a weight set of its own, not a process), several speak at once, and the pod
reports the memory the operator placed them by.

Runs after the first day's scenarios (test_kubectl_to_audio.py: joe on the CPU pool) and takes
its twenty voices away again, so the uninstall scenario finds the cluster as it expects.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from e2e_support import condition, eventually
from installation import Installation
from speech import TEXT, piper_seconds
from voices import pool_pods, ready_voice, serving, stream, voice

VOICES = [f"many-{index:02d}" for index in range(20)]
HEALTH_PORT = 8003


def memory_report(installation: Installation, pod: str) -> dict[str, Any]:
    """The pod's memory as its voice host reports it (GET /memory on the health port)."""
    with installation.reach_pod(pod, HEALTH_PORT) as address:
        with urllib.request.urlopen(f"http://{address}/memory", timeout=10) as reply:
            return dict(json.loads(reply.read()))


@pytest.fixture(scope="module")
def twenty(installation: Installation) -> Iterator[dict[str, dict[str, Any]]]:
    kubectl = installation.kubectl
    for name in VOICES:
        kubectl.apply(voice(name))
    ready = {name: ready_voice(installation, name, timeout=600) for name in VOICES}
    yield ready
    for name in VOICES:
        kubectl.run("delete", "ttsv", name, "--wait=false")
    eventually(
        lambda: not any(kubectl.get("ttsv", name) for name in VOICES) or None,
        timeout=300,
        what="the twenty voices are gone",
    )


def test_twenty_voices_load_into_one_pod_and_several_speak_at_once(
    installation: Installation, twenty: dict[str, dict[str, Any]]
) -> None:
    # Every voice is scheduled on the pool by memory and served.
    for name, obj in twenty.items():
        scheduled = condition(obj, "Scheduled")
        assert scheduled and scheduled["status"] == "True", (name, obj["status"])
        assert scheduled["reason"] == "PoolReady", scheduled
        available = condition(obj, "Available")
        assert available and available["status"] == "True", (name, obj["status"])
    # At least one pod serves all twenty (every voice goes on every pod where it fits).
    pods = pool_pods(installation)
    full = [p for p in pods if all(serving(p, name) for name in VOICES)]
    assert full, [sorted(p["metadata"].get("labels") or {}) for p in pods]
    pod = full[0]["metadata"]["name"]
    # Its voice host reports each voice's own footprint, within what it places voices in.
    report = memory_report(installation, pod)
    assert report["device"] == "cpu"
    for name in VOICES:
        assert report["voices"][name]["mib"] > 1, (name, report["voices"].get(name))
    placed = sum(entry["mib"] for entry in report["voices"].values())
    assert report["used_mib"] >= placed
    assert report["used_mib"] + report["margin_mib"] <= report["total_mib"]
    assert report["fixed_mib"] == pytest.approx(report["used_mib"] - placed, abs=1.0)
    # Four of them speak at once, each through its own Service, each as long as piper.
    speakers = VOICES[::5]
    with ThreadPoolExecutor(len(speakers)) as pool:
        speeches = list(
            pool.map(
                lambda name: stream(installation, twenty[name]["status"]["endpoint"], name),
                speakers,
            )
        )
    reference = piper_seconds(TEXT)
    for name, speech in zip(speakers, speeches, strict=True):
        assert speech.chunks > 1, name
        assert abs(speech.audio_seconds - reference) <= 0.10 * reference, (name, speech)
    # They were in flight together: each began before every other one ended.
    for speech in speeches:
        assert all(speech.started < other.finished for other in speeches)
