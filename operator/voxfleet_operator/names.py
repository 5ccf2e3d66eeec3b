"""Fixed names and labels of every child, so that reconciling is find-by-name, not search."""

from __future__ import annotations

import re

from engines.contract import names as data_plane_names

PART_OF = "voxfleet"
MANAGED_BY = "voxfleet-operator"
POOL_LABEL = "voxfleet.io/pool"
VOICE_LABEL = "voxfleet.io/voice"
ENGINE_KEY_LABEL = "voxfleet.io/engine-key"
COMPONENT_LABEL = "app.kubernetes.io/component"
# A pod carries one `serving.voxfleet.io/<voice>: "true"` label per voice loaded on it; the
# voice's Service selects on it, so traffic reaches only pods that really hold the voice.
SERVING_PREFIX = "serving.voxfleet.io/"
# The TTSVoice scale subresource's selector: a label no pod carries (placement.scale_selector).
SCALED_VOICE_LABEL = "voxfleet.io/scaled-voice"
REPOSITORY_KEY_SECRET = "voxfleet-repository-key"
REPOSITORY_KEY_SECRET_KEY = "repository-key"
# The header Triton checks on repository (load/unload) calls; HTTP sends it as is, gRPC as
# `triton-grpc-protocol-voxfleet-key`.
REPOSITORY_HEADER_KEY = "voxfleet-key"

GRPC_PORT = 8001
HTTP_PORT = 8000
METRICS_PORT = 8002
# `voxfleet triton`'s own port: GET /ready and /live, the pool pod's probes.
HEALTH_PORT = data_plane_names.HEALTH_PORT
SUPERVISOR_READY_PATH = data_plane_names.READY_PATH
MEMORY_PATH = data_plane_names.MEMORY_PATH
SUPERVISOR_LIVE_PATH = data_plane_names.LIVE_PATH
MPS_ENV = data_plane_names.MPS_ENV

# Voice names become DNS labels and label-key names (63 characters at most). MAX_VOICE_NAME
# is set after the child-name functions below, as the longest name for which all still fit.
DNS_LABEL_MAX = 63
VOICE_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_VOICE_NAME = re.compile(VOICE_NAME_PATTERN)


def voice_name_problem(name: str) -> str | None:
    """Why `name` cannot be a voice name, or None when it can."""
    if len(name) > MAX_VOICE_NAME:
        return (
            f"name {name!r} has {len(name)} characters, the limit is {MAX_VOICE_NAME} "
            f"(the engine Job is named {engine_job_name('<name>', '0' * 10)!r})"
        )
    if not _VOICE_NAME.match(name):
        return (
            f"name {name!r} must be a DNS label: lower-case letters, digits and '-', "
            "starting with a letter"
        )
    return None


def pool_deployment_name(pool: str) -> str:
    return f"voxfleet-triton-{pool}"


def pool_metrics_service_name(pool: str) -> str:
    return f"voxfleet-triton-{pool}-metrics"


def voice_service_name(voice: str) -> str:
    return f"{voice}-tts"


def voice_pods_service_name(voice: str) -> str:
    """The voice's headless Service: its name resolves to the ready pods serving the voice."""
    return f"{voice}-tts-pods"


# The speech API gateway of a namespace (render/speech_api.py).
SPEECH_API_NAME = "voxfleet-speech-api"
SPEECH_API_COMPONENT = "speech-api"
SPEECH_API_PORT = 8080
SPEECH_API_VOICE_TABLE_KEY = "voices.json"


def serving_label(voice: str) -> str:
    return SERVING_PREFIX + voice


def engine_job_name(voice: str, engine_key: str) -> str:
    return f"engine-{voice}-{engine_key[:10]}"


# The longest voice name for which every child name is still a DNS label: the Service
# `<voice>-tts`, the engine Job `engine-<voice>-<key[:10]>` (whose pods Kubernetes names
# from a cut prefix), and the `serving.voxfleet.io/<voice>` and `loaded.voxfleet.io/<voice>`
# label and annotation keys.
MAX_VOICE_NAME = DNS_LABEL_MAX - max(
    len(voice_service_name("")),
    len(voice_pods_service_name("")),
    len(engine_job_name("", "0" * 20)),
    len(serving_label("")) - len(SERVING_PREFIX),
)


def endpoint(voice: str, namespace: str) -> str:
    return f"{voice_service_name(voice)}.{namespace}.svc:{GRPC_PORT}"


def pods_endpoint(voice: str, namespace: str) -> str:
    """The voice's headless Service, which resolves to each ready pod serving it."""
    return f"{voice_pods_service_name(voice)}.{namespace}.svc:{GRPC_PORT}"


def pool_selector(pool: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "voxfleet-triton", POOL_LABEL: pool}


def common_labels(component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
        COMPONENT_LABEL: component,
    }
