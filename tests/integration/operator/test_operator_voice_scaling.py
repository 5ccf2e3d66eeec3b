"""Per-voice scaling against the Kubernetes API: `spec.replicas` (what `kubectl scale ttsv`
sets) puts the voice on that many pool pods and takes it off the others; `perVoice` adds and
removes the voice's own HPA.

No Triton listens behind these pods (their port is closed), so every load and unload is
refused; what is checked is where the operator sends them and what it labels.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from operator_harness import NAMESPACE, REAL_CLUSTER, Api, eventually
from test_operator import VOICES, condition, finish_job, jobs_of, pool_pod, status_of, voice

pytestmark = [
    pytest.mark.kube,
    pytest.mark.skipif(REAL_CLUSTER, reason="plays the kubelet with pods nobody serves"),
]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serving(*voices: str) -> dict[str, str]:
    return {f"serving.voxfleet.io/{v}": "true" for v in voices}


async def create_pod(api: Api, name: str, port: int, *voices: str) -> None:
    pod = pool_pod(name, port, ready=True)
    pod["metadata"]["labels"].update(serving(*voices))
    await api.create("v1", "pods", pod)


async def labels_of(api: Api, name: str) -> dict[str, str]:
    pod = await api.get("v1", "pods", name)
    assert pod is not None
    return dict(pod["metadata"].get("labels") or {})


async def test_replicas_place_the_voice_on_that_many_pods(api: Api, operator: None) -> None:
    port = closed_port()
    await api.create(*VOICES, voice("joe", replicas=1))
    (job,) = await eventually(lambda: jobs_of(api, "joe"))
    await finish_job(api, job, succeeded=True)
    # joe is labelled on two pods, one of them busier (it also serves amy).
    await create_pod(api, "pod-a", port, "joe", "amy")
    await create_pod(api, "pod-b", port, "joe")
    await create_pod(api, "pod-c", port)

    async def left_the_busier_pod() -> bool:
        return "serving.voxfleet.io/joe" not in await labels_of(api, "pod-a")

    await eventually(left_the_busier_pod, timeout=10)
    assert (await labels_of(api, "pod-a"))["serving.voxfleet.io/amy"] == "true"

    async def load_refused() -> dict[str, Any] | None:
        status = await status_of(api, "joe")
        message = condition(status, "Available").get("message", "")
        return status if "pod pod-b:" in message else None

    status = await eventually(load_refused, timeout=10)
    message = condition(status, "Available")["message"]
    assert "pod-c" not in message  # one replica: the pod that already had joe keeps it
    # The scale subresource's selector selects no pod (the pool's HPA selects them all); the
    # serving pods' own selector is beside it.
    assert status["selector"] == "voxfleet.io/scaled-voice=joe"
    assert status["podSelector"] == (
        "app.kubernetes.io/name=voxfleet-triton,serving.voxfleet.io/joe=true,voxfleet.io/pool=t4"
    )
    assert status["podsEndpoint"] == f"joe-tts-pods.{NAMESPACE}.svc:8001"
    assert status["replicas"] == 0  # nothing could really load

    # `kubectl scale ttsv joe --replicas=2`: the least-loaded other pod is added, not pod-a.
    await api.patch(*VOICES, "joe", {"spec": {"replicas": 2}})

    async def second_pod_tried() -> str | None:
        status = await status_of(api, "joe")
        text = condition(status, "Available").get("message", "")
        return text if "pod pod-c:" in text else None

    message = await eventually(second_pod_tried, timeout=10)
    assert "pod pod-b:" in message and "pod-a" not in message


async def test_per_voice_hpa_follows_the_spec(api: Api, operator: None) -> None:
    hpas = ("autoscaling/v2", "horizontalpodautoscalers")
    await api.create(*VOICES, voice("joe", replicas=1, autoscaling={"perVoice": True}))
    hpa = await eventually(lambda: api.get(*hpas, "joe-tts"))
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "voxfleet.io/v1alpha1",
        "kind": "TTSVoice",
        "name": "joe",
    }
    assert hpa["metadata"]["ownerReferences"][0]["name"] == "joe"
    await api.patch(*VOICES, "joe", {"spec": {"autoscaling": {"perVoice": False}}})

    async def gone() -> bool:
        return await api.get(*hpas, "joe-tts") is None

    await eventually(gone, timeout=10)
    # The pool's HPA is still there and keeps at least the voice's one pod.
    pool_hpa = await api.get(*hpas, "voxfleet-triton-t4")
    assert pool_hpa is not None and pool_hpa["spec"]["minReplicas"] >= 1
