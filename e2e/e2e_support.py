"""What the e2e scenarios do to a cluster, the same way on the local cluster and on kind.

The scenarios talk to Kubernetes only through the real `kubectl` (apply, get, scale, rollout,
delete) and `helm` (install, upgrade, uninstall), and to voices only through `voxfleet say`'s
client at the address a voice's Service resolves to. The two backends differ in who runs the
control plane and the pods, and in how a test reaches a Service or a pod:

- local (default): the real control plane and node built by `make setup` (e2e/cluster/),
  running the images `make images` built, the chart installed with `helm install`; Services
  are reached at their cluster IPs through kube-proxy, pods at their IPs.
- kind (`VOXFLEET_E2E_KUBECONFIG` set, as scripts/e2e-kind.sh does): the chart is already
  installed by `helm install`; Services and pods are reached with `kubectl port-forward`.

`eventually()` also runs the `HEALTH_CHECKS` the installation registers, so that a
control-plane process that dies fails the waiting test at once, with its log's last lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml
from cluster.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "charts" / "voxfleet"
VALUES = ROOT / "e2e" / "values-cpu.yaml"
KUBECONFIG_ENV = "VOXFLEET_E2E_KUBECONFIG"
REAL_CLUSTER = bool(os.environ.get(KUBECONFIG_ENV))
NAMESPACE = os.environ.get("VOXFLEET_E2E_NAMESPACE", "voxfleet-e2e")
RELEASE = os.environ.get("VOXFLEET_E2E_RELEASE", "voxfleet")
POOL = "cpu"
VOICES_CLAIM = "voices"

T = TypeVar("T")
# Called by every `eventually()` round: each raises if the cluster underneath has failed.
HEALTH_CHECKS: list[Callable[[], None]] = []


def check_health() -> None:
    for check in list(HEALTH_CHECKS):
        check()


def eventually(check: Callable[[], T], timeout: float, interval: float = 0.5, what: str = "") -> T:
    """Poll `check` until it returns something truthy; fail with its last value or error."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        check_health()
        try:
            last = check()
        except (AssertionError, subprocess.CalledProcessError, KeyError) as error:
            last = error
        if last and not isinstance(last, BaseException):
            return last
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{what or check.__name__}: not true within {timeout} s; last: {last!r}"
            )
        time.sleep(interval)


class KubectlError(subprocess.CalledProcessError):
    def __str__(self) -> str:
        return f"{' '.join(self.cmd)} exited with {self.returncode}: {self.stderr.strip()}"


class Kubectl:
    """The real kubectl, against the suite's cluster, in the suite's namespace."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.binary = shutil.which("kubectl") or "kubectl"

    def env(self) -> dict[str, str]:
        return dict(os.environ, KUBECONFIG=str(self.kubeconfig))

    def run(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "-n", self.namespace, *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=self.env(),
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, ["kubectl", *args], result.stdout, result.stderr)
        return result

    def apply(self, manifest: str | dict[str, Any] | list[dict[str, Any]]) -> str:
        if isinstance(manifest, dict):
            manifest = [manifest]
        text = manifest if isinstance(manifest, str) else yaml.safe_dump_all(manifest)
        return self.run("apply", "-f", "-", stdin=text).stdout

    def get(self, *args: str) -> Any:
        """`kubectl get ... -o json`; None where the object does not exist."""
        result = self.run("get", *args, "-o", "json", check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr or "not found" in result.stderr:
                return None
            raise KubectlError(
                result.returncode, ["kubectl", "get", *args], result.stdout, result.stderr
            )
        return json.loads(result.stdout)

    def items(self, kind: str, selector: str | None = None) -> list[dict[str, Any]]:
        args = [kind] + (["-l", selector] if selector else [])
        listing = self.get(*args)
        return list(listing["items"]) if listing else []


def condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any] | None:
    for item in ((obj or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return None


class Helm:
    """The real helm (Helm 4) against the suite's cluster, in the suite's namespace."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace
        self.binary = shutil.which("helm") or "helm"

    def run(
        self, *args: str, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [self.binary, "--kubeconfig", str(self.kubeconfig), "-n", self.namespace, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise KubectlError(result.returncode, ["helm", *args], result.stdout, result.stderr)
        return result


@contextlib.contextmanager
def port_forward(kubectl: Kubectl, target: str, port: int) -> Iterator[str]:
    """`kubectl port-forward TARGET :PORT`: yields the local host:port."""
    local = free_port()
    process = subprocess.Popen(
        [
            kubectl.binary,
            "-n",
            kubectl.namespace,
            "port-forward",
            target,
            f"{local}:{port}",
            "--address",
            "127.0.0.1",
        ],
        env=kubectl.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def listening() -> bool:
            with socket.socket() as sock:
                return sock.connect_ex(("127.0.0.1", local)) == 0

        eventually(listening, timeout=30, interval=0.2, what=f"port-forward {target}")
        yield f"127.0.0.1:{local}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


_ENDPOINT = re.compile(
    r"^(?P<service>[a-z0-9-]+)\.(?P<namespace>[a-z0-9-]+)\.svc(?:\.[a-z.]+)?"
    r":(?P<port>\d+)$"
)


def parse_endpoint(endpoint: str) -> tuple[str, str, int]:
    """`<service>.<namespace>.svc[.cluster.local]:<port>` -> (service, namespace, port)."""
    match = _ENDPOINT.match(endpoint)
    assert match, f"status.endpoint {endpoint!r} is not <service>.<namespace>.svc:<port>"
    return match["service"], match["namespace"], int(match["port"])
