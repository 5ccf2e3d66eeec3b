"""A voice loaded on a pod that cannot serve it now is reported with the pod's name."""

from __future__ import annotations

from typing import Any

from voxfleet_operator.names import serving_label
from voxfleet_operator.pods import pods_failing_voice


def pod(name: str, ready: bool, labels: dict[str, str]) -> dict[str, Any]:
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"phase": "Running", "podIP": "10.0.0.1", "conditions": [condition]},
    }


def test_a_not_ready_pod_that_had_the_voice_is_named() -> None:
    serving = {serving_label("joe"): "true"}
    pods = [
        pod("pool-a", True, serving),
        pod("pool-b", False, serving),  # its supervisor reports the voice cannot serve
        pod("pool-c", False, {}),  # never had the voice
    ]
    (message,) = pods_failing_voice(pods, "joe")
    assert "pod pool-b" in message and "voice joe" in message
    assert pods_failing_voice(pods, "amy") == []


def test_a_pod_on_its_way_out_is_not_a_failure() -> None:
    leaving = pod("pool-b", False, {serving_label("joe"): "true"})
    leaving["metadata"]["deletionTimestamp"] = "2026-11-23T04:00:00Z"
    assert pods_failing_voice([leaving], "joe") == []
