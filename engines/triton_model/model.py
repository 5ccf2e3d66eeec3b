"""voxfleet stream model: a decoupled Triton Python-backend model, one per voice.

Each request (TEXT, optional SPEAKER_ID, LENGTH_SCALE, NOISE_SCALE, NOISE_W) becomes a stream
in the voice's `StreamScheduler`; every decoded window goes back at once as a response (AUDIO
int16 PCM + SAMPLE_RATE) and the stream ends with an empty final-flagged response. The serving
plan (engine files, windows, limits) arrives as the JSON model parameter `voxfleet_plan`.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from engines import names
from engines.frontend import Sentence
from engines.frontend_pool import FrontendPool
from engines.plan import ServingPlan
from engines.runtime import load_stages
from engines.streaming import (
    SchedulerStats,
    StreamCancelled,
    StreamScheduler,
    StreamSink,
    SynthesisParams,
)
from engines.voice import VoiceConfig

LOGGER = logging.getLogger("voxfleet.model")
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
METRICS_INTERVAL_S = 0.25
SENDER_THREADS = 2
FRONTEND_WORKERS = 4
# The scheduler thread lets go of the GIL at every device wait (a GPU sync, an onnxruntime
# call) and must get it back quickly: with Python's default 5 ms switch interval, the threads
# that phonemise requests and send responses kept it waiting up to 5 ms each time.
GIL_SWITCH_INTERVAL_S = 0.0005


class RequestError(Exception):
    """A request we refuse; `status` is the gRPC status name the client should see."""

    def __init__(self, message: str, status: str, code: int) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _invalid(message: str) -> RequestError:
    return RequestError(message, "INVALID_ARGUMENT", pb_utils.TritonError.INVALID_ARG)


def _error_response(message: str, status: str, code: int | None = None) -> Any:
    # Triton's gRPC stream carries per-request errors as text only, so the status name leads
    # the message; engines.client turns it back into a code.
    error = pb_utils.TritonError(f"[{status}] {message}", code or pb_utils.TritonError.INTERNAL)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class _Senders:
    """Threads that hand responses to the server, so that the scheduler never waits on a send
    (each is a round trip to the tritonserver process). All responses of one stream go
    through one thread, in order; streams are spread over the threads. With no threads, the
    caller sends itself (the CPU data plane: its two cores are the stages')."""

    def __init__(self, threads: int = SENDER_THREADS) -> None:
        self._queues: list[queue.SimpleQueue[Callable[[], None] | None]] = [
            queue.SimpleQueue() for _ in range(threads)
        ]
        self._threads = [
            threading.Thread(target=self._run, args=(q,), name=f"voxfleet-send-{i}", daemon=True)
            for i, q in enumerate(self._queues)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, key: int, call: Callable[[], None]) -> None:
        if not self._queues:
            call()
            return
        self._queues[key % len(self._queues)].put(call)

    @staticmethod
    def _run(calls: queue.SimpleQueue[Callable[[], None] | None]) -> None:
        while (call := calls.get()) is not None:
            try:
                call()
            except Exception:  # the client may be gone; the scheduler notices it cancelled
                LOGGER.debug("sending a response failed", exc_info=True)

    def stop(self) -> None:
        for calls in self._queues:
            calls.put(None)  # after everything already queued
        for thread in self._threads:
            thread.join(timeout=10)


class _ResponseSink(StreamSink):
    _keys = itertools.count()

    def __init__(self, request: Any, sample_rate: int, senders: _Senders) -> None:
        self._sender = request.get_response_sender()
        self._rate = np.array([sample_rate], dtype=np.int32)
        self._senders = senders
        self._key = next(self._keys)

    def _send(self, response: Any = None, flags: int = 0) -> None:
        self._senders.submit(self._key, lambda: self._sender.send(response, flags=flags))

    def audio(self, pcm: np.ndarray) -> None:
        rate = self._rate

        def send() -> None:
            tensors = [pb_utils.Tensor(names.AUDIO, pcm), pb_utils.Tensor(names.SAMPLE_RATE, rate)]
            self._sender.send(pb_utils.InferenceResponse(output_tensors=tensors))

        self._senders.submit(self._key, send)

    def finish(self, error: Exception | None = None) -> None:
        if error is None or isinstance(error, StreamCancelled):
            self._send(flags=FINAL)
        elif isinstance(error, RequestError):
            self._send(_error_response(str(error), error.status, error.code), flags=FINAL)
        else:
            self._send(_error_response(str(error), "INTERNAL"), flags=FINAL)

    def cancelled(self) -> bool:
        return bool(self._sender.is_cancelled())


class _Metrics:
    def __init__(self, model: str) -> None:
        labels = {names.MODEL_LABEL: model}
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
        self.streams = family(names.STREAMS_TOTAL, "Streams accepted", counter)
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
        self._labels = labels
        self._batches_family = pb_utils.MetricFamily(
            name=names.VOCODER_BATCHES_TOTAL,
            description="Vocoder calls by the number of stream windows they decoded together",
            kind=counter,
        )
        self._batches: dict[int, Any] = {}
        self._batches_seen: dict[int, int] = {}
        self._last = SchedulerStats()
        self._published_at = 0.0
        self._lock = threading.Lock()

    def publish(self, stats: SchedulerStats, force: bool = False) -> None:
        now = time.monotonic()
        if not force and stats.live_streams and now - self._published_at < METRICS_INTERVAL_S:
            return
        with self._lock:
            self._published_at = now
            last = self._last
            self.live.set(stats.live_streams)
            self.risk.set(stats.underrun_risk_streams)
            for metric, new, old in (
                (self.streams, stats.streams_total, last.streams_total),
                (self.queue_sum, stats.queue_seconds_sum, last.queue_seconds_sum),
                (self.queue_count, stats.queue_count, last.queue_count),
            ):
                if new > old:
                    metric.increment(new - old)
            samples, stats.first_audio_samples = stats.first_audio_samples, []
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
            self._last = SchedulerStats(
                streams_total=stats.streams_total,
                queue_seconds_sum=stats.queue_seconds_sum,
                queue_count=stats.queue_count,
            )


def _optional_scalar(request: Any, name: str) -> float | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise _invalid(f"{name} must hold exactly one value, got {values.size}")
    return float(values[0])


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        raw_plan = config["parameters"][names.PLAN_PARAMETER]["string_value"]
        self.plan = ServingPlan.from_json(raw_plan)
        self.name = config["name"]
        with open(self.plan.voice_config_path, encoding="utf-8") as handle:
            self.voice = VoiceConfig.from_dict(json.load(handle), self.plan.voice_config_path)
        runtime = load_stages(self.plan.runtime, Path(self.plan.engine_dir), self.plan.windows)
        self.metrics = _Metrics(self.name)
        # A GPU scheduler thread spends its time waiting on the device and needs the GIL the
        # moment each wait ends: send from threads, phonemise in worker processes, switch the
        # GIL often. On the CPU data plane the stages use every core, and more threads and
        # processes would compete with them: responses and phonemes are done on the threads
        # that have them, as before the GPU work.
        gpu = self.plan.runtime_info.needs_gpu
        if gpu:
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.senders = _Senders(SENDER_THREADS if gpu else 0)
        default_workers = str(FRONTEND_WORKERS) if gpu else "0"
        workers = int(os.environ.get("VOXFLEET_FRONTEND_WORKERS", default_workers))
        self.frontend = FrontendPool(self.plan.voice_config_path, workers)
        self._preparing = 0
        self._preparing_lock = threading.Lock()
        self.scheduler = StreamScheduler(
            runtime,
            sample_rate=self.voice.sample_rate,
            hop_length=self.voice.hop_length,
            windows=self.plan.windows,
            cross_stream_batching=self.plan.cross_stream_batching,
            on_step=self.metrics.publish,
        )
        if os.environ.get("VOXFLEET_WARMUP", "1") != "0":
            # GPU runtimes capture their CUDA graphs for every shape here: the model reports
            # ready only once no listener will wait for a capture.
            shapes = self.scheduler.warmup()
            if shapes:
                LOGGER.info("voice %s: %d call shapes prepared", self.name, shapes)
        self.scheduler.start()
        self.metrics.publish(self.scheduler.stats, force=True)

    def _parse(self, request: Any) -> tuple[str, SynthesisParams]:
        tensor = pb_utils.get_input_tensor_by_name(request, names.TEXT)
        values = tensor.as_numpy().reshape(-1) if tensor is not None else np.array([])
        if values.size != 1:
            raise _invalid(f"TEXT must hold exactly one string, got {values.size}")
        raw = values[0]
        raw_bytes = raw if isinstance(raw, bytes) else str(raw).encode("utf-8")
        limit = self.plan.max_text_bytes
        if len(raw_bytes) > limit:
            raise _invalid(
                f"TEXT is {len(raw_bytes)} bytes; the limit is {limit} bytes (max_text_bytes)"
            )
        try:
            text = raw_bytes.decode("utf-8")
        except UnicodeDecodeError as error:
            raise _invalid(
                f"TEXT is not valid UTF-8: {error.reason} at byte {error.start}"
            ) from None
        if not text.strip():
            raise _invalid("TEXT is empty; send the text to speak")
        defaults = self.voice
        speaker = _optional_scalar(request, names.SPEAKER_ID)
        speaker_id = int(speaker) if speaker is not None else 0
        if not 0 <= speaker_id < max(1, defaults.num_speakers):
            raise _invalid(
                f"SPEAKER_ID {speaker_id} is out of range: voice {self.name!r} has "
                f"{defaults.num_speakers} speaker(s), ids 0..{max(0, defaults.num_speakers - 1)}"
            )
        length = _optional_scalar(request, names.LENGTH_SCALE)
        length_scale = defaults.length_scale / self.plan.speaking_rate if length is None else length
        noise = _optional_scalar(request, names.NOISE_SCALE)
        noise_w = _optional_scalar(request, names.NOISE_W)
        params = SynthesisParams(
            speaker_id=speaker_id,
            length_scale=length_scale,
            noise_scale=defaults.noise_scale if noise is None else noise,
            noise_w=defaults.noise_w if noise_w is None else noise_w,
        )
        if not 0.1 <= params.length_scale <= 10.0:
            raise _invalid(f"LENGTH_SCALE {params.length_scale} is outside 0.1..10")
        for name, value in (("NOISE_SCALE", params.noise_scale), ("NOISE_W", params.noise_w)):
            if not 0.0 <= value <= 2.0:
                raise _invalid(f"{name} {value} is outside 0..2")
        return text, params

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sink = _ResponseSink(request, self.voice.sample_rate, self.senders)
            try:
                limit = self.plan.max_streams_per_pod
                if limit and self.scheduler.live_streams() + self._preparing >= limit:
                    raise RequestError(
                        f"voice {self.name!r} is serving its limit of {limit} streams on this "
                        "server (max_streams_per_pod); retry later",
                        "RESOURCE_EXHAUSTED",
                        pb_utils.TritonError.UNAVAILABLE,
                    )
                text, params = self._parse(request)
            except RequestError as error:
                sink.finish(error)
                continue
            except Exception as error:  # never let one request take the model down
                LOGGER.exception("rejecting a request")
                sink.finish(RuntimeError(f"could not prepare the text: {error}"))
                continue
            self._prepare(text, params, sink)
        return None

    def _prepare(self, text: str, params: SynthesisParams, sink: _ResponseSink) -> None:
        """Phonemise (in the frontend's workers, where it has any), then start the stream."""
        with self._preparing_lock:
            self._preparing += 1

        def done(sentences: list[Sentence] | None, error: Exception | None) -> None:
            with self._preparing_lock:
                self._preparing -= 1
            if error is not None:
                LOGGER.error("phonemising a request failed: %s", error)
                sink.finish(RuntimeError(f"could not prepare the text: {error}"))
            elif not sentences:
                sink.finish(
                    _invalid("TEXT has nothing to speak once control characters are removed")
                )
            else:
                self.scheduler.submit(sentences, params, sink)

        self.frontend.submit(text, done)

    def finalize(self) -> None:
        self.frontend.close()
        self.scheduler.stop()
        self.senders.stop()
