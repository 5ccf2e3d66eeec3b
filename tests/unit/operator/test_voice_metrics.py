"""The TTSVoice status figures from Prometheus (voxfleet_operator/metrics.py): what each field
asks, how answers become whole numbers per voice, and that no URL or a Prometheus that does not
answer leaves the fields empty without failing anything."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from voxfleet_operator.config import ConfigError, load_config
from voxfleet_operator.metrics import VoiceMetricsReader, by_voice, empty_status, queries


def vector(**values: float | str) -> list[dict[str, Any]]:
    return [{"metric": {"model": m}, "value": [1700000000.0, str(v)]} for m, v in values.items()]


def test_queries_ask_for_the_namespaces_voices() -> None:
    asked = queries("tts")
    assert set(asked) == {"liveStreams", "firstAudioP95Ms", "refusedStreams"}
    assert all('namespace="tts"' in q and "by (model" in q for q in asked.values())
    assert "histogram_quantile(0.95" in asked["firstAudioP95Ms"]
    assert "increase(voxfleet_refused_streams_total" in asked["refusedStreams"]


def test_answers_become_whole_numbers_per_voice_and_nan_is_left_out() -> None:
    voices = by_voice(
        {
            "liveStreams": vector(joe=7, amy=0),
            "firstAudioP95Ms": vector(joe=182.6, amy="NaN"),
            "refusedStreams": vector(joe=2.9999, amy=0),
        }
    )
    assert voices == {
        "joe": {"liveStreams": 7, "firstAudioP95Ms": 183, "refusedStreams": 3},
        "amy": {"liveStreams": 0, "refusedStreams": 0},
    }


def test_a_voice_gets_its_figures_and_the_namespace_is_asked_once_per_ttl() -> None:
    asked: list[str] = []

    def query(promql: str) -> list[dict[str, Any]]:
        asked.append(promql)
        if "live_streams" in promql:
            return vector(joe=5)
        return []

    reader = VoiceMetricsReader("http://prometheus:9090", ttl_s=60, query=query)
    joe = asyncio.run(reader.voice_status("tts", "joe"))
    amy = asyncio.run(reader.voice_status("tts", "amy"))
    assert joe == {"liveStreams": 5, "firstAudioP95Ms": None, "refusedStreams": None}
    assert amy == empty_status()
    assert len(asked) == 3  # one query per field, for both voices


def test_a_prometheus_that_does_not_answer_leaves_the_fields_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def query(promql: str) -> list[dict[str, Any]]:
        raise ConnectionError("connection refused")

    reader = VoiceMetricsReader("http://prometheus:9090", ttl_s=0, query=query)
    for _ in range(3):
        assert asyncio.run(reader.voice_status("tts", "joe")) == empty_status()
    warnings = [r for r in caplog.records if "connection refused" in r.getMessage()]
    assert len(warnings) == 1  # once per distinct error, not every pass


def test_the_real_client_against_no_server_fails_softly() -> None:
    reader = VoiceMetricsReader("http://127.0.0.1:9")
    assert asyncio.run(reader.voice_status("tts", "joe")) == empty_status()


def test_the_url_comes_from_the_chart_and_is_checked() -> None:
    assert load_config({}).prometheus_url is None
    config = load_config({"VOXFLEET_PROMETHEUS_URL": "http://prometheus.monitoring.svc:9090/"})
    assert config.prometheus_url == "http://prometheus.monitoring.svc:9090"
    with pytest.raises(ConfigError, match=r"prometheus\.url"):
        load_config({"VOXFLEET_PROMETHEUS_URL": "prometheus:9090"})
