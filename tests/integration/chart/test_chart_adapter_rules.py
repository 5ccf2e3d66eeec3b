"""The prometheus-adapter rules, evaluated by the real Prometheus engine (promtool) on series
shaped like the stream model's metrics: a pod's load over the window (the same for every voice
it serves, so not added up), a voice's streams in pods (its live streams on each pod over that
pod's capacity, summed); the first-audio p95 from the histogram per pod and per voice (`model`
label); and 0 (not NaN) for an idle pod or voice."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml
from chart_support import ROOT, by_kind, helm_template, run, tool

# Adapter template variables, expanded as prometheus-adapter does for a request like
# GET .../namespaces/speech/pods/*/voxfleet_load_ratio.
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


def promtool_test(
    tmp_path: Path, inputs: list[dict[str, str]], expr: str, samples: list[dict[str, Any]]
) -> None:
    test_file = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": inputs,
                "promql_expr_test": [{"expr": expr, "eval_time": "5m", "exp_samples": samples}],
            }
        ],
    }
    path = tmp_path / "adapter-rule-test.yaml"
    path.write_text(yaml.safe_dump(test_file, sort_keys=False))
    result = run([tool("promtool"), "test", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def gauge(metric: str, pod: str, model: str, value: float, namespace: str = "speech") -> dict:
    labels = f'namespace="{namespace}",pod="{pod}",model="{model}"'
    return {"series": f"{metric}{{{labels}}}", "values": f"{value}+0x40"}


def stream_seconds(pod: str, model: str, live: float, namespace: str = "speech") -> dict:
    """The stream-seconds counter of `live` streams held all along (15 s steps)."""
    return series("voxfleet_stream_seconds_total", pod, model, live * 15, namespace)


def rule_named(name: str) -> dict[str, Any]:
    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == name]
    return rule


LOAD_INPUTS = [
    # triton-a serves joe: 4 live streams of the 8 it holds.
    gauge("voxfleet_load_ratio", "triton-a", "joe", 0.5),
    gauge("voxfleet_live_streams", "triton-a", "joe", 4),
    stream_seconds("triton-a", "joe", 4),
    gauge("voxfleet_capacity_streams", "triton-a", "joe", 8),
    # triton-b serves joe and amy, 3 streams each, and holds 6: full. Each voice's series
    # carries the pod's load, which must not be added up.
    gauge("voxfleet_load_ratio", "triton-b", "joe", 1.0),
    gauge("voxfleet_load_ratio", "triton-b", "amy", 1.0),
    gauge("voxfleet_live_streams", "triton-b", "joe", 3),
    stream_seconds("triton-b", "joe", 3),
    gauge("voxfleet_capacity_streams", "triton-b", "joe", 6),
    gauge("voxfleet_live_streams", "triton-b", "amy", 3),
    stream_seconds("triton-b", "amy", 3),
    gauge("voxfleet_capacity_streams", "triton-b", "amy", 6),
    # triton-idle has never been busy: no capacity measured, no load.
    gauge("voxfleet_load_ratio", "triton-idle", "silent", 0),
    gauge("voxfleet_live_streams", "triton-idle", "silent", 0),
    stream_seconds("triton-idle", "silent", 0),
    gauge("voxfleet_capacity_streams", "triton-idle", "silent", 0),
    # Another namespace's pod with the same name is not mixed in.
    gauge("voxfleet_load_ratio", "triton-a", "joe", 9, namespace="other"),
    gauge("voxfleet_live_streams", "triton-a", "joe", 90, namespace="other"),
    stream_seconds("triton-a", "joe", 90, namespace="other"),
    gauge("voxfleet_capacity_streams", "triton-a", "joe", 1, namespace="other"),
]


def load_query() -> str:
    rule = rule_named("voxfleet_load_ratio")
    assert rule["seriesQuery"].startswith("voxfleet_load_ratio{")
    assert rule["resources"]["overrides"] == {
        "namespace": {"resource": "namespace"},
        "pod": {"resource": "pod"},
    }
    return expand(rule["metricsQuery"]).replace("<<.Series>>", "voxfleet_load_ratio")


def pod_gauges(pod: str, ratio: float, live: int, capacity: int) -> list[dict[str, str]]:
    """A pod serving joe, as its stream model reports it."""
    return [
        gauge("voxfleet_load_ratio", pod, "joe", ratio),
        gauge("voxfleet_live_streams", pod, "joe", live),
        stream_seconds(pod, "joe", live),
        gauge("voxfleet_capacity_streams", pod, "joe", capacity),
    ]


def assert_loads(tmp_path: Path, inputs: list[dict[str, str]], milli: dict[str, int]) -> None:
    """The load rule gives each pod `milli[pod]` thousandths."""
    promtool_test(
        tmp_path,
        inputs,
        f"round(1000 * ({load_query()}))",
        [{"labels": f'{{pod="{pod}"}}', "value": value} for pod, value in milli.items()],
    )


def test_load_rule_gives_each_pod_the_load_of_the_pods_together(tmp_path: Path) -> None:
    # 10 live streams (4 on triton-a, 3 + 3 on triton-b) over 3 pods that hold 7 on average
    # (8 and 6; triton-idle has not measured, and counts at the mean): 10 / 21.
    assert_loads(tmp_path, LOAD_INPUTS, {"triton-a": 476, "triton-b": 476, "triton-idle": 476})


def test_streams_split_unevenly_do_not_raise_the_load(tmp_path: Path) -> None:
    """Three streams on a pod that just read its capacity as 4, none on one that read 8: the
    mean of the pods' own ratios would be 0.375, over the 0.35 under which a 70 % target
    scales two pods in; the pods together carry 3 streams of 12."""
    inputs = pod_gauges("triton-a", 0.75, 3, 4) + pod_gauges("triton-b", 0, 0, 8)
    assert_loads(tmp_path, inputs, {"triton-a": 250, "triton-b": 250})


def test_the_load_counts_streams_between_scrapes_and_capacity_over_its_own_window(
    tmp_path: Path,
) -> None:
    """The live-streams gauge reads 6 at every scrape of the last minute, but the pod's
    stream-seconds grew by 3 a second: 3 streams on average, which is what counts. Its
    capacity read 0 (not measured) for 3 of the 5 minutes, then 12, then 8 in the last
    minute: the measures it made count (10), not the zeros before them, and not only
    the last minute's 8. 3 / 10."""
    inputs = [
        gauge("voxfleet_load_ratio", "triton-a", "joe", 0.5),
        gauge("voxfleet_live_streams", "triton-a", "joe", 6),
        stream_seconds("triton-a", "joe", 3),
        {
            "series": 'voxfleet_capacity_streams{namespace="speech",pod="triton-a",model="joe"}',
            "values": "0+0x12 12+0x3 8+0x3",
        },
    ]
    assert_loads(tmp_path, inputs, {"triton-a": 300})


