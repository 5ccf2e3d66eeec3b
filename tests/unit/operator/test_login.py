"""Which credentials the operator uses: kubectl's order, an explicit $KUBECONFIG first."""

from __future__ import annotations

from pathlib import Path

import kopf
import pytest
import yaml
from voxfleet_operator import kube


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "secret-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def test_an_explicit_kubeconfig_wins_over_the_pods_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _kubeconfig(tmp_path / "config", "http://10.0.0.1:6443")
    monkeypatch.setenv("KUBECONFIG", str(config))
    in_cluster = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="pod")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: in_cluster)
    info = kube.login_info(kopf.OperatorSettings())
    assert info.server == "http://10.0.0.1:6443"
    assert info.token == "secret-token"


def test_without_kubeconfig_a_pod_uses_its_service_account(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBECONFIG", raising=False)
    in_cluster = kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="pod")
    monkeypatch.setattr(kopf, "login_with_service_account", lambda **_: in_cluster)
    assert kube.login_info(kopf.OperatorSettings()) is in_cluster
