"""The operator with the speech API gateway on (the chart's `speechApi.enabled`): a namespace
with voices gets the gateway, its voice table follows the voices without touching the
gateway's pods, and a deleted gateway object comes back."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from operator_harness import (
    ENGINE_CACHE_CLAIM,
    NAMESPACE,
    REAL_CLUSTER,
    Api,
    engine_cache_claim,
    eventually,
    running_operator,
)

pytestmark = pytest.mark.skipif(REAL_CLUSTER, reason="the emulator's objects only")

VOICES = ("voxfleet.io/v1alpha1", "ttsvoices")
GATEWAY = "voxfleet-speech-api"


def voice(name: str) -> dict[str, Any]:
    source = {"url": f"https://voices.example.com/{name}.onnx", "sha256": "ab" * 32}
    return {
        "apiVersion": "voxfleet.io/v1alpha1",
        "kind": "TTSVoice",
        "metadata": {"name": name},
        "spec": {"source": source},
    }


@pytest.fixture()
async def operator_with_gateway(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    settings = tmp_path / "speech-api.json"
    settings.write_text(json.dumps({"enabled": True, "voiceAliases": {"alloy": "joe"}}))
    monkeypatch.setenv("VOXFLEET_SPEECH_API_FILE", str(settings))
    monkeypatch.delenv("VOXFLEET_POOLS_FILE", raising=False)
    if await api.get("v1", "persistentvolumeclaims", ENGINE_CACHE_CLAIM) is None:
        await api.create("v1", "persistentvolumeclaims", engine_cache_claim())
    async with running_operator(tmp_path, resync_seconds=0.5):
        yield


async def table(api: Api) -> dict[str, Any] | None:
    configmap = await api.get("v1", "configmaps", GATEWAY)
    return json.loads(configmap["data"]["voices.json"]) if configmap else None


async def test_the_gateway_follows_the_namespaces_voices(
    api: Api, operator_with_gateway: None
) -> None:
    joe = await api.create(*VOICES, voice("joe"))

    async def gateway_for_joe() -> dict[str, Any] | None:
        found = await table(api)
        ready = found and await api.get("apps/v1", "deployments", GATEWAY)
        ready = ready and await api.get("v1", "services", GATEWAY)
        ready = ready and await api.get("v1", "services", "joe-tts-pods")
        return found if ready else None

    first = await eventually(gateway_for_joe, timeout=10)
    assert first["voices"] == {
        "joe": {"address": f"joe-tts-pods.{NAMESPACE}.svc:8001", "maxTextBytes": 4096}
    }
    assert first["aliases"] == {"alloy": "joe"}
    deployment = await api.get("apps/v1", "deployments", GATEWAY)
    assert deployment is not None
    assert [r["uid"] for r in deployment["metadata"]["ownerReferences"]] == [joe["metadata"]["uid"]]
    headless = await api.get("v1", "services", "joe-tts-pods")
    assert headless is not None and headless["spec"]["clusterIP"] == "None"

    # A second voice: the table lists it; the gateway's pods stay as they are.
    amy = await api.create(*VOICES, voice("amy"))

    async def both() -> dict[str, Any] | None:
        found = await table(api)
        return found if found and set(found["voices"]) == {"amy", "joe"} else None

    await eventually(both, timeout=10)
    uids = {joe["metadata"]["uid"], amy["metadata"]["uid"]}

    async def owned_by_both() -> dict[str, Any] | None:
        # Written after the table, in the same pass.
        found = await api.get("apps/v1", "deployments", GATEWAY)
        owners = {
            r["uid"] for r in ((found or {}).get("metadata") or {}).get("ownerReferences", [])
        }
        return found if owners == uids else None

    after = await eventually(owned_by_both, timeout=10)
    assert after["spec"] == deployment["spec"]

    # Deleted, the gateway comes back.
    await api.delete("apps/v1", "deployments", GATEWAY)
    assert await eventually(lambda: api.get("apps/v1", "deployments", GATEWAY), timeout=10)
