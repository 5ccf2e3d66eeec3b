"""The speech API gateway the operator renders per namespace, and each voice's headless
Service: what the gateway reads, what a cluster would do with them, and that voices change
only the voice table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from voxfleet_operator.config import load_config
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool, PoolsConfig
from voxfleet_operator.render import build_voice_pods_service, build_voice_service, render_voices
from voxfleet_operator.spec import TTSVoiceSpec
from voxfleet_operator.speech_api import SpeechApiConfig, SpeechApiConfigError, parse_speech_api

from engines.gateway.voices import table_from_dict

T4 = Pool(name="t4", max_pods=4)
L4 = Pool(name="l4", gpu_product="NVIDIA-L4", max_pods=2)
POOLS = PoolsConfig(default_pool="t4", pools=[T4, L4])
ON = SpeechApiConfig(
    enabled=True,
    image="registry.example/speech-api:1",
    voice_aliases={"alloy": "joe"},
    default_voice="amy",
    api_keys_secret="tts-keys",
    resources={"requests": {"cpu": "250m", "memory": "256Mi"}},
)


def voice(name: str, namespace: str = "tts", **spec: Any) -> Voice:
    spec.setdefault("source", {"url": "https://voices.example.com/v.onnx", "sha256": "ab" * 32})
    return Voice(name, namespace, TTSVoiceSpec.model_validate(spec))


def gateway_objects(objects: list[dict[str, Any]], namespace: str) -> dict[str, dict[str, Any]]:
    return {
        o["kind"]: o
        for o in objects
        if o["metadata"]["namespace"] == namespace
        and o["metadata"]["name"] == "voxfleet-speech-api"
    }


def test_headless_service_selects_what_the_voice_service_selects() -> None:
    headless = build_voice_pods_service("joe", "tts", T4)
    service = build_voice_service("joe", "tts", T4)
    assert headless["metadata"]["name"] == "joe-tts-pods"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"] == service["spec"]["selector"]
    assert headless["spec"]["ports"] == service["spec"]["ports"]


def test_one_gateway_per_namespace_serving_all_its_pools() -> None:
    voices = [
        voice("joe"),
        voice("amy", pool="l4", limits={"maxTextBytes": 2000}),
        voice("eve", namespace="other"),
    ]
    objects = render_voices(voices, POOLS, "cache", speech_api=ON)
    tts = gateway_objects(objects, "tts")
    assert set(tts) == {"ConfigMap", "Deployment", "Service"}
    assert set(gateway_objects(objects, "other")) == {"ConfigMap", "Deployment", "Service"}
    # The table is what the gateway reads: every voice of the namespace at its headless name.
    table = table_from_dict(json.loads(tts["ConfigMap"]["data"]["voices.json"]))
    assert {v: e.address for v, e in table.voices.items()} == {
        "amy": "amy-tts-pods.tts.svc:8001",
        "joe": "joe-tts-pods.tts.svc:8001",
    }
    assert table.aliases == {"alloy": "joe"} and table.default_voice == "amy"
    assert table.max_text_bytes("amy", 5000) == 2000  # longer inputs go in pieces
    assert table.resolve("alloy", list(table.voices)) == "joe"
    assert table.resolve("nova", list(table.voices)) == "amy"
    headless = {o["metadata"]["name"] for o in objects if o["kind"] == "Service"}
    assert {"joe-tts-pods", "amy-tts-pods", "eve-tts-pods"} <= headless


def test_the_gateway_needs_no_api_access_and_reads_its_keys_from_the_secret() -> None:
    deployment = gateway_objects(render_voices([voice("joe")], POOLS, "c", speech_api=ON), "tts")[
        "Deployment"
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["command"] == ["voxfleet"]
    assert container["args"][:2] == ["api", "--voice-table=/etc/voxfleet-api/voices.json"]
    assert "--api-keys-file=/etc/voxfleet-api-keys/api-keys" in container["args"]
    secrets = [v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v]
    assert secrets == ["tts-keys"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"] == ON.resources
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["terminationGracePeriodSeconds"] > 20


def test_voices_change_the_table_never_the_gateway_pods() -> None:
    one = gateway_objects(render_voices([voice("joe")], POOLS, "c", speech_api=ON), "tts")
    two = gateway_objects(
        render_voices([voice("joe"), voice("amy")], POOLS, "c", speech_api=ON), "tts"
    )
    assert one["Deployment"] == two["Deployment"] and one["Service"] == two["Service"]
    assert one["ConfigMap"] != two["ConfigMap"]


def test_off_by_default_and_nothing_rendered() -> None:
    assert SpeechApiConfig().enabled is False
    objects = render_voices([voice("joe")], POOLS, "c", speech_api=SpeechApiConfig())
    assert not gateway_objects(objects, "tts")
    assert load_config({}).speech_api.enabled is False


@pytest.mark.parametrize("version", ["1.30", "1.33"])
def test_gateway_objects_are_valid_kubernetes(version: str) -> None:
    objects = render_voices([voice("joe")], POOLS, "c", service_monitor=False, speech_api=ON)
    for obj in objects:
        if obj["kind"] in ("ConfigMap", "Deployment", "Service"):
            kubernetes_validate.validate(obj, version, strict=True)


def test_settings_file_and_its_errors(tmp_path: Path) -> None:
    path = tmp_path / "speech-api.json"
    path.write_text(json.dumps({"enabled": True, "replicas": 2, "voiceAliases": {"echo": "joe"}}))
    config = load_config({"VOXFLEET_SPEECH_API_FILE": str(path)}).speech_api
    assert config.enabled and config.replicas == 2 and config.voice_aliases == {"echo": "joe"}
    with pytest.raises(SpeechApiConfigError, match="replicas"):
        parse_speech_api({"replicas": 0})
    with pytest.raises(SpeechApiConfigError, match="unknownField"):
        parse_speech_api({"unknownField": 1})
