"""One installed voxfleet for the whole suite: a cluster, the chart, the operator running.

`local_installation()` builds it here: the real control plane and a real node (e2e/cluster/:
kubelet, containerd and runc, kube-proxy, CoreDNS) running the images `make images` built, and
the chart installed with `helm install` as a user would, the operator running as the chart's
own Deployment, from its image, under its own ServiceAccount and RBAC.
`kind_installation()` installs the same chart with `helm install` on a kind cluster that
scripts/e2e-kind.sh made and loaded the images into. Scenarios see only `Installation`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e_support import (
    CHART,
    HEALTH_CHECKS,
    KUBECONFIG_ENV,
    NAMESPACE,
    RELEASE,
    VALUES,
    Helm,
    Kubectl,
    condition,
    eventually,
    parse_endpoint,
    port_forward,
)

OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
# The controller manager's HPA period on the local cluster (Kubernetes' default: 15 s).
HPA_SYNC_PERIOD_S = 5.0


@dataclass
class Installation:
    """What the scenarios may do to the installed product."""

    kubectl: Kubectl
    # A Service endpoint ("svc.ns.svc:port") -> a "host:port" this process can stream to.
    reach_service: Callable[[str], contextlib.AbstractContextManager[str]]
    # (pod name, container port) -> a "host:port" of that pod.
    reach_pod: Callable[[str, int], contextlib.AbstractContextManager[str]]
    # Kill every process named `name` in a pod's containers, as a crash would.
    kill_process: Callable[[str, str], int]
    # Logs of a pod's container (for failure messages).
    logs: Callable[[str, str], str]
    # Helm, for the release the chart was installed as.
    helm: Helm | None = None
    # Raises if the cluster underneath failed (a control-plane process died).
    check: Callable[[], None] = lambda: None
    # The local cluster (e2e/cluster.LocalCluster); None on kind.
    cluster: Any = None
    timings: dict[str, float] = field(default_factory=dict)

    def operator_ready(self) -> bool:
        deployments = self.kubectl.items("deployments", OPERATOR_SELECTOR)
        assert len(deployments) == 1, "the chart installs one operator Deployment"
        return bool((deployments[0].get("status") or {}).get("availableReplicas"))


def _fill_voices_manifests() -> list[dict[str, Any]]:
    """A claim holding the joe voice, filled by a Job that copies the package's files."""
    script = (
        "import shutil, pathlib\n"
        "from engines.text.voice import load_voice\n"
        "voice = load_voice('joe')\n"
        "target = pathlib.Path('/voices/joe')\n"
        "target.mkdir(parents=True, exist_ok=True)\n"
        "shutil.copy(voice.model_path, target / voice.model_path.name)\n"
        "shutil.copy(voice.config_path, target / voice.config_path.name)\n"
        "print(sorted(p.name for p in target.iterdir()))\n"
    )
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "voices"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "fill-voices"},
            "spec": {
                "backoffLimit": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "copy",
                                "image": _triton_image(),
                                "command": ["python", "-c", script],
                                "volumeMounts": [{"name": "voices", "mountPath": "/voices"}],
                            }
                        ],
                        "volumes": [
                            {"name": "voices", "persistentVolumeClaim": {"claimName": "voices"}}
                        ],
                    }
                },
            },
        },
    ]


def _triton_image() -> str:
    """The image the pool pods run (kind: the CPU Triton image scripts/e2e-kind.sh loads)."""
    return os.environ.get("VOXFLEET_E2E_TRITON_IMAGE", "voxfleet-triton-cpu:e2e")


def fill_voices(kubectl: Kubectl) -> None:
    kubectl.apply(_fill_voices_manifests())

    def copied() -> bool:
        job = kubectl.get("job", "fill-voices")
        failed = condition(job, "Failed")
        assert not (failed and failed.get("status") == "True"), f"fill-voices failed: {failed}"
        complete = condition(job, "Complete")
        return bool(complete and complete.get("status") == "True")

    eventually(copied, timeout=120, what="the voices claim is filled")


def _wait_for_operator(installation: Installation) -> None:
    eventually(
        installation.operator_ready,
        timeout=120,
        interval=0.5,
        what="the operator Deployment is available",
    )


def helm_set_args() -> list[str]:
    """`--set` arguments for the install (kind: the images scripts/e2e-kind.sh loaded)."""
    given = os.environ.get("VOXFLEET_E2E_HELM_SET", "")
    return [arg for item in given.split(",") if item for arg in ("--set", item)]


