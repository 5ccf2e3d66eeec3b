"""The real `kubectl` (from .tools) against the e2e API emulator, as a user drives a cluster."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from e2e.cluster.apiserver import ServedApi, serve_api

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "voxfleet"
JOE = ROOT / "manifests" / "examples" / "joe.yaml"
CPU_VALUES = "defaultPool: cpu\npools:\n  - name: cpu\n    maxPods: 4\n"

pytestmark = pytest.mark.skipif(
    not (shutil.which("kubectl") and shutil.which("helm")),
    reason="kubectl and helm come with `make setup` (.tools/bin on PATH)",
)


class Kubectl:
    def __init__(self, api: ServedApi) -> None:
        self.api = api
        self.env = dict(os.environ, KUBECONFIG=str(api.kubeconfig))

    async def run(self, *args: str, stdin: str | None = None, ok: bool = True) -> tuple[str, str]:
        process = await asyncio.create_subprocess_exec(
            "kubectl",
            *args,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(
            process.communicate(stdin.encode() if stdin is not None else None), 60
        )
        if ok:
            assert process.returncode == 0, f"kubectl {' '.join(args)}: {err.decode()}"
        else:
            assert process.returncode != 0, f"kubectl {' '.join(args)} succeeded: {out.decode()}"
        return out.decode(), err.decode()

    async def get_json(self, *args: str) -> Any:
        out, _ = await self.run("get", *args, "-o", "json")
        return json.loads(out)


@pytest.fixture()
async def kubectl(tmp_path: Path) -> AsyncIterator[Kubectl]:
    async with serve_api(tmp_path) as api:
        yield Kubectl(api)


async def helm_template(tmp_path: Path) -> str:
    values = tmp_path / "values.yaml"
    values.write_text(CPU_VALUES)
    process = await asyncio.create_subprocess_exec(
        "helm", "template", "vf", str(CHART), "--namespace", "default", "--include-crds",
        "--skip-tests", "-f", str(values),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def test_the_chart_applies_and_every_object_reads_back(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    rendered = await helm_template(tmp_path)
    out, _ = await kubectl.run("apply", "-f", "-", stdin=rendered)
    assert "deployment.apps/vf-voxfleet created" in out
    assert "customresourcedefinition.apiextensions.k8s.io/ttsvoices.voxfleet.io created" in out
    # Applying the same objects again changes nothing.
    again, _ = await kubectl.run("apply", "-f", "-", stdin=rendered)
    assert "created" not in again and "configured" not in again, again
    pools = await kubectl.get_json("configmap", "vf-voxfleet-pools")
    assert pools["kind"] == "ConfigMap" and "cpu" in json.dumps(pools["data"])
    raw, _ = await kubectl.run("get", "--raw", "/apis/rbac.authorization.k8s.io/v1/clusterroles")
    listing = json.loads(raw)
    assert listing["kind"] == "ClusterRoleList"
    assert listing["apiVersion"] == "rbac.authorization.k8s.io/v1"
    assert {i["metadata"]["name"] for i in listing["items"]} >= {"vf-voxfleet"}


async def test_get_ttsv_shows_the_crd_printer_columns(kubectl: Kubectl, tmp_path: Path) -> None:
    await kubectl.run("apply", "-f", str(CHART / "crds"))
    out, err = await kubectl.run("apply", "-f", str(JOE))
    assert "ttsvoice.voxfleet.io/joe created" in out
    # Status is the operator's to write, through the status subresource.
    await kubectl.run(
        "patch", "ttsv", "joe", "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": {"phase": "Ready", "pool": "cpu", "endpoint": "joe.default.svc:8001",
                               "conditions": [{"type": "Available", "status": "True"}]}}),
    )
    out, err = await kubectl.run("get", "ttsv")
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "PHASE", "POOL", "ENDPOINT", "READY", "AGE"]
    assert row.split()[:5] == ["joe", "Ready", "cpu", "joe.default.svc:8001", "True"]
    assert "could also match" not in err  # the status subresource is no resource of its own
    voice = await kubectl.get_json("ttsv", "joe")
    assert voice["metadata"]["generation"] == 1  # a status write is no spec change


async def test_apply_validates_against_the_schemas(kubectl: Kubectl, tmp_path: Path) -> None:
    rendered = await helm_template(tmp_path)
    await kubectl.run("apply", "-f", "-", stdin=rendered)
    _, err = await kubectl.run(
        "apply", "-f", "-", stdin=JOE.read_text().replace("sha256:", "sha265:"), ok=False
    )
    assert 'unknown field "spec.source.sha265"' in err
    _, err = await kubectl.run(
        "apply", "-f", "-", stdin=rendered.replace("replicas: 1", "replicas: one"), ok=False
    )
    assert "spec.replicas" in err and "integer" in err
    _, err = await kubectl.run(
        "apply", "-f", "-",
        stdin=rendered.replace("enableServiceLinks: false", "enableServiceLink: false"), ok=False,
    )
    assert "enableServiceLink" in err
    deployment = await kubectl.get_json("deployment", "vf-voxfleet")
    assert deployment["spec"]["replicas"] == 1  # nothing invalid was stored


async def test_scale_restart_and_reapply_change_the_deployment_as_on_a_cluster(
    kubectl: Kubectl, tmp_path: Path
) -> None:
    rendered = await helm_template(tmp_path)
    await kubectl.run("apply", "-f", "-", stdin=rendered)
    await kubectl.run("scale", "deployment", "vf-voxfleet", "--replicas=3")
    deployment = await kubectl.get_json("deployment", "vf-voxfleet")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["metadata"]["generation"] == 2
    out, _ = await kubectl.run("get", "deployment", "vf-voxfleet")
    assert out.split()[:4] == ["NAME", "READY", "UP-TO-DATE", "AVAILABLE"]
    assert out.splitlines()[1].split()[1] == "0/3"

    await kubectl.run("rollout", "restart", "deployment", "vf-voxfleet")
    template = (await kubectl.get_json("deployment", "vf-voxfleet"))["spec"]["template"]
    assert "kubectl.kubernetes.io/restartedAt" in template["metadata"]["annotations"]
    assert "checksum/pools" in template["metadata"]["annotations"]

    # A strategic merge patch from apply: a renamed variable replaces the old one, and the
    # other variables and containers stay as they were.
    before = (await kubectl.get_json("deployment", "vf-voxfleet"))["spec"]
    env_before = [e["name"] for e in before["template"]["spec"]["containers"][0]["env"]]
    assert env_before[-1] == "HOME"
    renamed = rendered.replace("name: HOME\n", "name: XDG_CACHE_HOME\n")
    await kubectl.run("apply", "-f", "-", stdin=renamed)
    spec = (await kubectl.get_json("deployment", "vf-voxfleet"))["spec"]
    env = [e["name"] for e in spec["template"]["spec"]["containers"][0]["env"]]
    assert env == [*env_before[:-1], "XDG_CACHE_HOME"]
    assert spec["template"]["spec"]["containers"][0]["command"] == ["voxfleet"]


async def test_scale_of_a_kind_without_the_subresource_is_refused(kubectl: Kubectl) -> None:
    await kubectl.run("apply", "-f", str(CHART / "crds"))
    await kubectl.run("apply", "-f", str(JOE))
    crd = await kubectl.get_json("crd", "ttsvoices.voxfleet.io")
    scale = crd["spec"]["versions"][0].get("subresources", {}).get("scale")
    if scale:
        await kubectl.run("scale", "ttsv", "joe", "--replicas=2")
        voice = await kubectl.get_json("ttsv", "joe")
        for part in scale["specReplicasPath"].strip(".").split("."):
            voice = voice[part]
        assert voice == 2
    else:
        _, err = await kubectl.run("scale", "ttsv", "joe", "--replicas=2", ok=False)
        assert "scale" in err


async def test_namespaces_are_a_resource_of_their_own(kubectl: Kubectl) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "speech"}}
    out, _ = await kubectl.run("apply", "-f", "-", stdin=json.dumps(namespace))
    assert "namespace/speech created" in out
    await kubectl.run("apply", "-n", "speech", "-f", str(CHART / "crds"))
    await kubectl.run("apply", "-n", "speech", "-f", str(JOE))
    listing = await kubectl.get_json("namespaces")
    assert [n["metadata"]["name"] for n in listing["items"]] == ["speech"]
    voice = await kubectl.get_json("ttsv", "joe", "-n", "speech")
    assert voice["metadata"]["namespace"] == "speech"
    await kubectl.run("delete", "namespace", "speech")
    assert (await kubectl.get_json("namespaces"))["items"] == []
    # Generators that send protobuf are refused with a reason, not a crash.
    _, err = await kubectl.run("create", "namespace", "other", ok=False)
    assert "protobuf bodies are not emulated" in err
