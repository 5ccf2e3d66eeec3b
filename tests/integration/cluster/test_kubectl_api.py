"""The chart and the CRD against a real kube-apiserver, driven with the real `kubectl`.

One API server for the module (e2e/cluster/controlplane.py, no controllers): what is checked
is what the server itself accepts, refuses, defaults and prints, as a user meets it.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster.controlplane import ControlPlane, missing_binaries

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "voxfleet"
JOE = ROOT / "manifests" / "examples" / "joe.yaml"
CPU_VALUES = "defaultPool: cpu\npools:\n  - name: cpu\n    maxPods: 4\n"

pytestmark = pytest.mark.skipif(
    not (shutil.which("kubectl") and shutil.which("helm")) or bool(missing_binaries()),
    reason="kubectl, helm and the control plane come with `make setup` (.tools/bin on PATH)",
)
_namespaces = itertools.count()


class Kubectl:
    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.env = dict(os.environ, KUBECONFIG=str(kubeconfig))
        self.namespace = namespace

    def run(self, *args: str, stdin: str | None = None, ok: bool = True) -> tuple[str, str]:
        result = subprocess.run(
            ["kubectl", "-n", self.namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        if ok:
            assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        else:
            assert result.returncode != 0, f"kubectl {' '.join(args)} succeeded: {result.stdout}"
        return result.stdout, result.stderr

    def get_json(self, *args: str) -> Any:
        out, _ = self.run("get", *args, "-o", "json")
        return json.loads(out)


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(tmp_path_factory.mktemp("api"), controllers=(), scheduler=False) as running:
        Kubectl(running.admin_kubeconfig, "default").run("apply", "-f", str(CHART / "crds"))
        Kubectl(running.admin_kubeconfig, "default").run(
            "wait", "--for=condition=Established", "crd/ttsvoices.voxfleet.io"
        )
        yield running


@pytest.fixture()
def kubectl(plane: ControlPlane) -> Kubectl:
    """kubectl as cluster-admin, in a namespace of the test's own."""
    namespace = f"test-{next(_namespaces)}"
    admin = Kubectl(plane.admin_kubeconfig, namespace)
    admin.run("create", "namespace", namespace)
    return admin


def helm_template(namespace: str, tmp_path: Path) -> str:
    values = tmp_path / "values.yaml"
    values.write_text(CPU_VALUES)
    return subprocess.run(
        [
            "helm",
            "template",
            "vf",
            str(CHART),
            "--namespace",
            namespace,
            "--skip-tests",
            "-f",
            str(values),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def test_the_chart_applies_and_reapplies_unchanged(kubectl: Kubectl, tmp_path: Path) -> None:
    rendered = helm_template(kubectl.namespace, tmp_path)
    out, _ = kubectl.run("apply", "-f", "-", stdin=rendered)
    assert "deployment.apps/vf-voxfleet created" in out
    assert "clusterrole.rbac.authorization.k8s.io/vf-voxfleet created" in out
    # Applying the same objects again changes nothing (defaulted fields included).
    again, _ = kubectl.run("apply", "-f", "-", stdin=rendered)
    assert "created" not in again and "configured" not in again, again
    pools = kubectl.get_json("configmap", "vf-voxfleet-pools")
    assert "cpu" in json.dumps(pools["data"])


def test_get_ttsv_shows_the_crd_printer_columns(kubectl: Kubectl) -> None:
    out, _ = kubectl.run("apply", "-f", str(JOE))
    assert "ttsvoice.voxfleet.io/joe created" in out
    # Status is the operator's to write, through the status subresource.
    kubectl.run(
        "patch",
        "ttsv",
        "joe",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps(
            {
                "status": {
                    "phase": "Ready",
                    "pool": "cpu",
                    "endpoint": "joe.default.svc:8001",
                    "readyPods": 2,
                    "liveStreams": 7,
                    "firstAudioP95Ms": 180,
                    "refusedStreams": 3,
                    "conditions": [
                        {
                            "type": "Available",
                            "status": "True",
                            "reason": "Serving",
                            "message": "",
                            "lastTransitionTime": "2026-01-01T00:00:00Z",
                        }
                    ],
                }
            }
        ),
    )
    out, _ = kubectl.run("get", "ttsv")
    header, row = out.splitlines()[:2]
    assert header.split() == [
        "NAME",
        "PHASE",
        "POOL",
        "ENDPOINT",
        "READY",
        "PODS",
        "STREAMS",
        "P95-MS",
        "REFUSED-5M",
        "AGE",
    ]
    # The load columns show what the operator read from Prometheus.
    assert row.split()[:9] == [
        "joe",
        "Ready",
        "cpu",
        "joe.default.svc:8001",
        "True",
        "2",
        "7",
        "180",
        "3",
    ]
    voice = kubectl.get_json("ttsv", "joe")
    assert voice["metadata"]["generation"] == 1  # a status write is no spec change


def test_the_crd_fills_defaults_and_its_rules_refuse_with_their_messages(
    kubectl: Kubectl,
) -> None:
    """The real server applies the CRD's defaults and CEL rules (the CRD was once refused:
    a `{}` default failed its own object's rules)."""
    kubectl.run("apply", "-f", str(JOE))
    spec = kubectl.get_json("ttsv", "joe")["spec"]
    # Blocks left out are filled with every field's default, nested ones included.
    assert spec["autoscaling"]["minReplicas"] == 1
    assert spec["autoscaling"]["maxReplicas"] >= spec["autoscaling"]["minReplicas"]
    assert spec["streaming"]["firstWindowFrames"] <= spec["streaming"]["steadyWindowFrames"]
    base = yaml.safe_load(JOE.read_text())

    def refused(name: str, **spec_changes: Any) -> str:
        voice = json.loads(json.dumps(base))
        voice["metadata"]["name"] = name
        voice["spec"].update(spec_changes)
        _, err = kubectl.run("apply", "-f", "-", stdin=json.dumps(voice), ok=False)
        assert kubectl.run("get", "ttsv", name, ok=False)  # nothing was stored
        return err

    err = refused("small", autoscaling={"minReplicas": 5, "maxReplicas": 2})
    assert "autoscaling.minReplicas must not exceed autoscaling.maxReplicas" in err
    err = refused("windows", streaming={"firstWindowFrames": 64, "steadyWindowFrames": 16})
    assert "streaming.firstWindowFrames must not exceed streaming.steadyWindowFrames" in err
    err = refused("alone", autoscaling={"perVoice": True})
    assert "autoscaling.perVoice needs spec.replicas" in err
    err = refused("a" * 60)
    assert "metadata.name must be a DNS label of at most" in err


def test_apply_validates_against_the_schemas(kubectl: Kubectl, tmp_path: Path) -> None:
    _, err = kubectl.run(
        "apply", "-f", "-", stdin=JOE.read_text().replace("sha256:", "sha265:"), ok=False
    )
    assert 'unknown field "spec.source.sha265"' in err
    rendered = helm_template(kubectl.namespace, tmp_path)
    _, err = kubectl.run(
        "apply", "-f", "-", stdin=rendered.replace("replicas: 1", "replicas: one"), ok=False
    )
    assert "replicas" in err
    assert not kubectl.get_json("deployments")["items"]  # nothing invalid was stored


def test_scale_of_a_voice_sets_its_spec_replicas(kubectl: Kubectl) -> None:
    kubectl.run("apply", "-f", str(JOE))
    kubectl.run("scale", "ttsv", "joe", "--replicas=2")
    assert kubectl.get_json("ttsv", "joe")["spec"]["replicas"] == 2
