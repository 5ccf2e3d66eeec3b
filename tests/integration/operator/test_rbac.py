"""The operator under the chart's own RBAC, as its ServiceAccount, on a real API server.

Everything the chart grants is enough for a voice's children; a verb taken away (creating
Services) is a Failed voice that says which verb the server refused, not a quiet retry loop.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from operator_harness import NAMESPACE, REAL_CLUSTER, ROOT, Api, eventually, running_operator
from test_operator import VOICES, condition, status_of, voice

pytestmark = [
    pytest.mark.kube,
    pytest.mark.skipif(REAL_CLUSTER, reason="installs the chart's RBAC on the tests' cluster"),
    pytest.mark.skipif(shutil.which("helm") is None, reason="needs helm (make setup)"),
]
RELEASE = "voxfleet"


def chart_rbac() -> list[dict[str, Any]]:
    """The chart's ServiceAccount, ClusterRoles and bindings, as `helm template` renders them."""
    rendered = subprocess.run(
        ["helm", "template", RELEASE, str(ROOT / "charts" / "voxfleet"), "-n", NAMESPACE],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    kinds = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
    return [d for d in yaml.safe_load_all(rendered) if d and d["kind"] in kinds]


async def operator_kubeconfig(api: Api, path: Path, account: str) -> Path:
    """A kubeconfig that logs in with a token of `account`, straight to the API server."""
    answer = await api.call(
        "POST",
        f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600},
        },
    )
    configuration = api.kube.api.configuration
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {
                        "name": "test",
                        "cluster": {
                            "server": configuration.host,
                            "certificate-authority": configuration.ssl_ca_cert,
                        },
                    }
                ],
                "users": [{"name": account, "user": {"token": answer["status"]["token"]}}],
                "contexts": [{"name": "test", "context": {"cluster": "test", "user": account}}],
                "current-context": "test",
            }
        )
    )
    return path


async def test_a_verb_the_chart_no_longer_grants_fails_the_voice_with_the_reason(
    api: Api, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = chart_rbac()
    account = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    for obj in objects:
        plural = {
            "ServiceAccount": "serviceaccounts",
            "ClusterRole": "clusterroles",
            "ClusterRoleBinding": "clusterrolebindings",
        }[obj["kind"]]
        if obj["kind"] == "ClusterRole" and any(
            "ttsvoices" in rule.get("resources", []) for rule in obj["rules"]
        ):
            for rule in obj["rules"]:
                if rule.get("resources") == ["services"]:
                    rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
        path = (
            f"/api/v1/namespaces/{NAMESPACE}/{plural}"
            if plural == "serviceaccounts"
            else f"/apis/rbac.authorization.k8s.io/v1/{plural}"
        )
        await api.call("POST", path, obj)
    monkeypatch.setenv(
        "KUBECONFIG", str(await operator_kubeconfig(api, tmp_path / "kubeconfig", account))
    )
    try:
        async with running_operator(tmp_path, resync_seconds=0.5):
            await api.create(*VOICES, voice("joe"))

            async def refused() -> dict[str, Any] | None:
                status = await status_of(api, "joe")
                available = condition(status, "Available")
                return status if available.get("reason") == "Forbidden" else None

            status = await eventually(refused, timeout=20)
            await asyncio.sleep(2.0)  # four drift passes, each refused as well
            assert await status_of(api, "joe") == status, "the refusal flaps"
    finally:
        for obj in objects:
            name = obj["metadata"]["name"]
            if obj["kind"] == "ServiceAccount":
                await api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{name}")
            else:
                plural = "clusterroles" if obj["kind"] == "ClusterRole" else "clusterrolebindings"
                await api.call("DELETE", f"/apis/rbac.authorization.k8s.io/v1/{plural}/{name}")
    message = condition(status, "Available")["message"]
    assert status["phase"] == "Failed"
    assert f'"system:serviceaccount:{NAMESPACE}:{account}" cannot create resource "services"' in (
        message
    )
    assert "Grant it to the operator's ServiceAccount" in message
    assert await api.get("v1", "services", "joe-tts") is None
    # What the chart does grant went through, up to the refusal: the pool's Deployment.
    assert await api.get("apps/v1", "deployments", "voxfleet-triton-t4") is not None
