"""What scenarios do with voices, on the local cluster and on kind alike: apply one, wait for
it to be Ready, stream through its Service, read a pool pod's metrics.

Shared by every scenario file of the suite (e2e/test_*.py), so that new scenarios (many voices
in one pod, a speech-API gateway, streams spreading after a scale-out) build on the same steps.
"""

from __future__ import annotations

import urllib.request
from typing import Any

from e2e_support import POOL, eventually
from installation import Installation, describe
from speech import TEXT, Speech, say, say_many

from engines.contract import names

GROUP = "voxfleet.io/v1alpha1"
POOL_DEPLOYMENT = f"voxfleet-triton-{POOL}"
POOL_PODS = f"app.kubernetes.io/name=voxfleet-triton,voxfleet.io/pool={POOL}"


def voice(name: str, path: str = "joe/en_US-joe-medium.onnx", **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": GROUP,
        "kind": "TTSVoice",
        "metadata": {"name": name},
        "spec": {"pool": POOL, "source": {"pvc": {"claimName": "voices", "path": path}}, **spec},
    }


def ready_voice(installation: Installation, name: str, timeout: float) -> dict[str, Any]:
    kubectl = installation.kubectl

    def ready() -> dict[str, Any] | None:
        obj = kubectl.get("ttsv", name)
        status = (obj or {}).get("status") or {}
        assert status.get("phase") != "Failed", f"{name} failed: {status}"
        if status.get("phase") == "Ready" and status.get("endpoint"):
            return obj
        return None

    try:
        return eventually(ready, timeout=timeout, what=f"{name} is Ready")
    except AssertionError as error:
        pods = kubectl.items("pods")
        logs = "\n".join(
            f"--- {p['metadata']['name']}/{c['name']}\n"
            + installation.logs(p["metadata"]["name"], c["name"])[-2500:]
            for p in pods
            for c in p["spec"]["containers"]
        )
        raise AssertionError(f"{error}\n{describe(kubectl, f'ttsv/{name}')}\n{logs}") from None


def pool_pods(installation: Installation) -> list[dict[str, Any]]:
    return [
        p
        for p in installation.kubectl.items("pods", POOL_PODS)
        if not p["metadata"].get("deletionTimestamp")
    ]


def serving(pod: dict[str, Any], voice_name: str) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return labels.get(f"serving.voxfleet.io/{voice_name}") == "true"


def stream(installation: Installation, endpoint: str, name: str, text: str = TEXT) -> Speech:
    with installation.reach_service(endpoint) as address:
        return say(address, name, text)


def model_stats(installation: Installation, pod: str) -> dict[str, int]:
    """Streams each voice accepted, from the pod's own metrics port (`voxfleet_streams_total`:
    a stream the pod refused because it was full, which the client then asks again, is not
    one; Triton's own request count has both)."""
    with installation.reach_pod(pod, 8002) as address:
        text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    counts: dict[str, int] = {}
    for line in text.splitlines():
        if line.startswith(f"{names.STREAMS_TOTAL}{{"):
            model = line.split('model="', 1)[1].split('"', 1)[0]
            counts[model] = counts.get(model, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


def say_many_through(
    installation: Installation, endpoint: str, name: str, count: int, text: str = TEXT
) -> list[Speech]:
    with installation.reach_service(endpoint) as address:
        return say_many(address, name, count, text)
