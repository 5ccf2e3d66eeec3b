"""voxfleet stream model: a decoupled Triton Python-backend model, one per voice.

Each request (TEXT, optional SPEAKER_ID, LENGTH_SCALE, NOISE_SCALE, NOISE_W) becomes a stream
in the voice's `StreamScheduler`; every decoded window goes back at once as a response (AUDIO
int16 PCM + SAMPLE_RATE); the last one is flagged final (a stream that ends early ends with an
empty or error response flagged final). The serving
plan (engine files, windows, limits) arrives as the JSON model parameter `voxfleet_plan`.

This file is the model's lifecycle only, and the only file Triton is given: the rest lives in
the installed `engines` package (request decoding in engines.triton_model.requests, responses
in .responses, metrics in .metrics).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from engines import names
from engines.frontend import Sentence
from engines.frontend_pool import FrontendPool
from engines.plan import ServingPlan
from engines.repository import instance_count
from engines.runtime import load_stages
from engines.streaming import FirstAudioPaths, StreamScheduler, SynthesisParams
from engines.triton_model.metrics import ModelMetrics
from engines.triton_model.requests import (
    UNAVAILABLE,
    RequestError,
    VoiceDefaults,
    decode_request,
    stream_limit_error,
)
from engines.triton_model.responses import SENDER_THREADS, CancelWatcher, ResponseSink, Senders
from engines.voice import VoiceConfig

LOGGER = logging.getLogger("voxfleet.model")
FRONTEND_WORKERS = 4
# The scheduler thread lets go of the GIL at every device wait (a GPU sync, an onnxruntime
# call) and must get it back quickly: with Python's default 5 ms switch interval, the threads
# that phonemise requests and send responses kept it waiting up to 5 ms each time.
GIL_SWITCH_INTERVAL_S = 0.0005


def restarts_so_far(model: str) -> int:
    try:
        counts = json.loads(os.environ.get(names.RESTARTS_ENV) or "{}")
        return int(counts.get(model, 0))
    except (ValueError, TypeError, AttributeError):
        return 0


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        raw_plan = config["parameters"][names.PLAN_PARAMETER]["string_value"]
        self.plan = ServingPlan.from_json(raw_plan)
        self.name = config["name"]
        with open(self.plan.voice_config_path, encoding="utf-8") as handle:
            self.voice = VoiceConfig.from_dict(json.load(handle), self.plan.voice_config_path)
        self.defaults = VoiceDefaults(
            num_speakers=self.voice.num_speakers,
            length_scale=self.voice.length_scale,
            noise_scale=self.voice.noise_scale,
            noise_w=self.voice.noise_w,
        )
        runtime = load_stages(self.plan.runtime, Path(self.plan.engine_dir), self.plan.windows)
        # A voice may run as several instances (processes), each with its own scheduler
        # (`voxfleet serve --instances`): each takes its share of the pod's stream limit and
        # labels its metrics; the first counts the restarts.
        self.instances = instance_count(config)
        instance_name = str(args.get("model_instance_name", ""))
        first = instance_name.endswith("_0") or self.instances == 1
        self.metrics = ModelMetrics(
            self.name,
            restarts_so_far(self.name) if first else 0,
            instance_name if self.instances > 1 else None,
        )
        # The call log (VOXFLEET_COSTS_LOG_S) names the instance where there are several: each
        # process writes totals of its own scheduler, which only grow apart.
        self.log_name = instance_name if self.instances > 1 and instance_name else self.name
        # Where the supervisor marks a draining server (absent when run without one).
        self.drain_file = os.environ.get(names.DRAIN_FILE_ENV) or None
        # A GPU scheduler thread spends its time waiting on the device and needs the GIL the
        # moment each wait ends: send from threads, phonemise in worker processes, switch the
        # GIL often. On the CPU data plane the stages use every core, and more threads and
        # processes would compete with them: responses and phonemes are done on the threads
        # that have them, as before the GPU work.
        gpu = self.plan.runtime_info.needs_gpu
        if gpu:
            sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
        self.senders = Senders(SENDER_THREADS if gpu else 0)
        # The GPU scheduler thread makes no round trip to the server: cancellation is asked
        # from a watcher thread and metrics are published from a thread of their own.
        self.watcher = CancelWatcher() if gpu else None
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
            on_step=None if gpu else self.metrics.publish,
        )
        if os.environ.get("VOXFLEET_WARMUP", "1") != "0":
            # GPU runtimes capture their CUDA graphs for every shape here: the model reports
            # ready only once no listener will wait for a capture.
            shapes = self.scheduler.warmup()
            if shapes:
                LOGGER.info("voice %s: %d call shapes prepared", self.name, shapes)
        self.scheduler.start()
        self.metrics.publish(self.scheduler.stats, force=True)
        if gpu:
            self.metrics.publish_from_thread(lambda: self.scheduler.stats)
        report_s = float(os.environ.get("VOXFLEET_COSTS_LOG_S", "0") or 0)
        if report_s > 0:
            self.scheduler.first_audio_paths = FirstAudioPaths()
            threading.Thread(
                target=self._report_costs, args=(report_s,), name="voxfleet-costs", daemon=True
            ).start()

    def execute(self, requests: list[Any]) -> None:
        received = time.monotonic()
        for request in requests:
            sink = ResponseSink(request, self.voice.sample_rate, self.senders, self.watcher)
            try:
                if self.drain_file is not None and os.path.exists(self.drain_file):
                    raise RequestError(
                        "this server is shutting down; retry (another server takes new streams)",
                        UNAVAILABLE,
                    )
                limit = self.plan.max_streams_per_pod
                share = -(-limit // self.instances)  # this instance's part of the limit
                if limit and self.scheduler.live_streams() + self._preparing >= share:
                    raise stream_limit_error(self.name, limit)
                inputs = {tensor.name(): tensor.as_numpy() for tensor in request.inputs()}
                text, params = decode_request(inputs, self.plan, self.defaults)
            except RequestError as error:
                sink.finish(error)
                continue
            except Exception as error:  # never let one request take the model down
                LOGGER.exception("rejecting a request")
                sink.finish(RuntimeError(f"could not prepare the text: {error}"))
                continue
            self._prepare(text, params, sink, received)
        return None

    def _prepare(
        self, text: str, params: SynthesisParams, sink: ResponseSink, received: float
    ) -> None:
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
                    RequestError("TEXT has nothing to speak once control characters are removed")
                )
            else:
                self.scheduler.submit(sentences, params, sink, received)

        self.frontend.submit(text, done)

    def _report_costs(self, interval_s: float) -> None:
        """A line per interval on stderr (the server's log) with the scheduler's call totals and
        cost model per stage, for profiling runs (VOXFLEET_COSTS_LOG_S)."""
        while True:
            time.sleep(interval_s)
            costs = self.scheduler.costs
            line = {
                stage: {
                    "calls": calls,
                    "seconds": round(seconds, 3),
                    "rows": rows,
                    "frames": frames,
                    "per_call_ms": round(costs.per_call[stage] * 1000, 3),
                    "per_frame_us": round(costs.per_frame[stage] * 1e6, 4),
                }
                for stage, (calls, seconds, rows, frames) in costs.totals.items()
            }
            # Where the scheduler thread's time went (engines.streaming.types.StepTimes).
            line["scheduler"] = self.scheduler.step_times.report()
            # Where the first audio delivered in this interval spent its time (ms).
            if self.scheduler.first_audio_paths is not None:
                line["first_audio_ms"] = self.scheduler.first_audio_paths.take()
            print(f"voxfleet-costs {self.log_name} {json.dumps(line)}", file=sys.stderr, flush=True)

    def finalize(self) -> None:
        self.frontend.close()
        self.scheduler.stop()
        self.metrics.stop()
        if self.watcher is not None:
            self.watcher.stop()
        self.senders.stop()
