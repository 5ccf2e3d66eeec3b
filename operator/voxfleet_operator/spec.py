"""The `TTSVoice` API: one pydantic model, the single source of truth for the CRD.

Field names are snake_case in Python and camelCase on the wire (`by_alias`). Every field has a
description (it becomes `kubectl explain` text) and a default where a user would expect one.
Cross-field rules exist twice on purpose: as CEL rules (`x-kubernetes-validations`) so the API
server rejects a bad voice at `kubectl apply`, and as pydantic validators with the same meaning
so the operator, `voxfleet render` and clusters without CEL reject it too. `tests/unit/operator`
checks that both agree on the same examples.
"""

from __future__ import annotations

import re
from enum import Enum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

# The stream model's largest vocoder call (batch x widest window with its context) must fit
# the engines' profile: the same arithmetic as the data plane's (`WindowConfig`).
from engines.contract.plan import MAX_INSTANCES, MAX_VOCODER_BATCH_FRAMES, WindowConfig

GROUP = "voxfleet.io"
VERSION = "v1alpha1"
PLURAL = "ttsvoices"
KIND = "TTSVoice"
SINGULAR = "ttsvoice"
SHORT_NAMES = ["ttsv"]


_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _rules(*rules: tuple[str, str]) -> dict[str, Any]:
    """CEL rules as the `x-kubernetes-validations` schema extension."""
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


class _Model(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True
    )


class PvcSource(_Model):
    claim_name: str = Field(
        min_length=1,
        max_length=253,
        description="Name of a PersistentVolumeClaim, in the voice's namespace, holding the voice.",
    )
    path: str = Field(
        min_length=1,
        max_length=1024,
        pattern=r"^[^/].*\.onnx$",
        description=(
            "Path of the Piper voice's `.onnx` file inside the claim (relative; the "
            "`.onnx.json` config must sit next to it)."
        ),
    )