@contextlib.contextmanager
def kind_installation() -> Iterator[Installation]:
    """A kind cluster (scripts/e2e-kind.sh made it and loaded the images): the chart is
    installed with `helm install` here too, so the scenarios are the same."""
    kubectl = Kubectl(Path(os.environ[KUBECONFIG_ENV]), NAMESPACE)
    helm = Helm(kubectl.kubeconfig, NAMESPACE)
    helm.run(
        "install",
        RELEASE,
        str(CHART),
        "--create-namespace",
        "-f",
        str(VALUES),
        *helm_set_args(),
        "--wait",
        "--timeout",
        "5m",
        timeout=400,
    )

    def kill_process(pod: str, name: str) -> int:
        script = (
            "import os, signal\n"
            "n = 0\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            f"        if open(f'/proc/{{pid}}/comm').read().strip() == {name!r}:\n"
            "            os.kill(int(pid), signal.SIGKILL); n += 1\n"
            "    except OSError:\n"
            "        pass\n"
            "print(n)\n"
        )
        result = kubectl.run("exec", pod, "-c", "triton", "--", "python", "-c", script)
        return int(result.stdout.strip() or 0)

    def reach_service(endpoint: str) -> contextlib.AbstractContextManager[str]:
        service, _, port = parse_endpoint(endpoint)
        return port_forward(kubectl, f"service/{service}", port)

    def reach_pod(pod: str, port: int) -> contextlib.AbstractContextManager[str]:
        return port_forward(kubectl, f"pod/{pod}", port)

    def logs(pod: str, container: str) -> str:
        return kubectl.run("logs", pod, "-c", container, check=False).stdout

    installation = Installation(
        kubectl,
        reach_service,
        reach_pod,
        kill_process,
        logs,
        helm=Helm(kubectl.kubeconfig, NAMESPACE),
    )
    _wait_for_operator(installation)
    fill_voices(kubectl)
    yield installation


@contextlib.contextmanager
def local_installation(
    workdir: Path, hpa_sync_period_s: float = HPA_SYNC_PERIOD_S
) -> Iterator[Installation]:
    """The control plane and a node here, and the chart installed with `helm install` as a
    user installs it."""
    from cluster import LocalCluster

    cluster = LocalCluster(workdir / "cluster", hpa_sync_period_s=hpa_sync_period_s)
    cluster.start()
    HEALTH_CHECKS.append(cluster.check)
    try:
        kubectl = Kubectl(cluster.kubeconfig, NAMESPACE)
        helm = Helm(cluster.kubeconfig, NAMESPACE)
        started = time.monotonic()
        helm.run(
            "install",
            RELEASE,
            str(CHART),
            "--create-namespace",
            "-f",
            str(VALUES),
            *helm_set_args(),
        )

        def reach_service(endpoint: str) -> contextlib.AbstractContextManager[str]:
            return contextlib.nullcontext(cluster.resolve(endpoint))

        def reach_pod(pod: str, port: int) -> contextlib.AbstractContextManager[str]:
            obj = kubectl.get("pod", pod)
            return contextlib.nullcontext(f"{obj['status']['podIP']}:{port}")

        def kill_process(pod: str, name: str) -> int:
            killed = 0
            for pid in cluster.pod_processes(NAMESPACE, pod):
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() == name:
                        os.kill(pid, 9)
                        killed += 1
                except OSError:
                    continue
            return killed

        installation = Installation(
            kubectl,
            reach_service,
            reach_pod,
            kill_process,
            cluster.logs,
            helm=helm,
            check=cluster.check,
            cluster=cluster,
        )
        try:
            _wait_for_operator(installation)
        except AssertionError:
            pods = kubectl.items("pods", OPERATOR_SELECTOR)
            logs = "".join(cluster.logs(p["metadata"]["name"], "operator")[-3000:] for p in pods)
            raise AssertionError(f"the operator did not start; its logs:\n{logs}") from None
        installation.timings["install_s"] = time.monotonic() - started
        fill_voices(kubectl)
        yield installation
    finally:
        with contextlib.suppress(ValueError):
            HEALTH_CHECKS.remove(cluster.check)
        cluster.stop()


def describe(kubectl: Kubectl, *objects: str) -> str:
    """A short dump of objects for failure messages."""
    out = []
    for item in objects:
        obj = kubectl.get(*item.split("/"))
        out.append(f"{item}: {json.dumps((obj or {}).get('status'), indent=1)[:1500]}")
    return "\n".join(out)
