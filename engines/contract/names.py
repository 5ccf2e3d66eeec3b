"""Names the stream model shares with its clients, Prometheus and the operator: defined once.

Plain strings and numbers only: the operator, the chart's generator and the clients import
this module without the data plane's dependencies.
"""

from __future__ import annotations

# -- the stream model's tensors -----------------------------------------------------------
TEXT = "TEXT"
SPEAKER_ID = "SPEAKER_ID"
LENGTH_SCALE = "LENGTH_SCALE"
NOISE_SCALE = "NOISE_SCALE"
NOISE_W = "NOISE_W"
AUDIO = "AUDIO"
SAMPLE_RATE = "SAMPLE_RATE"

# (name, Triton data type, optional)
INPUTS = (
    (TEXT, "TYPE_STRING", False),
    (SPEAKER_ID, "TYPE_INT32", True),
    (LENGTH_SCALE, "TYPE_FP32", True),
    (NOISE_SCALE, "TYPE_FP32", True),
    (NOISE_W, "TYPE_FP32", True),
)
# (name, Triton data type, dims)
OUTPUTS = ((AUDIO, "TYPE_INT16", (-1,)), (SAMPLE_RATE, "TYPE_INT32", (1,)))

# The model-config parameter that carries the serving plan (JSON).
PLAN_PARAMETER = "voxfleet_plan"

# -- metrics (labelled `model`) -----------------------------------------------------------
MODEL_LABEL = "model"
# Only where a voice runs more than one stream-model instance: which one (queries sum by model).
MODEL_INSTANCE_LABEL = "model_instance"
LIVE_STREAMS = "voxfleet_live_streams"
STREAM_SECONDS_TOTAL = "voxfleet_stream_seconds_total"
UNDERRUN_RISK_STREAMS = "voxfleet_underrun_risk_streams"
STREAMS_TOTAL = "voxfleet_streams_total"
# A histogram: _bucket{le}, _sum and _count series.
FIRST_AUDIO_SECONDS = "voxfleet_first_audio_seconds"
FIRST_AUDIO_BUCKETS_SECONDS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    0.75,
    1.0,
    2.0,
    5.0,
)
QUEUE_SECONDS = "voxfleet_queue_seconds"  # _sum and _count counters
# The pod's load against what it holds: its live streams over the real-time streams it holds
# by its own measurement (1.0: full; a busy pod refuses new streams from there).
LOAD_RATIO = "voxfleet_load_ratio"
# The real-time streams the pod holds, by its own measurement (0 until it has one).
CAPACITY_STREAMS = "voxfleet_capacity_streams"
# Streams of the voice refused (RESOURCE_EXHAUSTED) because the pod was full.
REFUSED_STREAMS_TOTAL = "voxfleet_refused_streams_total"
# Chunks of the voice's streams sent after the listener's audio ran out, by the pod's clock
# (playback from the first chunk on): underruns as the pod sees them.
LATE_CHUNKS_TOTAL = "voxfleet_late_chunks_total"
VOCODER_BATCHES_TOTAL = "voxfleet_vocoder_batches_total"  # labelled batch_size too
# Times `voxfleet triton` / `voxfleet serve` restarted the server to heal this voice after its
# backend process died (set by the supervisor, so it carries across those restarts).
MODEL_RESTARTS_TOTAL = "voxfleet_model_restarts_total"

# -- the supervisor (`voxfleet triton`, `voxfleet serve`) ---------------------------------
# Its own HTTP port in a pool pod: GET /ready and /live are the pod's probes.
HEALTH_PORT = 8003
HEALTH_PORT_ENV = "VOXFLEET_HEALTH_PORT"  # overrides HEALTH_PORT for `voxfleet triton`
MPS_ENV = (
    "VOXFLEET_MPS"  # =1: `voxfleet triton` runs a CUDA MPS daemon of its own (engines/pod/mps.py)
)
READY_PATH = "/ready"
LIVE_PATH = "/live"
# Environment the supervisor gives tritonserver (and so the stream model).
DRAIN_FILE_ENV = "VOXFLEET_DRAIN_FILE"  # exists once the server drains: new streams refused
RESTARTS_ENV = "VOXFLEET_MODEL_RESTARTS"  # JSON {model: restarts so far}
# The pod's voice host (engines/pod/voice_host): the Unix socket its stream models reach it on.
VOICE_HOST_ENV = "VOXFLEET_VOICE_HOST"
MEMORY_PATH = "/memory"  # the pod's memory report (JSON) on the health port
# Memory the voice host keeps free on top of what it places (MiB).
MEMORY_MARGIN_MIB = 512

# -- memory metrics (the health port's /metrics) ------------------------------------------
MEMORY_TOTAL_BYTES = "voxfleet_memory_total_bytes"  # labelled device: gpu or cpu
MEMORY_USED_BYTES = "voxfleet_memory_used_bytes"
MEMORY_FIXED_BYTES = "voxfleet_memory_fixed_bytes"
VOICE_MEMORY_BYTES = "voxfleet_voice_memory_bytes"  # labelled model

# -- the speech API gateway (`voxfleet api`), labelled `endpoint` (a pod's host:port) -----
GATEWAY_STREAMS_TOTAL = "voxfleet_gateway_streams_total"
GATEWAY_STREAMS_IN_FLIGHT = "voxfleet_gateway_streams_in_flight"
GATEWAY_REFUSALS_TOTAL = "voxfleet_gateway_refusals_total"
GATEWAY_FAILURES_TOTAL = "voxfleet_gateway_failures_total"

# gRPC channel options of the clients that stream from pods (engines.client.tts, the speech
# API gateway): large messages, and keepalives that notice a pod gone without a goodbye.
GRPC_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    # Notice a pod that went away without closing its connections within seconds.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
]