class VoiceSource(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "(has(self.pvc) ? 1 : 0) + (has(self.url) ? 1 : 0) == 1",
                "source must set exactly one of pvc or url",
            ),
            ("has(self.url) == has(self.sha256)", "source.url needs source.sha256 and vice versa"),
        )
    )

    pvc: PvcSource | None = Field(
        default=None, description="Read the voice from a PersistentVolumeClaim."
    )
    url: str | None = Field(
        default=None,
        max_length=2048,
        pattern=r"^https?://",
        description=(
            "Download the voice's `.onnx` from this http(s) URL (its `.onnx.json` is "
            "fetched from the same URL plus `.json`)."
        ),
    )
    sha256: str | None = Field(
        default=None,
        pattern=_SHA256.pattern,
        description="Lower-case hex SHA-256 of the `.onnx` file at `url`; the download is "
        "rejected when it differs. Also the identity of the engines built from it.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> VoiceSource:
        kinds = [k for k in ("pvc", "url") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"source must set exactly one of pvc or url, got {kinds or 'neither'}")
        if (self.url is None) != (self.sha256 is None):
            raise ValueError("source.url needs source.sha256 and vice versa")
        return self

    def identity(self) -> str:
        """A stable identity of the voice's content, used in the engine key."""
        if self.url is not None:
            return f"sha256:{self.sha256}"
        assert self.pvc is not None
        return f"pvc:{self.pvc.claim_name}/{self.pvc.path}"


class Precision(str, Enum):
    FP16 = "fp16"
    FP32 = "fp32"
    INT8 = "int8"


class EncoderLaunch(str, Enum):
    """`engines.contract.plan.ENCODER_LAUNCHES`, as the CRD spells them."""

    INLINE = "inline"
    BESIDE = "beside"
    QUEUED = "queued"


class EncoderPrecision(str, Enum):
    """`engines.contract.plan.ENCODER_PRECISIONS`, as the CRD spells them."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


class Streaming(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "self.firstWindowFrames <= self.steadyWindowFrames",
                "streaming.firstWindowFrames must not exceed streaming.steadyWindowFrames",
            ),
        )
    )

    first_window_frames: int = Field(
        default=16,
        ge=4,
        le=512,
        description="Latent frames (256 samples each at 22,050 Hz) in a stream's first audio "
        "chunk; smaller means earlier first audio.",
    )
    steady_window_frames: int = Field(
        default=32,
        ge=4,
        le=512,
        description="Latent frames in every later chunk; larger means fewer vocoder calls.",
    )
    context_frames: int = Field(
        default=8,
        ge=0,
        le=64,
        description="Frames of context decoded on each side of a window and then dropped; "
        "8 gives about 58 dB SNR against a one-shot decode, 16 gives more than 120 dB.",
    )
    max_lead_ms: int = Field(
        default=0,
        ge=0,
        le=60000,
        description="Audio a playing stream may have sent ahead of its listener (counted from "
        "its first chunk) before it waits for the listener: the GPU's time goes to the other "
        "streams and to new ones instead, and a stream lasts about as long as its audio. 0 "
        "sends audio as fast as the GPU makes it (for clients that save it rather than play it).",
    )

    @model_validator(mode="after")
    def _first_fits(self) -> Streaming:
        if self.first_window_frames > self.steady_window_frames:
            raise ValueError(
                "streaming.firstWindowFrames must not exceed streaming.steadyWindowFrames "
                f"({self.first_window_frames} > {self.steady_window_frames})"
            )
        return self


class Batching(_Model):
    max_batch_size: int = Field(
        default=8, ge=1, le=64, description="Most vocoder windows decoded in one call."
    )
    max_queue_delay_ms: int = Field(
        default=25,
        ge=0,
        le=1000,
        description="Longest a new stream waits for others to share its encoder call, on a "
        "busy GPU (16 or more live streams) whose steps are shorter than this only; 0 never "
        "waits.",
    )
    instances: int = Field(
        default=1,
        ge=1,
        le=MAX_INSTANCES,
        description="Stream-model processes per pod for this voice: each takes its share of "
        "limits.maxConcurrentStreams, decodes its requests and sends its streams' audio. "
        "They share the pod's voice host (one scheduler, one set of CUDA graphs) and the "
        "voice's one copy of its weights there, so their streams share its stage calls.",
    )
    encoder_launch: EncoderLaunch = Field(
        default=EncoderLaunch.QUEUED,
        description="How a GPU (the torch-cuda runtime) runs a step's encoder call: queued "
        "(the default), behind the windows on their stream, up to three calls at a time, so "
        "the scheduler goes on meanwhile (on an H200 it held 2,000 paced listeners with no "
        "stream underrunning where inline let a few underrun, with 1.19 times inline's audio "
        "unpaced); inline, in the step before its windows, the scheduler waiting for it; "
        "beside, on a CUDA stream of its own next to the windows, one call at a time (with "
        "several instances and streaming.maxLeadMs, fewer streams underran on an H100 at "
        "2,000 streams). Other runtimes always run it inline.",
    )


class Limits(_Model):
    max_text_bytes: int = Field(
        default=4096,
        ge=1,
        le=1048576,
        description="Longest request text in UTF-8 bytes; longer requests get INVALID_ARGUMENT.",
    )
    max_concurrent_streams: int = Field(
        default=64,
        ge=1,
        le=10000,
        description="Most live streams per pod; more get RESOURCE_EXHAUSTED.",
    )


class Autoscaling(_Model):
    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                "self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must not exceed autoscaling.maxReplicas",
            ),
        )
    )

    min_replicas: int = Field(default=1, ge=1, le=1000, description="Fewest pool pods.")
    max_replicas: int = Field(
        default=4, ge=1, le=1000, description="Most pool pods (capped by the pool's maxPods)."
    )
    target_first_audio_p95_ms: int = Field(
        default=300,
        ge=10,
        le=60000,
        description="Time to first audio the pool is scaled to keep, in milliseconds.",
    )
    target_load_percent: int = Field(
        default=70,
        ge=10,
        le=100,
        description="Load a pod is scaled to keep, in percent of the real-time streams it "
        "holds by its own measurement (voxfleet_load_ratio: its live streams over that "
        "capacity; a busy pod refuses new streams at 100). The pool's HPA keeps its pods' mean "
        "load there; a per-voice HPA the voice's own streams, in pods.",
    )
    target_queue_ms: int = Field(
        default=50,
        ge=1,
        le=60000,
        description="Deprecated and ignored since chart 0.4.0 (no HPA scales on the time "
        "windows wait for the vocoder: it holds slack the planner keeps on purpose, and is "
        "high on an idle pod); accepted so that existing manifests still apply.",
    )
    per_voice: bool = Field(
        default=False,
        description="Scale this voice on its own: the operator renders a HorizontalPodAutoscaler "
        "on the voice's scale subresource (spec.replicas, pool pods the voice is loaded on) "
        "that follows the voice's own streams over its pods' capacity "
        "(targetLoadPercent); needs spec.replicas.",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                "autoscaling.minReplicas must not exceed autoscaling.maxReplicas "
                f"({self.min_replicas} > {self.max_replicas})"
            )
        return self


_WINDOW_RULE = (
    "self.batching.maxBatchSize * (self.streaming.steadyWindowFrames"
    " + 2 * self.streaming.contextFrames) <= " + str(MAX_VOCODER_BATCH_FRAMES)
)


_PER_VOICE_RULE = "!self.autoscaling.perVoice || has(self.replicas)"
_PER_VOICE_MESSAGE = (
    "autoscaling.perVoice needs spec.replicas, the number of pool pods the voice starts on"
)


class TTSVoiceSpec(_Model):
    """What a user asks for: a voice, where it runs, and how it streams and scales."""

    model_config = ConfigDict(
        json_schema_extra=_rules(
            (
                _WINDOW_RULE,
                "batching.maxBatchSize x (streaming.steadyWindowFrames + 2 x "
                f"streaming.contextFrames) must be at most {MAX_VOCODER_BATCH_FRAMES} frames",
            ),
            (
                "self.batching.maxBatchSize <= self.limits.maxConcurrentStreams",
                "batching.maxBatchSize must not exceed limits.maxConcurrentStreams",
            ),
            (_PER_VOICE_RULE, _PER_VOICE_MESSAGE),
        )
    )

    source: VoiceSource = Field(description="Where the Piper-format voice comes from.")
    pool: str | None = Field(
        default=None,
        max_length=40,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Pool (from the operator's configuration) to run on; "
        "empty means the operator's default pool.",
    )
    precision: Precision = Field(
        default=Precision.FP16, description="Engine precision (TensorRT): fp16, fp32 or int8."
    )
    encoder_precision: EncoderPrecision = Field(
        default=EncoderPrecision.FP32,
        description="What the encoder's text part runs at on a torch-cuda pool: fp32, the "
        "voice's own audio; fp16 (about 1.5 times as fast on an H200, but a phoneme in about "
        "a thousand is a frame longer or shorter and the rest of the audio is about 31 dB "
        "from fp32's) or bf16 (15 dB). Pools of other runtimes run it at fp32.",
    )
    streaming: Streaming = Field(
        default_factory=Streaming, description="How audio is cut into chunks."
    )
    batching: Batching = Field(
        default_factory=Batching, description="How windows of many streams share a call."
    )
    limits: Limits = Field(default_factory=Limits, description="Per-request and per-pod limits.")
    speaking_rate: float = Field(
        default=1.0,
        ge=0.25,
        le=4.0,
        description="Default speaking rate (1.0 = the voice's own); requests may override it. "
        "Piper's LENGTH_SCALE is 1 / speakingRate.",
    )
    autoscaling: Autoscaling = Field(
        default_factory=Autoscaling, description="Replica bounds and latency targets."
    )
    replicas: int | None = Field(
        default=None,
        ge=1,
        le=1000,
        description="Number of pool pods the voice is loaded on (the least-loaded ready ones); "
        "empty means every pod of the pool. The scale subresource's spec.replicas: set by "
        "`kubectl scale ttsv` or, with autoscaling.perVoice, by the voice's HPA.",
    )

    @model_validator(mode="after")
    def _cross_field(self) -> TTSVoiceSpec:
        frames = WindowConfig(
            first_window_frames=self.streaming.first_window_frames,
            window_frames=self.streaming.steady_window_frames,
            vocoder_context_frames=self.streaming.context_frames,
            max_batch_windows=self.batching.max_batch_size,
        ).vocoder_batch_frames()
        if frames > MAX_VOCODER_BATCH_FRAMES:
            raise ValueError(
                f"batching.maxBatchSize x (streaming.steadyWindowFrames + 2 x "
                f"streaming.contextFrames) = {frames} frames, the limit is "
                f"{MAX_VOCODER_BATCH_FRAMES}"
            )
        if self.batching.max_batch_size > self.limits.max_concurrent_streams:
            raise ValueError(
                "batching.maxBatchSize must not exceed limits.maxConcurrentStreams "
                f"({self.batching.max_batch_size} > {self.limits.max_concurrent_streams})"
            )
        if self.autoscaling.per_voice and self.replicas is None:
            raise ValueError(_PER_VOICE_MESSAGE)
        return self


class ConditionStatus(str, Enum):
    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class Condition(_Model):
    type: str = Field(description="SpecValid, EngineReady, Scheduled or Available.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(description="One CamelCase word a program can match on.")
    message: str = Field(default="", description="What happened, for a person.")
    last_transition_time: str | None = Field(
        default=None, description="When status last changed (RFC 3339)."
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation this condition was computed from."
    )


class Phase(str, Enum):
    PENDING = "Pending"
    BUILDING = "Building"
    READY = "Ready"
    FAILED = "Failed"


class TTSVoiceStatus(_Model):
    phase: Phase | None = Field(default=None, description="Pending, Building, Ready or Failed.")
    pool: str | None = Field(default=None, description="The pool the voice runs on.")
    endpoint: str | None = Field(
        default=None, description="gRPC endpoint (host:port) that streams this voice."
    )
    engine_key: str | None = Field(
        default=None, description="Key of the engines built for the current spec."
    )
    ready_pods: int | None = Field(default=None, description="Pool pods serving the voice.")
    replicas: int | None = Field(
        default=None,
        description="Ready pool pods the voice is loaded on (the scale subresource's "
        "status.replicas).",
    )
    selector: str | None = Field(
        default=None,
        description="The scale subresource's selector: one that selects no pod "
        "(`voxfleet.io/scaled-voice=<voice>`), because Kubernetes' HPA controller refuses "
        "HPAs whose pods overlap and the pool's HPA already selects every pod of the pool; "
        "the voice's HPA scales on a metric of the TTSVoice itself, which needs no pod list.",
    )
    pod_selector: str | None = Field(
        default=None,
        description="Label selector of the pods serving the voice (`kubectl get pods -l ...`).",
    )
    pods_endpoint: str | None = Field(
        default=None,
        description="The voice's headless Service (host:port): it resolves to each ready pod "
        "serving the voice, for clients that pick a pod per stream (engines.client.tts.TtsClient, "
        "gRPC's round_robin).",
    )
    live_streams: int | None = Field(
        default=None,
        description="Streams in progress on the voice's pods (from Prometheus, when the "
        "operator is given its URL).",
    )
    first_audio_p95_ms: int | None = Field(
        default=None,
        description="95th percentile of the time to first audio over the last 5 minutes, in "
        "milliseconds, as the pods measure it (from Prometheus).",
    )
    refused_streams: int | None = Field(
        default=None,
        description="Streams the voice's pods refused (RESOURCE_EXHAUSTED: full) over the "
        "last 5 minutes (from Prometheus).",
    )
    observed_generation: int | None = Field(
        default=None, description="The spec generation the status describes."
    )
    conditions: list[Condition] = Field(default_factory=list, description="Standard conditions.")


def parse_spec(spec: dict[str, Any]) -> TTSVoiceSpec:
    """Validate a `spec` dict from the API (camelCase); raises pydantic.ValidationError."""
    return TTSVoiceSpec.model_validate(spec)
