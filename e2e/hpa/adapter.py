"""The real prometheus-adapter, serving the chart's rules as `custom.metrics.k8s.io`.

`make setup` builds it from `sigs.k8s.io/prometheus-adapter` (scripts/build-control-plane.sh).
`MetricsAdapter` runs it beside a local cluster as its chart would run it in one:
- its configuration is the chart's adapter rules (`config.yaml` of the ConfigMap the chart
  renders, `adapter_config_from_chart`), its Prometheus the suite's (Debian's);
- it logs in as `system:voxfleet-e2e-prometheus-adapter` (a certificate of the cluster CA)
  with what the prometheus-adapter chart grants: read access to what the rules describe,
  `system:auth-delegator` (TokenReview, SubjectAccessReview) and the
  `extension-apiserver-authentication-reader` Role in kube-system (the front-proxy CA
  through which it trusts the API server's forwarded requests);
- it serves on a loopback port with a certificate for `prometheus-adapter.kube-system.svc`;
  the APIServices `v1beta1` and `v1beta2.custom.metrics.k8s.io` point at the Service
  `kube-system/prometheus-adapter`, of type ExternalName (`localhost`), which the API
  server's aggregation layer resolves and dials itself: kube-proxy is not in the path.

So the real HPA controller reads the chart's metrics as in a cluster: its request goes to
the kube-apiserver, through the aggregation layer, to the adapter, which queries
Prometheus. `stop()` removes the APIServices first (an unavailable aggregated API would
hold up namespace deletion and garbage collection), then the process.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml
from cluster.controlplane import ControlPlane
from cluster.processes import ControlPlaneError, Supervised, free_port
from e2e_support import Kubectl

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "voxfleet"
BINARY = ROOT / ".tools" / "bin" / "prometheus-adapter"
USER = "system:voxfleet-e2e-prometheus-adapter"
SERVICE, SERVICE_NAMESPACE = "prometheus-adapter", "kube-system"
VERSIONS = ("v1beta1", "v1beta2")


def adapter_config_from_chart(helm: str, *helm_args: str, chart: Path = CHART) -> str:
    """The adapter configuration the chart renders into its rules ConfigMap."""
    result = subprocess.run(
        [helm, "template", "voxfleet", str(chart), *helm_args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if result.returncode != 0:
        raise RuntimeError(f"helm template failed: {result.stderr}")
    for document in yaml.safe_load_all(result.stdout):
        if document and document.get("kind") == "ConfigMap":
            config = (document.get("data") or {}).get("config.yaml")
            if config:
                return str(config)
    raise RuntimeError("the chart rendered no adapter rules ConfigMap")


def _rbac(user: str) -> list[dict[str, Any]]:
    subject = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]
    rbac = "rbac.authorization.k8s.io/v1"
    return [
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": "voxfleet-e2e-metrics-reader"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "voxfleet-e2e-metrics-reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "voxfleet-e2e-metrics-reader",
            },
            "subjects": subject,
        },
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "voxfleet-e2e-metrics-auth-delegator"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:auth-delegator",
            },
            "subjects": subject,
        },
        {
            "apiVersion": rbac,
            "kind": "RoleBinding",
            "metadata": {"name": "voxfleet-e2e-metrics-auth-reader", "namespace": "kube-system"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "extension-apiserver-authentication-reader",
            },
            "subjects": subject,
        },
    ]


class MetricsAdapter:
    def __init__(
        self,
        plane: ControlPlane,
        kubectl: Kubectl,
        prometheus_url: str,
        config: str,
        workdir: Path,
        relist_interval: str = "5s",
    ) -> None:
        self.plane = plane
        # kube-system: where the adapter's Service and Role binding live (APIServices and
        # cluster roles have no namespace).
        self.kubectl = Kubectl(kubectl.kubeconfig, SERVICE_NAMESPACE)
        self.prometheus_url = prometheus_url
        self.config = config
        self.workdir = workdir
        self.relist_interval = relist_interval
        self.port = free_port()
        self.process: Supervised | None = None

    def start(self) -> MetricsAdapter:
        if not BINARY.exists():
            raise ControlPlaneError(
                f"{BINARY} not found: run `make setup`, which builds it "
                "from sigs.k8s.io/prometheus-adapter"
            )
        assert self.plane.pki is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "config.yaml"
        config.write_text(self.config)
        kubeconfig = self.plane.kubeconfig(USER)
        serving = self.plane.pki.cluster.issue(
            "prometheus-adapter-serving",
            SERVICE,
            server_names=(f"{SERVICE}.{SERVICE_NAMESPACE}.svc", "localhost", "127.0.0.1"),
            client=False,
        )
        self.kubectl.apply(_rbac(USER))
        self.process = Supervised(
            "prometheus-adapter",
            [
                str(BINARY),
                f"--config={config}",
                f"--prometheus-url={self.prometheus_url}",
                f"--metrics-relist-interval={self.relist_interval}",
                f"--lister-kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--tls-cert-file={serving.cert}",
                f"--tls-private-key-file={serving.key}",
                "--v=2",
            ],
            self.workdir / "prometheus-adapter.log",
            {"--secure-port": self.port},
        )
        self.process.start()
        ca = base64.b64encode(self.plane.pki.cluster.cert.read_bytes()).decode()
        self.kubectl.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Service",
                    "metadata": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
                    "spec": {
                        "type": "ExternalName",
                        "externalName": "localhost",
                        "ports": [{"name": "https", "port": self.port}],
                    },
                },
                *(
                    {
                        "apiVersion": "apiregistration.k8s.io/v1",
                        "kind": "APIService",
                        "metadata": {"name": f"{version}.custom.metrics.k8s.io"},
                        "spec": {
                            "group": "custom.metrics.k8s.io",
                            "version": version,
                            "service": {
                                "name": SERVICE,
                                "namespace": SERVICE_NAMESPACE,
                                "port": self.port,
                            },
                            "caBundle": ca,
                            "groupPriorityMinimum": 100,
                            "versionPriority": 100 + index,
                        },
                    }
                    for index, version in enumerate(VERSIONS)
                ),
            ]
        )
        deadline = time.monotonic() + 120
        while not all(self._available(v) for v in VERSIONS):
            self.process.check()
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    "the custom metrics APIService did not become Available in 120 s: "
                    + json.dumps(self.kubectl.get("apiservice", "v1beta2.custom.metrics.k8s.io"))[
                        :1500
                    ]
                )
            time.sleep(0.5)
        return self

    def _available(self, version: str) -> bool:
        service = self.kubectl.get("apiservice", f"{version}.custom.metrics.k8s.io") or {}
        return any(
            c.get("type") == "Available" and c.get("status") == "True"
            for c in (service.get("status") or {}).get("conditions") or []
        )

    def check(self) -> None:
        if self.process is not None:
            self.process.check()

    def stop(self) -> None:
        for version in VERSIONS:
            self.kubectl.run(
                "delete",
                "apiservice",
                f"{version}.custom.metrics.k8s.io",
                "--ignore-not-found",
                check=False,
            )
        if self.process is not None:
            self.process.stop()

    def __enter__(self) -> MetricsAdapter:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def metric(self, namespace: str, resource: str, name: str, metric: str) -> float | None:
        """A metric of one object as the HPA controller reads it, through the API server
        (`resource`: e.g. "pods" or "ttsvoices.voxfleet.io"); None when there is none."""
        path = (
            f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/{resource}/{name}/{metric}"
        )
        result = self.kubectl.run("get", "--raw", path, check=False)
        if result.returncode != 0:
            return None
        items = json.loads(result.stdout).get("items") or []
        return quantity(items[0]["value"]) if items else None


def quantity(text: str) -> float:
    """A Kubernetes quantity as the adapter writes values ("250m", "3", "1500u")."""
    units = {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}
    if text and text[-1] in units:
        return float(text[:-1]) * units[text[-1]]
    return float(text)
