"""What the voices' pods say about their streams, read from Prometheus for the TTSVoice status.

With the chart's `prometheus.url` (VOXFLEET_PROMETHEUS_URL), the operator asks Prometheus, with
`prometheus-api-client`, for each voice of a namespace (the stream model's `model` label, on
the series the pool's ServiceMonitor scrapes):

- `liveStreams`: `sum by (model) (voxfleet_live_streams)`, the streams in progress now;
- `firstAudioP95Ms`: the p95 of `voxfleet_first_audio_seconds` over the last 5 minutes;
- `refusedStreams`: `increase(voxfleet_refused_streams_total[5m])`, the streams its pods
  refused because they were full.

`kubectl get ttsv` shows them as printer columns. One query per figure and namespace, kept for
`ttl_s`, so that a namespace of many voices costs three queries per pass. Without a URL there
is no reader and the fields stay empty; a Prometheus that does not answer leaves them empty
too (a stale figure would mislead), logs once per distinct error, and never fails a pass.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from engines.contract import names

logger = logging.getLogger(__name__)

# How long an answer serves every voice of its namespace.
DEFAULT_TTL_S = 10.0
# How long one query may take, and how many times a failed one is tried again.
QUERY_TIMEOUT_S = 3.0
QUERY_RETRIES = 1
WINDOW = "5m"


def queries(namespace: str) -> dict[str, str]:
    """The PromQL behind each status field, for the voices of `namespace`."""
    where = f'namespace="{namespace}"'
    return {
        "liveStreams": f"sum by (model) ({names.LIVE_STREAMS}{{{where}}})",
        "firstAudioP95Ms": (
            "1000 * histogram_quantile(0.95, sum by (model, le) "
            f"(rate({names.FIRST_AUDIO_SECONDS}_bucket{{{where}}}[{WINDOW}])))"
        ),
        "refusedStreams": (
            f"sum by (model) (increase({names.REFUSED_STREAMS_TOTAL}{{{where}}}[{WINDOW}]))"
        ),
    }


STATUS_FIELDS = tuple(queries(""))


def empty_status() -> dict[str, Any]:
    """Every metric field unset (a merge patch of nulls removes them)."""
    return dict.fromkeys(STATUS_FIELDS)


def by_voice(results: Mapping[str, list[dict[str, Any]]]) -> dict[str, dict[str, int]]:
    """Query results (Prometheus' instant vectors, by status field) as whole numbers per voice;
    NaN (a p95 with no stream in the window) is left out."""
    voices: dict[str, dict[str, int]] = {}
    for status_field, vector in results.items():
        for sample in vector:
            voice = (sample.get("metric") or {}).get(names.MODEL_LABEL)
            try:
                value = float(sample["value"][1])
            except (KeyError, IndexError, TypeError, ValueError):
                continue
            if voice and math.isfinite(value):
                voices.setdefault(voice, {})[status_field] = max(0, round(value))
    return voices


@dataclass
class _Answer:
    at: float
    voices: dict[str, dict[str, int]]


class VoiceMetricsReader:
    """Per-voice figures of a namespace from Prometheus (see the module docstring)."""

    def __init__(
        self,
        url: str,
        ttl_s: float = DEFAULT_TTL_S,
        query: Callable[[str], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.url = url
        self.ttl_s = ttl_s
        self._query = query or self._client_query()
        self._answers: dict[str, _Answer] = {}
        self._last_error = ""

    def _client_query(self) -> Callable[[str], list[dict[str, Any]]]:
        from prometheus_api_client import PrometheusConnect
        from urllib3.util.retry import Retry

        client = PrometheusConnect(
            url=self.url,
            disable_ssl=False,
            retry=Retry(total=QUERY_RETRIES, backoff_factor=0.2),
            timeout=QUERY_TIMEOUT_S,
        )

        def run(promql: str) -> list[dict[str, Any]]:
            result: list[dict[str, Any]] = client.custom_query(query=promql)
            return result

        return run

    def _read(self, namespace: str) -> dict[str, dict[str, int]]:
        return by_voice({f: self._query(q) for f, q in queries(namespace).items()})

    async def voice_status(self, namespace: str, voice: str) -> dict[str, Any]:
        """The status fields of `voice`: its figures, or None for each one unknown."""
        answer = self._answers.get(namespace)
        if answer is None or time.monotonic() - answer.at > self.ttl_s:
            try:
                voices = await asyncio.to_thread(self._read, namespace)
                self._last_error = ""
            except Exception as error:  # Prometheus is a nicety here, never a failure
                text = f"{type(error).__name__}: {error}"
                if text != self._last_error:
                    logger.warning("reading voice metrics from %s failed: %s", self.url, text)
                self._last_error = text
                voices = {}
            answer = self._answers[namespace] = _Answer(time.monotonic(), voices)
        return {**empty_status(), **answer.voices.get(voice, {})}
