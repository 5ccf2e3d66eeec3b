"""The chart's speech API settings: the file it gives the operator is what `voxfleet render
--values` uses, the ConfigMap rules exist only with the gateway on, and bad settings are
refused with the field's name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from chart_support import HELMS, by_kind, helm_template, helm_template_error, voxfleet_render
from voxfleet_operator.chart_values import speech_api_from_values
from voxfleet_operator.speech_api import parse_speech_api

ON = [
    "--set", "speechApi.enabled=true",
    "--set", "speechApi.voiceAliases.alloy=joe",
    "--set", "speechApi.apiKeysSecret=tts-keys",
    "--set", "speechApi.replicas=2",
]  # fmt: skip
ROOT = Path(__file__).resolve().parents[3]


def operator_settings(objects: list[dict]) -> dict:
    configmap = next(c for c in by_kind(objects, "ConfigMap") if "speech-api.json" in c["data"])
    return json.loads(configmap["data"]["speech-api.json"])  # type: ignore[no-any-return]


def configmap_rules(objects: list[dict]) -> list[dict]:
    return [
        rule
        for role in by_kind(objects, "ClusterRole") + by_kind(objects, "Role")
        for rule in role.get("rules") or []
        if "configmaps" in rule.get("resources", [])
    ]


@pytest.mark.parametrize("helm", HELMS)
def test_operator_settings_match_what_render_uses(helm: str, tmp_path: Path) -> None:
    objects = helm_template(helm, *ON)
    settings = parse_speech_api(operator_settings(objects))
    assert settings.enabled and settings.replicas == 2
    assert settings.voice_aliases == {"alloy": "joe"} and settings.api_keys_secret == "tts-keys"
    values = yaml.safe_load(helm_template_values(helm, tmp_path))
    assert speech_api_from_values(values) == settings
    # The operator's pod restarts when the settings change (it reads them once).
    deployment = next(d for d in by_kind(objects, "Deployment"))
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/speech-api" in annotations
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["VOXFLEET_SPEECH_API_FILE"] == "/etc/voxfleet/speech-api.json"


def helm_template_values(helm: str, tmp_path: Path) -> str:
    """The chart's complete values with ON applied (as `helm get values --all` gives)."""
    from chart_support import CHART

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    api = values["speechApi"]
    api.update(enabled=True, voiceAliases={"alloy": "joe"}, apiKeysSecret="tts-keys", replicas=2)
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path.read_text()


@pytest.mark.parametrize("helm", HELMS)
def test_configmap_rules_only_with_the_gateway_on(helm: str) -> None:
    assert configmap_rules(helm_template(helm)) == []
    assert not parse_speech_api(operator_settings(helm_template(helm))).enabled
    rules = configmap_rules(helm_template(helm, *ON))
    assert {tuple(r["verbs"]) for r in rules} == {("create",), ("get", "patch", "delete")}
    named = [r for r in rules if r.get("resourceNames")]
    assert named and all(r["resourceNames"] == ["voxfleet-speech-api"] for r in named)


def test_render_with_the_values_shows_the_gateway(tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(helm_template_values("helm", tmp_path))
    objects = voxfleet_render(
        "-f", str(ROOT / "manifests" / "examples" / "joe.yaml"), "--values", str(path)
    )
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {("Deployment", "voxfleet-speech-api"), ("Service", "voxfleet-speech-api")} <= names
    assert ("Service", "joe-tts-pods") in names


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize(
    "values, word",
    [
        ({"speechApi": {"enabled": True, "image": {"repository": "x"}, "replicas": 0}}, "replicas"),
        ({"speechApi": {"enabled": True, "image": {"repository": "x"}, "port": 80}}, "port"),
        ({"speechApi": {"enabled": "yes", "image": {"repository": "x"}}}, "enabled"),
        ({"speechApi": {"enabled": True, "image": {"repository": "x"},
                        "apiKeysSecret": "Keys_1"}}, "apiKeysSecret"),
    ],
)  # fmt: skip
def test_bad_settings_are_refused(helm: str, values: dict, word: str, tmp_path: Path) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    assert word in helm_template_error(helm, "--values", str(file))
