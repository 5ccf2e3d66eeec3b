"""The prometheus-adapter rules, evaluated by the real Prometheus engine (promtool) on series
shaped like the stream model's counters: per pod, the mean queue / first-audio time over the
rate window, summed across the voices the pod serves, and 0 (not NaN) for an idle pod."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import ROOT, by_kind, helm_template, run, tool

# Adapter template variables, expanded as prometheus-adapter does for a request like
# GET .../namespaces/speech/pods/*/voxfleet_queue_seconds.
LABEL_MATCHERS = 'namespace="speech",pod=~"triton-a|triton-b|triton-idle"'
GROUP_BY = "pod"


def adapter_rules(*helm_args: str) -> list[dict[str, Any]]:
    objects = helm_template("helm", *helm_args)
    configmap = next(c for c in by_kind(objects, "ConfigMap") if "config.yaml" in c["data"])
    return list(yaml.safe_load(configmap["data"]["config.yaml"])["rules"])


def expand(query: str) -> str:
    return query.replace("<<.LabelMatchers>>", LABEL_MATCHERS).replace("<<.GroupBy>>", GROUP_BY)


def series(
    metric: str, pod: str, model: str, per_step: float, namespace: str = "speech"
) -> dict[str, str]:
    labels = f'namespace="{namespace}",pod="{pod}",model="{model}"'
    return {"series": f"{metric}{{{labels}}}", "values": f"0+{per_step}x40"}


@pytest.mark.parametrize("metric", ["voxfleet_queue_seconds", "voxfleet_first_audio_seconds"])
def test_adapter_rule_gives_the_per_pod_mean(metric: str, tmp_path: Path) -> None:
    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == metric]
    # The series the rule discovers by are the `_count` counters of the contract.
    assert rule["seriesQuery"].startswith(f"{metric}_count{{")
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    inputs = [
        # triton-a serves joe: 10 windows per 15 s step, 0.3 s of waiting in all: 30 ms each.
        series(f"{metric}_sum", "triton-a", "joe", 0.3),
        series(f"{metric}_count", "triton-a", "joe", 10),
        # triton-b serves two voices: (0.2 + 0.6) s over (4 + 4) windows: 100 ms each.
        series(f"{metric}_sum", "triton-b", "joe", 0.2),
        series(f"{metric}_count", "triton-b", "joe", 4),
        series(f"{metric}_sum", "triton-b", "amy", 0.6),
        series(f"{metric}_count", "triton-b", "amy", 4),
        # No traffic at all: 0, so that the HPA can scale an idle pool down.
        series(f"{metric}_sum", "triton-idle", "joe", 0),
        series(f"{metric}_count", "triton-idle", "joe", 0),
        # Another namespace's pod with the same name is not mixed in.
        series(f"{metric}_sum", "triton-a", "joe", 99, namespace="other"),
        series(f"{metric}_count", "triton-a", "joe", 1, namespace="other"),
    ]
    test_file = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        # In microseconds, rounded: float rates are not exact in the last bit.
                        "expr": f"round(1e6 * ({expand(rule['metricsQuery'])}))",
                        "eval_time": "5m",
                        "exp_samples": [
                            {"labels": '{pod="triton-a"}', "value": 30000},
                            {"labels": '{pod="triton-b"}', "value": 100000},
                            {"labels": '{pod="triton-idle"}', "value": 0},
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "adapter-rule-test.yaml"
    path.write_text(yaml.safe_dump(test_file, sort_keys=False))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_rate_window_is_configurable() -> None:
    for rule in adapter_rules("--set", "prometheusAdapter.rules.rateWindow=3m"):
        assert rule["metricsQuery"].count("[3m]") == 2


def test_rules_read_the_counters_the_stream_model_exports() -> None:
    """The series names in the rules are series the Triton stream model exports."""
    from engines import names

    exported = {
        names.LIVE_STREAMS,
        names.UNDERRUN_RISK_STREAMS,
        names.STREAMS_TOTAL,
        names.VOCODER_BATCHES_TOTAL,
        *(f"{names.FIRST_AUDIO_SECONDS}{part}" for part in ("_bucket", "_sum", "_count")),
        *(f"{names.QUEUE_SECONDS}{part}" for part in ("_sum", "_count")),
    }
    model = "".join(
        path.read_text() for path in (ROOT / "engines" / "triton_model").glob("*.py")
    )
    assert "names.FIRST_AUDIO_SECONDS" in model and "HISTOGRAM" in model
    for rule in adapter_rules():
        used = set(re.findall(r"voxfleet_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]))
        assert used <= exported, f"not exported by the stream model: {used - exported}"
