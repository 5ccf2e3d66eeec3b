"""The example TTSVoices: accepted by the CRD (schema and CEL), and what the operator makes of
them accepted by Kubernetes 1.30–1.35 and the Prometheus Operator's schemas."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART,
    CrdValidator,
    all_schema_problems,
    by_kind,
    chart_pools_file,
    crd_from_chart,
    helm_template,
    voxfleet_render,
)


@pytest.fixture(scope="module")
def crd() -> CrdValidator:
    return CrdValidator(crd_from_chart())


def test_examples_cover_the_documented_cases(example_voices: list[dict[str, Any]]) -> None:
    specs = {v["metadata"]["name"]: v["spec"] for v in example_voices}
    assert "joe" in specs and "pool" not in specs["joe"]  # the default (T4) pool
    shared = [name for name, spec in specs.items() if spec.get("pool") == "t4"]
    assert shared, "no second voice on the t4 pool"
    assert any("autoscaling" in spec for spec in specs.values())


def test_examples_pass_the_crd_schema_and_cel_rules(
    crd: CrdValidator, example_voices: list[dict[str, Any]]
) -> None:
    for voice in example_voices:
        assert crd.problems(voice) == [], voice["metadata"]["name"]


JOE = {
    "apiVersion": "voxfleet.io/v1alpha1",
    "kind": "TTSVoice",
    "metadata": {"name": "joe"},
    "spec": {"source": {"url": "https://example.com/joe.onnx", "sha256": "0" * 64}},
}

# (id, change to JOE's spec, the CRD's message)
INVALID = [
    ("both-sources", {"source": {"url": "https://e.com/a.onnx", "sha256": "0" * 64,
                                 "pvc": {"claimName": "v", "path": "a.onnx"}}},
     "exactly one of pvc or url"),
    ("url-without-digest", {"source": {"url": "https://e.com/a.onnx"}}, "needs source.sha256"),
    ("min-above-default-max", {"autoscaling": {"minReplicas": 5}}, "minReplicas must not exceed"),
    ("first-window-above-steady", {"streaming": {"firstWindowFrames": 64}},
     "firstWindowFrames must not exceed"),
    ("windows-too-big-for-batch", {"batching": {"maxBatchSize": 64},
                                   "streaming": {"steadyWindowFrames": 128, "contextFrames": 8},
                                   "limits": {"maxConcurrentStreams": 64}},
     "must be at most 8192 frames"),
    ("batch-above-streams", {"batching": {"maxBatchSize": 32},
                             "limits": {"maxConcurrentStreams": 16}},
     "maxBatchSize must not exceed limits.maxConcurrentStreams"),
    ("digest-not-hex", {"source": {"url": "https://e.com/a.onnx", "sha256": "XYZ"}}, "sha256"),
    ("rate-too-fast", {"speakingRate": 9.0}, "speakingRate"),
    ("unknown-field", {"instances": 3}, "unknown field"),
    ("per-voice-without-replicas", {"autoscaling": {"perVoice": True}},
     "autoscaling.perVoice needs spec.replicas"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in INVALID],
                         ids=[i for i, _, _ in INVALID])  # fmt: skip
def test_invalid_voices_are_refused_by_the_crd_and_by_the_operator(
    crd: CrdValidator, change: dict[str, Any], message: str
) -> None:
    from pydantic import ValidationError
    from voxfleet_operator.spec import parse_spec

    voice = copy.deepcopy(JOE)
    voice["spec"].update(change)
    problems = crd.problems(voice)
    assert any(message in p for p in problems), problems
    # The operator's own model agrees, for clusters without CEL and for `voxfleet render`.
    with pytest.raises(ValidationError):
        parse_spec(voice["spec"])


def test_rendered_children_are_valid_for_kubernetes_and_prometheus_operator(
    rendered_children: list[dict[str, Any]],
) -> None:
    kinds = {o["kind"] for o in rendered_children}
    assert kinds >= {"Job", "Deployment", "Service", "HorizontalPodAutoscaler",
                     "PodDisruptionBudget", "ServiceMonitor", "Secret"}  # fmt: skip
    assert all_schema_problems(rendered_children) == []


def test_voices_on_one_pool_share_one_triton_deployment(
    rendered_children: list[dict[str, Any]], example_voices: list[dict[str, Any]]
) -> None:
    (deployment,) = by_kind(rendered_children, "Deployment")
    assert deployment["metadata"]["namespace"] == "speech"
    services = by_kind(rendered_children, "Service")
    voice_services = [s for s in services if "clusterIP" not in s["spec"]]
    assert len(voice_services) == len(example_voices)


def test_hpa_metrics_are_the_ones_the_adapter_rules_expose(
    rendered_children: list[dict[str, Any]],
) -> None:
    configmap = next(
        c for c in by_kind(helm_template("helm"), "ConfigMap") if "config.yaml" in c["data"]
    )
    exposed = {r["name"]["as"] for r in yaml.safe_load(configmap["data"]["config.yaml"])["rules"]}
    (hpa,) = by_kind(rendered_children, "HorizontalPodAutoscaler")
    wanted = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"}
    assert wanted and wanted <= exposed


def test_a_second_pool_from_the_chart_values_is_used(tmp_path: Path) -> None:
    pools = chart_pools_file(tmp_path, "--values", str(CHART / "ci" / "full-values.yaml"))
    voice = copy.deepcopy(JOE)
    voice["spec"]["pool"] = "t4"
    (tmp_path / "voice.yaml").write_text(yaml.safe_dump(voice))
    objects = voxfleet_render("-f", str(tmp_path / "voice.yaml"), "--pools", str(pools))
    (deployment,) = by_kind(objects, "Deployment")
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example.com/speech/voxfleet-triton:0.1.0-trt"
    assert all_schema_problems(objects) == []
