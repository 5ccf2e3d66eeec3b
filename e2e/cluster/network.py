"""Pod networking: one network namespace per pod on a bridge of the cluster's own.

Each local cluster takes a free slot k (0-15, held by an flock on /run/voxfleet-e2e/k.lock so
that several clusters can run side by side) and owns:
- a bridge `vxf{k}br` with the gateway address 10.213.{k}.1/24 on the host side;
- per pod, a network namespace `vxf{k}-{n}` whose `eth0` (a veth peer of `vxf{k}h{n}` on the
  bridge) has the pod IP 10.213.{k}.{n} and a default route via the gateway, and an up `lo`.

Pods therefore bind their container ports as rendered (0.0.0.0:8000 in every pod) and reach
each other by pod IP; the host reaches every pod through the bridge. IP forwarding is left as
it is (off here), so pod traffic never leaves the host. Names and addresses of a slot whose
lock is free are stale (a crashed run) and are removed before the slot is used.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from pathlib import Path

LOCK_DIR = Path("/run/voxfleet-e2e")
SLOTS = 16
SUBNET = "10.213.{slot}.0/24"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


class PodNetwork:
    """The bridge of one local cluster and the namespaces of its pods."""

    def __init__(self) -> None:
        self.slot = -1
        self._lock_fd = -1
        self._free = list(range(2, 255))
        self._namespaces: dict[str, tuple[str, str]] = {}  # pod uid -> (netns, pod IP)

    @property
    def gateway(self) -> str:
        return f"10.213.{self.slot}.1"

    @property
    def bridge(self) -> str:
        return f"vxf{self.slot}br"

    def start(self) -> None:
        LOCK_DIR.mkdir(parents=True, exist_ok=True)
        for slot in range(SLOTS):
            fd = os.open(LOCK_DIR / f"{slot}.lock", os.O_CREAT | os.O_RDWR, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            self.slot, self._lock_fd = slot, fd
            break
        else:
            raise RuntimeError(f"all {SLOTS} local cluster network slots are in use")
        remove_slot(self.slot)
        remove_stale_slots()
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def stop(self) -> None:
        if self.slot < 0:
            return
        remove_slot(self.slot)
        self._namespaces.clear()
        os.close(self._lock_fd)
        self.slot, self._lock_fd = -1, -1

    def add_pod(self, uid: str) -> tuple[str, str]:
        """Create the pod's namespace; return (netns name, pod IP)."""
        if uid in self._namespaces:
            return self._namespaces[uid]
        if not self._free:
            raise RuntimeError("no pod IP left in " + SUBNET.format(slot=self.slot))
        n = self._free.pop(0)
        netns = f"vxf{self.slot}-{n}"
        host_side, pod_side = f"vxf{self.slot}h{n}", f"vxf{self.slot}p{n}"
        address = f"10.213.{self.slot}.{n}"
        _ip("netns", "add", netns)
        _ip("link", "add", host_side, "type", "veth", "peer", "name", pod_side)
        _ip("link", "set", pod_side, "netns", netns)
        _ip("link", "set", host_side, "master", self.bridge)
        _ip("link", "set", host_side, "up")
        inside = ("netns", "exec", netns, "ip")
        _ip(*inside, "link", "set", pod_side, "name", "eth0")
        _ip(*inside, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "route", "add", "default", "via", self.gateway)
        self._namespaces[uid] = (netns, address)
        return netns, address

    def remove_pod(self, uid: str) -> None:
        entry = self._namespaces.pop(uid, None)
        if entry is None:
            return
        netns, address = entry
        _kill_namespace_processes(netns)
        _ip("netns", "del", netns, check=False)
        _ip("link", "del", f"vxf{self.slot}h{address.rsplit('.', 1)[1]}", check=False)
        self._free.append(int(address.rsplit(".", 1)[1]))


def namespace_pids(netns: str) -> list[int]:
    return [int(pid) for pid in _ip("netns", "pids", netns, check=False).stdout.split()]


def _kill_namespace_processes(netns: str) -> None:
    for pid in namespace_pids(netns):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)


def remove_stale_slots() -> None:
    """Remove what crashed runs left in every slot that no running cluster holds."""
    for slot in range(SLOTS):
        lock = LOCK_DIR / f"{slot}.lock"
        if not lock.exists():
            continue  # never used
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a running cluster's (or this one's, locked through another fd)
        else:
            remove_slot(slot)
        finally:
            os.close(fd)


def remove_slot(slot: int) -> None:
    """Remove every namespace and link of `slot` (this cluster's, or a crashed run's)."""
    prefix = f"vxf{slot}-"
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(prefix):
            _kill_namespace_processes(name)
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name == f"vxf{slot}br" or name.startswith(f"vxf{slot}h"):
            _ip("link", "del", name, check=False)