def test_a_pool_that_has_measured_nothing_reports_0(tmp_path: Path) -> None:
    assert_loads(tmp_path, pod_gauges("triton-a", 0, 2, 0), {"triton-a": 0})


def test_voice_load_rule_gives_each_voices_streams_in_pods(tmp_path: Path) -> None:
    rule = rule_named("voxfleet_voice_load_pods")
    assert rule["seriesQuery"].startswith("voxfleet_live_streams{")
    promtool_test(
        tmp_path,
        LOAD_INPUTS,
        f"round(1000 * ({voice_query(rule)}))",
        [
            # joe: 4 of 8 on triton-a and 3 of 6 on triton-b: one pod's worth.
            {"labels": '{model="joe"}', "value": 1000},
            {"labels": '{model="amy"}', "value": 500},
            # On a pod that never measured its capacity: 0, not missing.
            {"labels": '{model="silent"}', "value": 0},
        ],
    )


def voice_query(rule: dict[str, Any]) -> str:
    """A rule keyed by the `model` label, as prometheus-adapter expands it for a request for
    the ttsvoices joe, amy and silent."""
    assert rule["resources"]["overrides"]["model"] == {
        "group": "voxfleet.io",
        "resource": "ttsvoices",
    }
    return (
        rule["metricsQuery"]
        .replace("<<.Series>>", rule["seriesQuery"].split("{", 1)[0])
        .replace("<<.LabelMatchers>>", 'namespace="speech",model=~"joe|amy|silent"')
        .replace("<<.GroupBy>>", "model")
    )


BUCKETS = ("0.1", "0.25", "0.5", "1", "+Inf")
# Observations per 15 s step in each bucket (not cumulative): FAST has its p95 at
# 0.25 + 0.25 x (9.5 - 9) / 1 = 0.375 s, SLOW at 0.5 + 0.5 x 9.5 / 10 = 0.975 s.
FAST = (5, 4, 1, 0, 0)
SLOW = (0, 0, 0, 10, 0)
IDLE = (0, 0, 0, 0, 0)


