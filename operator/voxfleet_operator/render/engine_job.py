"""The engine-build Job: one per (voice, engine key), on a node of the voice's pool.

The Job receives the voice's serving plan, so it builds for the pool's runtime and precision,
with TensorRT profiles sized by the voice's own windows and batch.
"""

from __future__ import annotations

from typing import Any

from voxfleet_operator.names import ENGINE_KEY_LABEL, POOL_LABEL, VOICE_LABEL, engine_job_name
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import (
    container_security_context,
    metadata,
    pod_security_context,
    pool_node_selector,
    pool_resources,
)
from voxfleet_operator.spec import TTSVoiceSpec
from voxfleet_operator.voice_plan import ENGINE_CACHE_MOUNT, serving_plan

VOICE_MOUNT = "/voice"
BUILD_BACKOFF_LIMIT = 2
BUILD_DEADLINE_SECONDS = 3600


def voice_argument(spec: TTSVoiceSpec) -> str:
    """What `build-engines --voice` gets: a path on the mounted claim, or the URL."""
    if spec.source.pvc is not None:
        return f"{VOICE_MOUNT}/{spec.source.pvc.path}"
    assert spec.source.url is not None
    return spec.source.url


def build_engine_job(
    voice: str,
    namespace: str,
    spec: TTSVoiceSpec,
    pool: Pool,
    engine_key: str,
    engine_cache_pvc: str,
) -> dict[str, Any]:
    labels = {VOICE_LABEL: voice, POOL_LABEL: pool.name, ENGINE_KEY_LABEL: engine_key}
    volumes: list[dict[str, Any]] = [
        {"name": "engines", "persistentVolumeClaim": {"claimName": engine_cache_pvc}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "engines", "mountPath": ENGINE_CACHE_MOUNT},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}]
    if spec.source.pvc is not None:
        volumes.append(
            {
                "name": "voice",
                "persistentVolumeClaim": {
                    "claimName": spec.source.pvc.claim_name,
                    "readOnly": True,
                },
            }
        )
        mounts.append({"name": "voice", "mountPath": VOICE_MOUNT, "readOnly": True})
    else:
        # The download is checked against this digest before anything is built from it.
        env.append({"name": "VOXFLEET_VOICE_SHA256", "value": spec.source.sha256})
    command = [
        "voxfleet",
        "build-engines",
        "--voice",
        voice_argument(spec),
        "--plan",
        serving_plan(voice, spec, pool, engine_key).to_json(),
        "--cache",
        ENGINE_CACHE_MOUNT,
        # Pods load the voice from /engines/<engine key>/ (the plan's engine_dir).
        "--publish-as",
        engine_key,
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata(engine_job_name(voice, engine_key), namespace, "engine-build", labels),
        "spec": {
            "backoffLimit": BUILD_BACKOFF_LIMIT,
            "activeDeadlineSeconds": BUILD_DEADLINE_SECONDS,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "securityContext": pod_security_context(),
                    "nodeSelector": pool_node_selector(pool),
                    "tolerations": [dict(t) for t in pool.tolerations],
                    "containers": [
                        {
                            "name": "build-engines",
                            "image": pool.triton_image,
                            "command": command,
                            "env": env,
                            "resources": pool_resources(pool),
                            "securityContext": container_security_context(),
                            "volumeMounts": mounts,
                        }
                    ],
                    "volumes": volumes,
                },
            },
        },
    }
