"""The real Prometheus (`.tools/bin/prometheus`) scraping what a rendered ServiceMonitor selects.

In a cluster the Prometheus Operator turns a ServiceMonitor into scrape configuration: the
Services its selector matches (in the namespaces of its `namespaceSelector`), their port named
by each endpoint, and behind it the endpoints of the Service's Ready pods, labelled
`namespace`, `pod`, `service`, `endpoint`, `container` and `job` (the Service's name). Here
`service_monitor_targets` computes the same from the objects themselves and
`PrometheusServer` hands them to a real Prometheus through `file_sd` (a file Prometheus
watches, so pods coming and going need no restart); `reload()` (`POST /-/reload`, enabled by
`--web.enable-lifecycle`) applies a changed scrape interval.

The Prometheus Operator itself is not run (it needs a cluster): relabelings, TLS and auth of
an endpoint, and `targetLabels`/`podTargetLabels` are not emulated.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from cluster.processes import die_with_parent, free_port

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_SCRAPE_INTERVAL = "15s"


def prometheus_binary() -> str:
    local = ROOT / ".tools" / "bin" / "prometheus"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("prometheus")
    if found is None:
        raise FileNotFoundError("prometheus is not installed: run `make setup`")
    return found


def _matches(selector: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    labels = labels or {}
    return all(labels.get(k) == v for k, v in selector.items())


def pod_is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or not status.get("podIP"):
        return False
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False  # the endpoints controller drops a terminating pod at once
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _container_port(pod: Mapping[str, Any], target: str | int) -> tuple[str, int] | None:
    """(container name, port) a Service's targetPort names on a pod."""
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if target in (port.get("name"), port.get("containerPort")):
                return container["name"], int(port["containerPort"])
    return None


@dataclass(frozen=True)
class ScrapeTarget:
    address: str
    labels: Mapping[str, str]


def service_monitor_targets(
    monitor: Mapping[str, Any],
    services: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
) -> list[ScrapeTarget]:
    """The targets the Prometheus Operator would configure for `monitor` right now."""
    spec = monitor["spec"]
    monitor_ns = monitor["metadata"].get("namespace")
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    namespace_selector = spec.get("namespaceSelector") or {}
    namespaces = (
        None
        if namespace_selector.get("any")
        else set(namespace_selector.get("matchNames") or [monitor_ns])
    )
    pods = list(pods)
    targets = []
    for service in services:
        meta = service["metadata"]
        namespace = meta.get("namespace")
        if namespaces is not None and namespace not in namespaces:
            continue
        if not _matches(selector, meta.get("labels")):
            continue
        pod_selector = (service.get("spec") or {}).get("selector") or {}
        for endpoint in spec.get("endpoints") or []:
            service_port = next(
                (
                    p
                    for p in service["spec"].get("ports") or []
                    if p.get("name") == endpoint.get("port")
                ),
                None,
            )
            if service_port is None:
                continue
            target_port = service_port.get("targetPort", service_port["port"])
            for pod in pods:
                pod_meta = pod["metadata"]
                if pod_meta.get("namespace") != namespace or not pod_is_ready(pod):
                    continue
                if not pod_selector or not _matches(pod_selector, pod_meta.get("labels")):
                    continue
                found = _container_port(pod, target_port)
                if found is None:
                    continue
                container, port = found
                targets.append(
                    ScrapeTarget(
                        f"{pod['status']['podIP']}:{port}",
                        {
                            "namespace": namespace,
                            "pod": pod_meta["name"],
                            "service": meta["name"],
                            "endpoint": endpoint["port"],
                            "container": container,
                            "job": meta["name"],
                        },
                    )
                )
    return sorted(targets, key=lambda t: (t.labels["pod"], t.address))


def scrape_interval(monitor: Mapping[str, Any], override: str | None = None) -> str:
    """The first endpoint's interval, unless the caller sets one (the e2e uses a shorter one)."""
    if override:
        return override
    endpoints = monitor["spec"].get("endpoints") or [{}]
    return str(endpoints[0].get("interval") or DEFAULT_SCRAPE_INTERVAL)


