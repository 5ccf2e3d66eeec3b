"""The chart's adapter rules, rendered as prometheus-adapter renders them (no Prometheus)."""

from __future__ import annotations

import os
import shutil

import pytest

from autoscale.adapter import (
    ROOT,
    AdapterRule,
    adapter_milli,
    resource_of_kind,
    rules_from_chart,
    rules_from_config,
)


def helm() -> str:
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("helm")
    if found is None:
        pytest.fail("helm is not installed: run `make setup`")
    return found


@pytest.fixture(scope="module")
def rules() -> dict[str, AdapterRule]:
    chart = rules_from_chart(helm())
    return {r.name_as: r for r in chart}


def test_the_chart_configmap_and_the_adapter_chart_values_hold_the_same_rules(
    rules: dict[str, AdapterRule],
) -> None:
    values = (ROOT / "charts" / "voxfleet" / "prometheus-adapter-values.yaml").read_text()
    assert {r.name_as: r for r in rules_from_config(values)} == rules


def test_pod_request_renders_namespace_and_pod_matchers(rules: dict[str, AdapterRule]) -> None:
    rule = rules["voxfleet_first_audio_p95_seconds"]
    series = "voxfleet_first_audio_seconds_bucket"
    assert rule.metric_name(series) == "voxfleet_first_audio_p95_seconds"
    assert rule.metric_name("voxfleet_first_audio_seconds_count") is None
    query = rule.render(series, ("", "pods"), "speech", ["triton-a", "triton-b"])
    assert "<<" not in query
    assert (
        'rate(voxfleet_first_audio_seconds_bucket{namespace="speech",pod=~"triton-a|triton-b"}[1m])'
        in query
    )
    assert "sum by (le, pod)" in query
    one = rule.render(series, ("", "pods"), "speech", ["triton-a"])
    assert '{namespace="speech",pod="triton-a"}' in one


def test_voice_request_is_keyed_by_the_model_label(rules: dict[str, AdapterRule]) -> None:
    rule = rules["voxfleet_voice_first_audio_p95_seconds"]
    resource = resource_of_kind("voxfleet.io/v1alpha1", "TTSVoice")
    assert resource == ("voxfleet.io", "ttsvoices")
    query = rule.render("voxfleet_first_audio_seconds_bucket", resource, "speech", ["joe"])
    assert '{namespace="speech",model="joe"}' in query
    assert "sum by (le, model)" in query
    # The pool rule has no label for TTSVoices.
    with pytest.raises(Exception, match="no label for resource"):
        rules["voxfleet_first_audio_p95_seconds"].render("x", resource, "speech", ["joe"])


def test_name_as_uses_go_style_groups() -> None:
    (rule,) = rules_from_config(
        """
rules:
- seriesQuery: 'x_total{pod!=""}'
  resources: {overrides: {pod: {resource: pod}}}
  name: {matches: "^(.*)_total$", as: "${1}_per_second"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
"""
    )
    assert rule.metric_name("x_total") == "x_per_second"
    assert (
        rule.render("x_total", ("", "pods"), None, ["p"])
        == 'sum(rate(x_total{pod="p"}[1m])) by (pod)'
    )


def test_values_reach_the_hpa_in_truncated_milli_units() -> None:
    assert adapter_milli(0.3759) == 375
    assert adapter_milli(0.0) == 0
