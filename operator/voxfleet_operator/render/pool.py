"""One pool in one namespace: the Triton Deployment and what scales and watches it.

The Deployment's pod template depends only on the pool, never on its voices, so adding or
removing a voice loads or unloads a model on running pods instead of rolling the pool.
"""

from __future__ import annotations

import math
from typing import Any

from voxfleet_operator.names import (
    GRPC_PORT,
    HEALTH_PORT,
    HTTP_PORT,
    METRICS_PORT,
    MPS_ENV,
    REPOSITORY_HEADER_KEY,
    REPOSITORY_KEY_SECRET,
    REPOSITORY_KEY_SECRET_KEY,
    SUPERVISOR_LIVE_PATH,
    SUPERVISOR_READY_PATH,
    pool_deployment_name,
    pool_metrics_service_name,
    pool_selector,
)
from voxfleet_operator.pool_plan import PoolPlan
from voxfleet_operator.pools import Pool
from voxfleet_operator.render.common import (
    container_security_context,
    metadata,
    pod_security_context,
    pool_node_selector,
    pool_resources,
)
from voxfleet_operator.voice_plan import ENGINE_CACHE_MOUNT

MODEL_REPOSITORY = "/models"
# Triton finishes in-flight streams for up to this long after SIGTERM; the pod's grace period
# covers the preStop pause (endpoints drop the pod first) plus this, plus a margin.
TRITON_EXIT_TIMEOUT_SECONDS = 30
PRESTOP_SECONDS = 5
TERMINATION_GRACE_SECONDS = PRESTOP_SECONDS + TRITON_EXIT_TIMEOUT_SECONDS + 15
# Adapter metrics the HPAs scale on (the chart's voxfleet.adapterRules; docs/autoscaling.md):
# per pod, its load (live streams over the real-time streams it holds by its own measurement)
# and the first-audio p95 from the stream model's histogram; per TTSVoice (the stream model's
# `model` label), the voice's streams over its pods' capacities, in pods, and its p95.
LOAD_METRIC = "voxfleet_load_ratio"
FIRST_AUDIO_METRIC = "voxfleet_first_audio_p95_seconds"
VOICE_LOAD_METRIC = "voxfleet_voice_load_pods"
VOICE_FIRST_AUDIO_METRIC = "voxfleet_voice_first_audio_p95_seconds"
KEY_ENV = "VOXFLEET_REPOSITORY_KEY"
TRITON_COMMAND = ["voxfleet", "triton"]


def voice_host_args(pool: Pool) -> list[str]:
    """The pod's voice host options (`voxfleet triton`, engines/commands/triton.py): the
    pool's GPU memory to place voices in, and onnxruntime's threads per call, the pod's CPU
    request in whole cores, rounded up (without it a CPU pod would run one thread per core of
    the node)."""
    return [
        f"--voice-host-memory-mib={pool.declared_gpu_memory_mib}",
        f"--voice-host-cpu-threads={cpu_cores(pool.cpu_request)}",
    ]


def cpu_cores(quantity: str) -> int:
    """Whole cores of a Kubernetes CPU quantity ("2", "1500m", "0.5"), rounded up, at least 1."""
    text = quantity.strip()
    cores = int(text[:-1]) / 1000 if text.endswith("m") else float(text)
    return max(1, math.ceil(cores))


def triton_args() -> list[str]:
    key = f"model-repository:{REPOSITORY_HEADER_KEY}=$({KEY_ENV})"
    return [
        f"--model-repository={MODEL_REPOSITORY}",
        "--model-control-mode=explicit",
        f"--grpc-restricted-protocol={key}",
        f"--http-restricted-api={key}",
        f"--grpc-port={GRPC_PORT}",
        f"--http-port={HTTP_PORT}",
        f"--metrics-port={METRICS_PORT}",
        # Ready means serving, whatever each model's state: a voice being unloaded while its
        # last streams finish must not take the pod, and every other voice on it, out of
        # their Services. Which voices a pod serves is its `serving.voxfleet.io/*` labels.
        "--strict-readiness=false",
        f"--exit-timeout-secs={TRITON_EXIT_TIMEOUT_SECONDS}",
        "--log-format=ISO8601",
    ]


