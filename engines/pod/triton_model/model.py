"""voxfleet stream model: a decoupled Triton Python-backend model, one per voice.

Each request (TEXT, optional SPEAKER_ID, LENGTH_SCALE, NOISE_SCALE, NOISE_W) becomes a stream
on the pod's voice host (engines/pod/voice_host), which runs every voice of the pod in one
process; every decoded window comes back at once and goes out as a response (AUDIO int16 PCM +
SAMPLE_RATE); the last one is flagged final (a stream that ends early ends with an empty or
error response flagged final). The serving plan (engine files, windows, limits) arrives as
the JSON model parameter `voxfleet_plan`, and loading the model loads the voice into the host
(its weights: the host refuses a voice that does not fit, with the reason).

This process holds no stage runtime and no GPU memory: it decodes requests, keeps the voice's
stream limit, sends responses and publishes the voice's metrics. This file is the model's
lifecycle only, and the only file Triton is given: the rest lives in the installed `engines`
package (request decoding in engines.pod.triton_model.requests, responses in .responses, metrics in
.metrics, the host's client in engines.pod.voice_host.client).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from engines.contract import names
from engines.contract.plan import ServingPlan
from engines.contract.repository import instance_count
from engines.pod.triton_model.metrics import ModelMetrics
from engines.pod.triton_model.requests import (
    UNAVAILABLE,
    RequestError,
    VoiceDefaults,
    decode_request,
    stream_limit_error,
)
from engines.pod.triton_model.responses import SENDER_THREADS, CancelWatcher, ResponseSink, Senders
from engines.pod.voice_host.client import HostClient, HostError
from engines.text.voice import read_voice_config

LOGGER = logging.getLogger("voxfleet.model")


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
        self.voice = read_voice_config(self.plan.voice_config_path)
        self.defaults = VoiceDefaults(
            num_speakers=self.voice.num_speakers,
            length_scale=self.voice.length_scale,
            noise_scale=self.voice.noise_scale,
            noise_w=self.voice.noise_w,
        )
        socket_path = os.environ.get(names.VOICE_HOST_ENV)
        if not socket_path:
            raise RuntimeError(
                f"the voxfleet stream model needs the pod's voice host ({names.VOICE_HOST_ENV}); "
                "run tritonserver through `voxfleet serve` or `voxfleet triton`"
            )
        self.host = HostClient(socket_path)
        try:
            self.handle = self.host.load(self.plan)
        except HostError as error:
            self.host.close()
            # Triton's load answer (and so the operator's TTSVoice status) carries this.
            raise RuntimeError(f"[{error.status}] {error}") from None
        # A voice may run as several instances (processes, `voxfleet serve --instances`): each
        # takes its share of the pod's stream limit and labels its metrics; the first counts
        # the restarts.
        self.instances = instance_count(config)
        instance_name = str(args.get("model_instance_name", ""))
        first = instance_name.endswith("_0") or self.instances == 1
        self.metrics = ModelMetrics(
            self.name,
            restarts_so_far(self.name) if first else 0,
            instance_name if self.instances > 1 else None,
        )
        self.metrics.publish_from_thread(lambda: self.host.stats(self.handle))
        # Where the supervisor marks a draining server (absent when run without one).
        self.drain_file = os.environ.get(names.DRAIN_FILE_ENV) or None
        # Sends and cancellation questions are round trips to the tritonserver process: made
        # from threads of their own, never from the one that reads the host's audio.
        self.senders = Senders(SENDER_THREADS)
        self.watcher = CancelWatcher()

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
                if limit and self.host.live_streams() >= share:
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
            self.host.stream(self.handle, text, params, sink, received)
        return None

    def finalize(self) -> None:
        self.metrics.stop()
        try:
            self.host.unload(self.handle)
        except HostError as error:
            LOGGER.warning("unloading %s from the voice host: %s", self.name, error)
        self.host.close()
        self.watcher.stop()
        self.senders.stop()
