"""The harness's in-process reads answer as `kubectl get -o json` does: the object or the list's
items in the namespace, a label selector passed on, None for an object that is not there, and
kinds it does not know left to kubectl. Against a local HTTP server standing in for the API."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from e2e_support import Kubectl

from lab.autoscale.reader import ApiReader


class FakeApi(BaseHTTPRequestHandler):
    paths: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        FakeApi.paths.append(self.path)
        route = self.path.split("?")[0]
        if route.endswith("/missing"):
            self.send_response(404)
            self.end_headers()
            self.wfile.write(b'{"kind": "Status", "code": 404}')
            return
        body: dict[str, Any] = (
            {"items": [{"metadata": {"name": "listed"}}]}
            if route.endswith("s")
            else {"metadata": {"name": route.rsplit("/", 1)[1]}}
        )
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())

    def log_message(self, *args: Any) -> None:
        pass


class NoKubectl(Kubectl):
    def get(self, *args: str) -> Any:
        return {"from": "kubectl", "args": list(args)}


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[ApiReader]:
    server = HTTPServer(("127.0.0.1", 0), FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
        f"clusters: [{{name: api, cluster: {{server: 'http://127.0.0.1:{server.server_port}'}}}}]\n"
        "users: [{name: me, user: {}}]\n"
        "contexts: [{name: test, context: {cluster: api, user: me}}]\n"
    )
    FakeApi.paths.clear()
    yield ApiReader(NoKubectl(kubeconfig, "voxfleet"))
    server.shutdown()


def test_reads_answer_as_kubectl_does(reader: ApiReader) -> None:
    assert reader.items("pods", "app=x,pool=cpu") == [{"metadata": {"name": "listed"}}]
    assert reader.get("deployment", "pool") == {"metadata": {"name": "pool"}}
    assert reader.get("ttsv", "missing") is None
    assert FakeApi.paths == [
        "/api/v1/namespaces/voxfleet/pods?labelSelector=app%3Dx%2Cpool%3Dcpu",
        "/apis/apps/v1/namespaces/voxfleet/deployments/pool",
        "/apis/voxfleet.io/v1alpha1/namespaces/voxfleet/ttsvoices/missing",
    ]
    # A kind it does not map goes to kubectl.
    assert reader.get("apiservice", "v1beta2.custom.metrics.k8s.io")["from"] == "kubectl"
    assert len(FakeApi.paths) == 3