class PrometheusServer:
    """A Prometheus process on a loopback port; stopped (and its data removed) on exit."""

    def __init__(
        self,
        scrape_interval: str = DEFAULT_SCRAPE_INTERVAL,
        host: str = "127.0.0.1",
        port: int | None = None,
        work_dir: Path | None = None,
        metrics_path: str = "/metrics",
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.scrape_interval = scrape_interval
        self.metrics_path = metrics_path
        self._own_dir = work_dir is None
        self._work_dir = work_dir
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def work_dir(self) -> Path:
        """The configuration, targets, data and log; a temporary one (made on first use and
        removed by `stop`) unless given."""
        if self._work_dir is None:
            self._work_dir = Path(tempfile.mkdtemp(prefix="voxfleet-prometheus-"))
        return self._work_dir

    @property
    def config_path(self) -> Path:
        return self.work_dir / "prometheus.yml"

    @property
    def targets_path(self) -> Path:
        return self.work_dir / "targets.json"

    @property
    def log_path(self) -> Path:
        return self.work_dir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _write_config(self) -> None:
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [
                {
                    "job_name": "service-monitor",
                    "metrics_path": self.metrics_path,
                    # The Prometheus Operator's labels (job, namespace, pod ...) win.
                    "honor_labels": False,
                    "file_sd_configs": [
                        {"files": [str(self.targets_path)], "refresh_interval": "5s"}
                    ],
                    "relabel_configs": [
                        {"source_labels": ["__tmp_job"], "target_label": "job"},
                    ],
                }
            ],
        }
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(config, sort_keys=False))
        tmp.replace(self.config_path)

    def set_targets(self, targets: Sequence[ScrapeTarget]) -> None:
        """Replace the scrape targets; Prometheus picks the file up by itself."""
        groups = [
            {
                "targets": [t.address],
                "labels": {
                    **{k: v for k, v in t.labels.items() if k != "job"},
                    "__tmp_job": t.labels.get("job", "service-monitor"),
                },
            }
            for t in targets
        ]
        tmp = self.targets_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(groups))
        tmp.replace(self.targets_path)

    def start(self, timeout_s: float = 60.0) -> PrometheusServer:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        if not self.targets_path.exists():
            self.set_targets([])
        self._write_config()
        log = self.log_path.open("wb")
        self.process = subprocess.Popen(
            [
                prometheus_binary(),
                f"--config.file={self.config_path}",
                f"--storage.tsdb.path={self.work_dir / 'data'}",
                f"--web.listen-address={self.host}:{self.port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Dies with the suite, however it ends: a terminated run left its Prometheus
            # running, one more with every run.
            preexec_fn=die_with_parent,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_tail()
                self.stop()
                raise RuntimeError(f"prometheus exited at start:\n{tail}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.2)
        tail = self.log_tail()
        self.stop()
        raise TimeoutError(f"prometheus not ready after {timeout_s} s:\n{tail}")

    def reload(self, scrape_interval: str | None = None) -> None:
        """Apply a new scrape interval (the config file is rewritten) through /-/reload."""
        if scrape_interval is not None:
            self.scrape_interval = scrape_interval
        self._write_config()
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=10) as response:
            if response.status != 200:
                raise RuntimeError(f"prometheus reload: HTTP {response.status}")

    def active_targets(self) -> list[dict[str, Any]]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets?state=active", timeout=5) as r:
            data: dict[str, Any] = json.load(r)
        targets: list[dict[str, Any]] = data["data"]["activeTargets"]
        return targets

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 15.0) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        if self._own_dir and self._work_dir is not None:
            shutil.rmtree(self._work_dir, ignore_errors=True)
            self._work_dir = None

    def __enter__(self) -> PrometheusServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
