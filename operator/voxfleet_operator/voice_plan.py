"""A TTSVoice on a pool → the data plane's serving plan: the one place the spec is translated.

Everything the operator sends to a stream model (through Triton's load API) and to the
engine-build Job is the `engines.contract.plan.ServingPlan` built here, so a spec value reaches the
model under one name and one meaning.
"""

from __future__ import annotations

from dataclasses import replace

from engines.contract.plan import ServingPlan, WindowConfig, engine_key
from voxfleet_operator.pools import Pool
from voxfleet_operator.spec import TTSVoiceSpec

# Where pods and build Jobs mount the engine cache; the build Job publishes a voice's engines
# and its `.onnx.json` under `<mount>/<engine key>/`.
ENGINE_CACHE_MOUNT = "/engines"


def voice_windows(spec: TTSVoiceSpec) -> WindowConfig:
    """The stream model's windows and batching for a voice's spec."""
    return WindowConfig(
        first_window_frames=spec.streaming.first_window_frames,
        window_frames=spec.streaming.steady_window_frames,
        vocoder_context_frames=spec.streaming.context_frames,
        max_batch_windows=spec.batching.max_batch_size,
        max_encoder_wait_ms=spec.batching.max_queue_delay_ms,
        max_lead_ms=spec.streaming.max_lead_ms,
        encoder_launch=spec.batching.encoder_launch.value,
    )


def precision(spec: TTSVoiceSpec, pool: Pool) -> str:
    """The spec's precision where the pool's runtime builds it, else the runtime's default.

    A CPU pool builds only FP32; a voice asking for FP16 there still gets served (its spec
    says how it wants to run on GPUs), and the engines say which precision they hold.
    """
    info = pool.runtime_info
    wanted = spec.precision.value
    return wanted if wanted in info.precisions else info.default_precision


def encoder_precision(spec: TTSVoiceSpec, pool: Pool) -> str:
    """The spec's encoder precision where the pool's runtime offers it, else fp32: like
    `precision`, a voice asking for fp16 on a pool that cannot run it is still served, with
    its own audio."""
    wanted = spec.encoder_precision.value
    offered = pool.runtime_info.encoder_precisions
    return wanted if wanted in offered else offered[0]


def voice_engine_key(spec: TTSVoiceSpec, pool: Pool) -> str:
    """The name the voice's engines for this pool are published under (engines.contract.plan)."""
    return engine_key(
        source=spec.source.identity(),
        runtime=pool.runtime,
        precision=precision(spec, pool),
        windows=voice_windows(spec),
        image=pool.triton_image,
        gpu_product=pool.target_product,
    )


def serving_plan(
    name: str, spec: TTSVoiceSpec, pool: Pool, key: str, mount: str = ENGINE_CACHE_MOUNT
) -> ServingPlan:
    """The serving plan of voice `name` on `pool`, with engines published as `key`."""
    return ServingPlan(
        name=name,
        engine_dir=f"{mount}/{key}",
        runtime=pool.runtime,
        precision=precision(spec, pool),
        windows=replace(voice_windows(spec), encoder_precision=encoder_precision(spec, pool)),
        max_text_bytes=spec.limits.max_text_bytes,
        max_streams_per_pod=spec.limits.max_concurrent_streams,
        speaking_rate=spec.speaking_rate,
        instances=spec.batching.instances,
    )