def histogram(pod: str, model: str, per_bucket: tuple[int, ...]) -> list[dict[str, str]]:
    metric = "voxfleet_first_audio_seconds"
    labels = f'namespace="speech",pod="{pod}",model="{model}"'
    out = []
    cumulative = 0
    for le, count in zip(BUCKETS, per_bucket, strict=True):
        cumulative += count
        out.append(
            {"series": f'{metric}_bucket{{{labels},le="{le}"}}', "values": f"0+{cumulative}x40"}
        )
    out.append(series(f"{metric}_count", pod, model, cumulative))
    out.append(series(f"{metric}_sum", pod, model, 0.3 * cumulative))
    return out


P95_INPUTS = [
    *histogram("triton-a", "joe", FAST),
    # triton-b serves joe and amy: together 20 per step, rank 19 is in the (0.5, 1] bucket
    # with 10 below it: 0.5 + 0.5 x 9 / 10 = 0.95 s.
    *histogram("triton-b", "joe", FAST),
    *histogram("triton-b", "amy", SLOW),
    *histogram("triton-idle", "silent", IDLE),
]


def p95_rule(metric: str) -> dict[str, Any]:
    (rule,) = [r for r in adapter_rules() if r["name"]["as"] == metric]
    assert rule["seriesQuery"].startswith("voxfleet_first_audio_seconds_bucket{")
    assert "histogram_quantile(0.95," in rule["metricsQuery"]
    return rule


def test_pool_rule_gives_the_first_audio_p95_of_each_pod(tmp_path: Path) -> None:
    rule = p95_rule("voxfleet_first_audio_p95_seconds")
    assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
    query = expand(rule["metricsQuery"]).replace(
        "<<.Series>>", "voxfleet_first_audio_seconds_bucket"
    )
    promtool_test(
        tmp_path,
        P95_INPUTS,
        f"round(1e6 * ({query}))",
        [
            {"labels": '{pod="triton-a"}', "value": 375000},
            {"labels": '{pod="triton-b"}', "value": 950000},
            {"labels": '{pod="triton-idle"}', "value": 0},
        ],
    )


def test_voice_rule_gives_each_voices_p95_over_its_pods(tmp_path: Path) -> None:
    query = voice_query(p95_rule("voxfleet_voice_first_audio_p95_seconds"))
    promtool_test(
        tmp_path,
        P95_INPUTS,
        f"round(1e6 * ({query}))",
        [
            {"labels": '{model="joe"}', "value": 375000},
            {"labels": '{model="amy"}', "value": 975000},
            {"labels": '{model="silent"}', "value": 0},
        ],
    )


def test_rate_window_is_configurable() -> None:
    for rule in adapter_rules("--set", "prometheusAdapter.rules.rateWindow=3m"):
        assert "[3m]" in rule["metricsQuery"]
        assert "[1m]" not in rule["metricsQuery"]
    (load,) = [
        rule["metricsQuery"]
        for rule in adapter_rules("--set", "prometheusAdapter.rules.capacityWindow=7m")
        if rule["name"]["as"] == "voxfleet_load_ratio"
    ]
    assert "[7m:15s]" in load and "[5m:15s]" not in load


def test_rules_read_the_counters_the_stream_model_exports() -> None:
    """The series names in the rules are series the Triton stream model exports."""
    from engines.contract import names

    exported = {
        names.LIVE_STREAMS,
        names.STREAM_SECONDS_TOTAL,
        names.LOAD_RATIO,
        names.CAPACITY_STREAMS,
        names.UNDERRUN_RISK_STREAMS,
        names.STREAMS_TOTAL,
        names.VOCODER_BATCHES_TOTAL,
        *(f"{names.FIRST_AUDIO_SECONDS}{part}" for part in ("_bucket", "_sum", "_count")),
        *(f"{names.QUEUE_SECONDS}{part}" for part in ("_sum", "_count")),
    }
    model = "".join(
        path.read_text() for path in (ROOT / "engines" / "pod" / "triton_model").glob("*.py")
    )
    assert "names.FIRST_AUDIO_SECONDS" in model and "HISTOGRAM" in model
    for rule in adapter_rules():
        used = set(re.findall(r"voxfleet_[a-z_]+", rule["seriesQuery"] + rule["metricsQuery"]))
        # A histogram family `x` is exported as x_bucket, x_sum and x_count; the queue time
        # as x_sum and x_count counters.
        missing = {
            u
            for u in used
            if u not in exported and re.sub(r"_(bucket|sum|count)$", "", u) not in exported
        }
        assert not missing, f"not exported by the stream model: {missing}"
