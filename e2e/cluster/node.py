"""What every pod of the local node shares: the API, the network, CPUs, directories, env."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import aiohttp

from .api import KubeApi
from .cpus import CpuAllocator
from .network import PodNetwork


@dataclasses.dataclass
class Node:
    api: KubeApi
    session: aiohttp.ClientSession  # for probes and handlers
    network: PodNetwork
    cpus: CpuAllocator
    workdir: Path
    # The environment an image would set (PATH with the project's .venv/bin first, HOME);
    # the kubelet adds HOSTNAME and the KUBERNETES_SERVICE_* variables.
    base_env: dict[str, str]
    # Host directories that stand for the image's files: kept visible under volumes mounted
    # above them (launcher.py).
    image_paths: list[str]
    # Files of the service-account mount: token, ca.crt.
    service_account: dict[str, bytes]
    # /etc/hosts lines naming the Services, for pods of a namespace (services.py).
    service_hosts: Callable[[str], str] = lambda namespace: ""
    name: str = "local-node"

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def created_file(self) -> Path:
        """Mount points that pods created on the host's root filesystem, one per line."""
        return self.workdir / "created-mount-points"
