"""The speech API gateway of a namespace, and each voice's headless Service it streams to.

One gateway per namespace, not per pool: a client names a voice, not a pool, and one base
URL should reach every voice of the namespace whatever pool serves it. The gateway is light
(it relays audio; the pools do the work), so one Deployment per namespace scales on its own
replicas, and a pool added or removed never changes it.

How the gateway finds the pods of a voice, with no RBAC at all: each voice gets a headless
Service (`<voice>-tts-pods`, `clusterIP: None`) with the same selector as its ClusterIP
Service (the pool's pods labelled `serving.voxfleet.io/<voice>`), so its DNS name resolves to
exactly the ready pods that serve the voice. A pod that is stopping drops out of the answer
before it stops. The gateway resolves it every few seconds and picks a pod per stream
(engines/client/balancing.py). No watch of Endpoints, so no Role, and the gateway's pods mount no
service-account token.

Which voices exist (for `GET /v1/audio/voices`, and to tell an unknown voice, 404, from one
without a ready pod, 503) is a voice table the operator keeps in a ConfigMap, mounted into
the gateway's pods: kubelet refreshes a mounted ConfigMap in place, so adding a voice never
restarts the gateway (it reaches the pods within the kubelet's sync period, about a minute).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from voxfleet_operator.names import (
    GRPC_PORT,
    POOL_LABEL,
    SPEECH_API_COMPONENT,
    SPEECH_API_NAME,
    SPEECH_API_PORT,
    SPEECH_API_VOICE_TABLE_KEY,
    VOICE_LABEL,
    voice_pods_service_name,
)
from voxfleet_operator.pool_plan import Voice
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import container_security_context, metadata
from voxfleet_operator.render.voice import build_voice_service
from voxfleet_operator.speech_api import SpeechApiConfig

GATEWAY_USER = 65532
TABLE_MOUNT = "/etc/voxfleet-api"
KEYS_MOUNT = "/etc/voxfleet-api-keys"
API_KEYS_SECRET_KEY = "api-keys"
# The gateway lets its streams and sockets finish for this long after SIGTERM (its own
# GRACEFUL_SHUTDOWN_S); the pod's grace covers it, after a pause for endpoints to drop it.
PRESTOP_SECONDS = 5
GATEWAY_DRAIN_SECONDS = 20
TERMINATION_GRACE_SECONDS = PRESTOP_SECONDS + GATEWAY_DRAIN_SECONDS + 5


def gateway_selector() -> dict[str, str]:
    return {"app.kubernetes.io/name": SPEECH_API_NAME}


def build_voice_pods_service(voice: str, namespace: str, pool: Pool) -> dict[str, Any]:
    """Headless: the name resolves to the ready pods that serve the voice (the voice's
    Service otherwise, same selector and port)."""
    service = build_voice_service(voice, namespace, pool)
    service["metadata"] = metadata(
        voice_pods_service_name(voice),
        namespace,
        "endpoint-pods",
        {VOICE_LABEL: voice, POOL_LABEL: pool.name},
    )
    del service["spec"]["type"]
    service["spec"] = {"clusterIP": "None", **service["spec"]}
    return service


def voice_table(namespace: str, voices: Iterable[Voice], config: SpeechApiConfig) -> dict[str, Any]:
    """The gateway's voice table (engines/gateway/voices.py reads it): each voice's
    headless address, and the longest text its pods take (longer inputs go in pieces)."""
    table: dict[str, Any] = {
        "voices": {
            voice.name: {
                "address": f"{voice_pods_service_name(voice.name)}.{namespace}.svc:{GRPC_PORT}",
                "maxTextBytes": voice.spec.limits.max_text_bytes,
            }
            for voice in sorted(voices, key=lambda v: v.name)
        },
        "aliases": dict(sorted(config.voice_aliases.items())),
    }
    if config.default_voice:
        table["defaultVoice"] = config.default_voice
    return table


def build_speech_api_config_map(
    namespace: str, voices: Iterable[Voice], config: SpeechApiConfig
) -> dict[str, Any]:
    text = json.dumps(voice_table(namespace, voices, config), indent=2, sort_keys=True)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(SPEECH_API_NAME, namespace, SPEECH_API_COMPONENT),
        "data": {SPEECH_API_VOICE_TABLE_KEY: text + "\n"},
    }


def build_speech_api_deployment(namespace: str, config: SpeechApiConfig) -> dict[str, Any]:
    """The gateway's pods. Their template holds no voice: voices change the ConfigMap only."""
    selector = gateway_selector()
    args = [
        "api",
        f"--voice-table={TABLE_MOUNT}/{SPEECH_API_VOICE_TABLE_KEY}",
        "--host=0.0.0.0",
        f"--port={SPEECH_API_PORT}",
    ]
    mounts = [{"name": "voice-table", "mountPath": TABLE_MOUNT, "readOnly": True}]
    volumes: list[dict[str, Any]] = [
        {"name": "voice-table", "configMap": {"name": SPEECH_API_NAME}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    if config.api_keys_secret:
        args.append(f"--api-keys-file={KEYS_MOUNT}/{API_KEYS_SECRET_KEY}")
        mounts.append({"name": "api-keys", "mountPath": KEYS_MOUNT, "readOnly": True})
        volumes.append(
            {
                "name": "api-keys",
                "secret": {
                    "secretName": config.api_keys_secret,
                    "items": [{"key": API_KEYS_SECRET_KEY, "path": API_KEYS_SECRET_KEY}],
                },
            }
        )
    mounts.append({"name": "tmp", "mountPath": "/tmp"})
    probe = {"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"}}
    container: dict[str, Any] = {
        "name": "speech-api",
        "image": config.image,
        "imagePullPolicy": config.image_pull_policy,
        "command": ["voxfleet"],
        "args": args,
        "env": [
            {"name": "HOME", "value": "/tmp"},
            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
        ],
        "ports": [{"name": "http", "containerPort": SPEECH_API_PORT, "protocol": "TCP"}],
        "readinessProbe": {**probe, "periodSeconds": 5},
        "livenessProbe": {**probe, "periodSeconds": 20, "timeoutSeconds": 5},
        # Out of the Service's endpoints before the process stops taking requests.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    if config.resources:
        container["resources"] = dict(config.resources)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(SPEECH_API_NAME, namespace, SPEECH_API_COMPONENT, selector),
        "spec": {
            "replicas": config.replicas,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {
                    "labels": {
                        **metadata("", namespace, SPEECH_API_COMPONENT)["labels"],
                        **selector,
                    }
                },
                "spec": {
                    # DNS is all it asks of the cluster: no API access, no token.
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": GATEWAY_USER,
                        "runAsGroup": GATEWAY_USER,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [container],
                    "volumes": volumes,
                },
            },
        },
    }


def build_speech_api_service(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(SPEECH_API_NAME, namespace, SPEECH_API_COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": gateway_selector(),
            "ports": [
                {
                    "name": "http",
                    "port": SPEECH_API_PORT,
                    "targetPort": "http",
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def render_speech_api(
    namespace: str, voices: Iterable[Voice], config: SpeechApiConfig
) -> list[dict[str, Any]]:
    """The namespace's gateway: voice table, Deployment, Service ([] when it is off)."""
    if not config.enabled:
        return []
    return [
        build_speech_api_config_map(namespace, voices, config),
        build_speech_api_deployment(namespace, config),
        build_speech_api_service(namespace),
    ]


def speech_api_endpoint(namespace: str) -> str:
    return f"http://{SPEECH_API_NAME}.{namespace}.svc:{SPEECH_API_PORT}/v1"


def is_speech_api_child(labels: Mapping[str, str]) -> bool:
    return labels.get("app.kubernetes.io/component") == SPEECH_API_COMPONENT