def build_pool_deployment(pool: Pool, namespace: str, engine_cache_pvc: str) -> dict[str, Any]:
    selector = pool_selector(pool.name)
    probe_base = {"port": "http", "scheme": "HTTP"}
    # `voxfleet triton` supervises tritonserver: its readiness also fails while a voice is
    # being healed or the server drains (Triton's own stays 200 with a dead voice).
    health = {"port": "health", "scheme": "HTTP"}
    container = {
        "name": "triton",
        "image": pool.triton_image,
        # `voxfleet triton` runs the image's tritonserver with these arguments as they are.
        "command": TRITON_COMMAND,
        "args": [*voice_host_args(pool), *triton_args()],
        "env": [
            {
                "name": KEY_ENV,
                "valueFrom": {
                    "secretKeyRef": {
                        "name": REPOSITORY_KEY_SECRET,
                        "key": REPOSITORY_KEY_SECRET_KEY,
                    }
                },
            },
            {"name": "HOME", "value": "/tmp"},
            # The pool's backend processes share the GPU through an MPS daemon of the pod's.
            *([{"name": MPS_ENV, "value": "1"}] if pool.mps else []),
        ],
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "http", "containerPort": HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            {"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"},
        ],
        "startupProbe": {
            "httpGet": {"path": "/v2/health/live", **probe_base},
            "periodSeconds": 5,
            "failureThreshold": 120,
        },
        "livenessProbe": {
            "httpGet": {"path": SUPERVISOR_LIVE_PATH, **health},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        # Not ready while any loaded voice is not ready, is being healed, or the pod drains.
        "readinessProbe": {
            "httpGet": {"path": SUPERVISOR_READY_PATH, **health},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
        "resources": pool_resources(pool),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "engines", "mountPath": ENGINE_CACHE_MOUNT, "readOnly": True},
            {"name": "models", "mountPath": MODEL_REPOSITORY},
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "shm", "mountPath": "/dev/shm"},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(pool_deployment_name(pool.name), namespace, "triton", selector),
        # No `replicas`: the HPA owns the count, and a rendered number would fight it.
        "spec": {
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
            },
            "template": {
                "metadata": {"labels": selector},
                "spec": {
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "nodeSelector": pool_node_selector(pool),
                    "tolerations": [dict(t) for t in pool.tolerations],
                    "enableServiceLinks": False,
                    "containers": [container],
                    "volumes": [
                        {
                            "name": "engines",
                            "persistentVolumeClaim": {
                                "claimName": engine_cache_pvc,
                                "readOnly": True,
                            },
                        },
                        {"name": "models", "emptyDir": {}},
                        {"name": "tmp", "emptyDir": {}},
                        # The Python backend exchanges tensors with its stub through /dev/shm.
                        {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                    ],
                },
            },
        },
    }


def build_pool_metrics_service(pool: Pool, namespace: str) -> dict[str, Any]:
    selector = pool_selector(pool.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(pool_metrics_service_name(pool.name), namespace, "metrics", selector),
        "spec": {
            "clusterIP": "None",
            "selector": selector,
            # Triton's metrics (the voices'), and the pod's memory on its health port.
            "ports": [
                {"name": "metrics", "port": METRICS_PORT, "targetPort": "metrics"},
                {"name": "health", "port": HEALTH_PORT, "targetPort": "health"},
            ],
        },
    }


def milli_quantity(thousandths: int) -> str:
    """A Kubernetes quantity in thousandths: 800 ms as `800m` seconds, 70 % as `700m`."""
    return f"{thousandths}m"


def load_target(percent: int) -> str:
    """A load target in percent as the quantity of a ratio (70 → `700m`)."""
    return milli_quantity(percent * 10)


def build_pool_hpa(plan: PoolPlan) -> dict[str, Any]:
    """The pool's HPA: its pods' load and first-audio p95, and never fewer pods than its
    most-replicated voice is scaled to (`kubectl scale ttsv` or a per-voice HPA).

    The load (`voxfleet_load_ratio`) rises with overload and falls with idleness: the pods'
    live streams over their count times the real-time streams each measured it holds (the
    adapter gives each pod this pool-wide value), capped near 1 because a full pod refuses
    new streams. Against `targetLoadPercent` it proposes ceil(live streams / (mean capacity x
    target)) pods, so an idle pool scales in and a full one out.
    The p95 guards the first-audio SLO should a pod's measure be too hopeful."""
    name = pool_deployment_name(plan.pool.name)
    voice_pods = max((v.spec.replicas or 0 for v in plan.voices), default=0)
    min_replicas = min(max(plan.min_replicas, voice_pods), plan.max_replicas)

    def pods_metric(metric: str, target: str) -> dict[str, Any]:
        return {
            "type": "Pods",
            "pods": {
                "metric": {"name": metric},
                "target": {"type": "AverageValue", "averageValue": target},
            },
        }

    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(name, plan.namespace, "autoscaler", pool_selector(plan.pool.name)),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": min_replicas,
            "maxReplicas": plan.max_replicas,
            "metrics": [
                pods_metric(LOAD_METRIC, load_target(plan.target_load_percent)),
                pods_metric(FIRST_AUDIO_METRIC, milli_quantity(plan.target_first_audio_ms)),
            ],
            # Scale up as soon as the (window-averaged) load says so, at most 2 pods a minute;
            # scale in after five quiet minutes, 1 pod every 2 minutes: a new GPU pod takes a
            # while to load its voices, so do not flap pods away.
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "policies": [{"type": "Pods", "value": 2, "periodSeconds": 60}],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": 300,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }


def build_pool_pdb(pool: Pool, namespace: str) -> dict[str, Any]:
    selector = pool_selector(pool.name)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(pool_deployment_name(pool.name), namespace, "triton", selector),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector}},
    }


def build_pool_service_monitor(pool: Pool, namespace: str) -> dict[str, Any]:
    selector = pool_selector(pool.name)
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(pool_deployment_name(pool.name), namespace, "metrics", selector),
        "spec": {
            "selector": {"matchLabels": {**selector, "app.kubernetes.io/component": "metrics"}},
            "namespaceSelector": {"matchNames": [namespace]},
            "endpoints": [
                {"port": "metrics", "interval": "15s", "path": "/metrics"},
                {"port": "health", "interval": "15s", "path": "/metrics"},
            ],
        },
    }
