"""What every pod run by the node agent shares: its node's API identity, the network, CPUs,
directories and the environment an image would set."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import aiohttp

from .cpus import CpuAllocator
from .kube import Kube
from .network import PodNetwork


@dataclasses.dataclass
class NodeContext:
    name: str
    # The API as this node (system:node:<name>): the Node authorizer lets it read what its
    # own pods reference and write their status, nothing else.
    api: Kube
    session: aiohttp.ClientSession  # for probes and handlers
    network: PodNetwork
    # The node's address (the host's on the pod bridge, shared by every node of the agent).
    host_ip: str
    cpus: CpuAllocator
    workdir: Path
    # The environment an image would set (PATH with the project's .venv/bin first, HOME)
    # and the `kubernetes` Service's KUBERNETES_SERVICE_* variables.
    base_env: dict[str, str]
    # Host directories that stand for the image's files: kept visible under volumes mounted
    # above them (launcher.py).
    image_paths: list[str]
    # /etc/hosts lines naming the Services, for pods of a namespace (services.py).
    service_hosts: Callable[[str], str] = lambda namespace: ""

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    @property
    def created_file(self) -> Path:
        """Mount points that pods created on the host's root filesystem, one per line."""
        return self.workdir / "created-mount-points"
