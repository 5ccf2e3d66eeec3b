"""The stream model's metrics: Triton custom metrics (pb_utils.MetricFamily), labelled by model."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import triton_python_backend_utils as pb_utils

from engines.contract import names
from engines.streaming import SchedulerStats

LOGGER = logging.getLogger(__name__)
METRICS_INTERVAL_S = 0.25


class ModelMetrics:
    """The voice's own metrics on Triton's metrics port, published from scheduler stats."""

    def __init__(self, model: str, restarts: int = 0, instance: str | None = None) -> None:
        labels = {names.MODEL_LABEL: model}
        if instance is not None:  # one of several instances of the voice: a series each
            labels[names.MODEL_INSTANCE_LABEL] = instance
        # A Metric is only valid while its MetricFamily lives: keep the families.
        self._families: list[Any] = []

        def family(name: str, help_text: str, kind: Any) -> Any:
            metric_family = pb_utils.MetricFamily(name=name, description=help_text, kind=kind)
            self._families.append(metric_family)
            return metric_family.Metric(labels=labels)

        gauge, counter = pb_utils.MetricFamily.GAUGE, pb_utils.MetricFamily.COUNTER
        self.live = family(names.LIVE_STREAMS, "Streams in progress", gauge)
        self.risk = family(
            names.UNDERRUN_RISK_STREAMS,
            "Live streams with less than one window of audio buffered ahead of playback",
            gauge,
        )
        self.stream_seconds = family(
            names.STREAM_SECONDS_TOTAL,
            "Live streams integrated over time: its rate is the mean number of live streams",
            counter,
        )
        self.streams = family(names.STREAMS_TOTAL, "Streams accepted", counter)
        self.restarts = family(
            names.MODEL_RESTARTS_TOTAL,
            "Server restarts that healed this voice after its backend process died",
            counter,
        )
        if restarts > 0:
            self.restarts.increment(restarts)
        first_audio = pb_utils.MetricFamily(
            name=names.FIRST_AUDIO_SECONDS,
            description="Seconds from a request to its first audio",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        self._families.append(first_audio)
        self.first_audio = first_audio.Metric(
            labels=labels, buckets=list(names.FIRST_AUDIO_BUCKETS_SECONDS)
        )
        self.queue_sum = family(
            f"{names.QUEUE_SECONDS}_sum", "Total seconds windows waited for the vocoder", counter
        )
        self.queue_count = family(f"{names.QUEUE_SECONDS}_count", "Windows decoded", counter)
        self.load = family(
            names.LOAD_RATIO,
            "The pod's live streams over the real-time streams it holds by its own measurement "
            "(1: full; a busy pod refuses new streams from there)",
            gauge,
        )
        self.capacity = family(
            names.CAPACITY_STREAMS, "Real-time streams the pod holds, by its own measurement", gauge
        )
        self.refused = family(
            names.REFUSED_STREAMS_TOTAL, "Streams refused because the pod was full", counter
        )
        self.late = family(
            names.LATE_CHUNKS_TOTAL,
            "Chunks sent after the listener's audio ran out, by the pod's clock",
            counter,
        )
        self._labels = labels
        self._batches_family = pb_utils.MetricFamily(
            name=names.VOCODER_BATCHES_TOTAL,
            description="Vocoder calls by the number of stream windows they decoded together",
            kind=counter,
        )
        self._batches: dict[int, Any] = {}
        self._batches_seen: dict[int, int] = {}
        # Each counter, by the SchedulerStats field it follows, and that field's last value.
        self._counters = {
            "refused_streams": self.refused,
            "late_chunks": self.late,
            "streams_total": self.streams,
            "stream_seconds": self.stream_seconds,
            "queue_seconds_sum": self.queue_sum,
            "queue_count": self.queue_count,
        }
        self._last: dict[str, float] = dict.fromkeys(self._counters, 0)
        self._published_at = 0.0
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def publish_from_thread(self, stats: Callable[[], SchedulerStats]) -> None:
        """Publish `stats()` every METRICS_INTERVAL_S from a thread of its own rather than from
        the scheduler's steps: every metric update is a round trip to the tritonserver process
        (one per first-audio sample), which a GPU scheduler thread must not wait on."""

        def run() -> None:
            last_error = ""
            while not self._stopped.wait(METRICS_INTERVAL_S):
                try:
                    self.publish(stats(), force=True)
                    last_error = ""
                except Exception as error:  # metrics must never take the model down
                    text = f"{type(error).__name__}: {error}"
                    if text != last_error:  # once per distinct error, not every interval
                        LOGGER.error("publishing the voice's metrics failed: %s", text)
                    last_error = text

        self._thread = threading.Thread(target=run, name="voxfleet-metrics", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def publish(self, stats: SchedulerStats, force: bool = False) -> None:
        now = time.monotonic()
        if not force and stats.live_streams and now - self._published_at < METRICS_INTERVAL_S:
            return
        with self._lock:
            self._published_at = now
            self.live.set(stats.live_streams)
            self.risk.set(stats.underrun_risk_streams)
            self.load.set(stats.load_ratio)
            self.capacity.set(stats.capacity_streams)
            for field_name, metric in self._counters.items():
                new = getattr(stats, field_name)
                if new > self._last[field_name]:
                    metric.increment(new - self._last[field_name])
                self._last[field_name] = new
            # Taken in place: the scheduler thread may append while another thread publishes.
            samples = stats.first_audio_samples[:]
            del stats.first_audio_samples[: len(samples)]
            for seconds in samples:
                self.first_audio.observe(seconds)
            for size, calls in list(stats.vocoder_batches.items()):
                seen = self._batches_seen.get(size, 0)
                if calls > seen:
                    if size not in self._batches:
                        self._batches[size] = self._batches_family.Metric(
                            labels={**self._labels, "batch_size": str(size)}
                        )
                    self._batches[size].increment(calls - seen)
                    self._batches_seen[size] = calls
