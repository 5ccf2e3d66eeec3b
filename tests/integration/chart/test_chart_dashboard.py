"""The Grafana dashboard ConfigMap: found by kube-prometheus-stack's sidecar, valid JSON, the
panels the operations guide promises, and every PromQL expression accepted by promtool."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import HELMS, by_kind, helm_template, helm_template_error, run, tool

# Grafana variables, replaced the way Grafana would before sending a query.
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$namespace": ".*", "$voice": ".*"}
PANELS = {
    "Live streams",
    "First audio p50 / p95",
    "Underruns: streams at risk, late chunks",
    "Queue time",
    "Pods per voice",
    "Replicas vs desired",
}


def dashboards(helm: str, *args: str) -> list[dict[str, Any]]:
    return [
        c
        for c in by_kind(helm_template(helm, *args), "ConfigMap")
        if "voxfleet.json" in (c.get("data") or {})
    ]


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries.append(expr)
    return queries


@pytest.mark.parametrize("helm", HELMS)
def test_dashboard_configmap_is_labelled_for_the_grafana_sidecar(helm: str) -> None:
    (configmap,) = dashboards(helm)
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["namespace"] == "voxfleet"
    dashboard = json.loads(configmap["data"]["voxfleet.json"])
    assert dashboard["uid"] == "voxfleet"
    assert {p["title"] for p in dashboard["panels"]} == PANELS
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "voice"}


def test_dashboard_is_optional_and_its_labels_and_namespace_are_values() -> None:
    assert dashboards("helm", "--set", "grafanaDashboard.enabled=false") == []
    (configmap,) = dashboards(
        "helm",
        "--set",
        "grafanaDashboard.namespace=monitoring",
        "--set",
        "grafanaDashboard.annotations.grafana_folder=speech",
    )
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "speech"}
    error = helm_template_error("helm", "--set", "grafanaDashboard.enable=true")
    assert "grafanaDashboard" in error


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    (configmap,) = dashboards("helm")
    queries = dashboard_queries(json.loads(configmap["data"]["voxfleet.json"]))
    assert len(queries) >= 8
    rules = {
        "groups": [
            {
                "name": "voxfleet-dashboard",
                "rules": [
                    {"record": f"voxfleet:dashboard_query:{n}", "expr": q}
                    for n, q in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    result = run([tool("promtool"), "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr
    # promtool must catch a broken expression, or the check above proves nothing.
    rules["groups"][0]["rules"].append({"record": "voxfleet:broken", "expr": "sum by (model"})
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    assert run([tool("promtool"), "check", "rules", str(path)]).returncode != 0
