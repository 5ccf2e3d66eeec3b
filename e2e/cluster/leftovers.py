"""What the e2e node leaves on the host, and removing it: at the end of a run, and at the start
of the next one when a run was killed (SIGKILL, a lost machine) before it could clean up.

The node keeps everything it makes under names of its own, so that nothing else is touched:
- processes: the containers' (in the cgroup `CGROUP_ROOT` of every hierarchy) and the
  containerd shims serving its socket (their command line names `STATE`); containerd, the
  kubelet and kube-proxy themselves die with the run's Python process (processes.py);
- mounts under `STATE` (containerd's task and network-namespace mounts) and under
  `VAR`/kubelet (the pods' volumes);
- cgroups under `CGROUP_ROOT`; kube-proxy's iptables chains (`kube-proxy --cleanup`) and the
  kubelet's (`KUBELET_CHAINS`); the pods' bridge; the CNI plugin's address leases (under
  `STATE`);
- the kernel settings the kubelet and the CNI plugin set (`SYSCTLS`), saved before the node
  starts and put back.
The image store (`VAR`/containerd) is kept: it is what makes a second run import nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

STATE = Path("/run/voxfleet-node")
VAR = Path("/var/lib/voxfleet-node")
CGROUP_ROOT = "/voxfleet-node"
# The kubelet's three (protectKernelDefaults: false) and IP forwarding, which the CNI bridge
# plugin turns on for pods to reach Services.
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward")
SAVED_SYSCTLS = STATE / "sysctls.json"
# The node's pods share the CPU as one group against every process outside it, and a group
# weighs as one busy process by default (1024). Outside it here run the suite's own clients
# (up to eight `voxfleet say` processes at once, each as heavy as a pool pod while it starts),
# which in a cluster would run on other machines: the node weighs as four busy processes per
# CPU, so that its pods keep most of the CPU they would have on a machine of their own.
NODE_CPU_WEIGHT_PER_CPU = 4096


def cgroup_hierarchies() -> list[Path]:
    """The mount points of every cgroup hierarchy (v1 controllers and the unified one)."""
    found = []
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and fields[2] in ("cgroup", "cgroup2"):
                found.append(Path(fields[1]))
    return found


def node_cgroups() -> list[Path]:
    """Every cgroup directory under CGROUP_ROOT, deepest first."""
    found = []
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / CGROUP_ROOT.strip("/")
        if top.is_dir():
            found += [Path(d) for d, _, _ in os.walk(top)]
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def cgroup_pids(directory: Path) -> list[int]:
    pids: set[int] = set()
    for current, _, _ in os.walk(directory):
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in (Path(current) / "cgroup.procs").read_text().split())
    return sorted(pids)


def make_cgroup_root() -> None:
    """CGROUP_ROOT in every hierarchy (the kubelet wants its cgroup root to exist), with the
    parent's CPUs and memory nodes in cpuset (a new v1 cpuset has none), and a CPU weight of
    `NODE_CPU_WEIGHT_PER_CPU` per CPU."""
    for hierarchy in cgroup_hierarchies():
        top = hierarchy / CGROUP_ROOT.strip("/")
        top.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists() and not (top / name).read_text().strip():
                (top / name).write_text((hierarchy / name).read_text())
        if (top / "cpu.shares").exists():
            weight = NODE_CPU_WEIGHT_PER_CPU * len(os.sched_getaffinity(0))
            (top / "cpu.shares").write_text(str(weight))


def _shims() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if argv and b"containerd-shim" in argv[0] and str(STATE).encode() in b" ".join(argv):
                found.append(int(entry.name))
    return found


def _kill(pids: list[int]) -> None:
    for pid in pids:
        if pid != os.getpid():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _unmount_under(*roots: Path) -> None:
    prefixes = [str(root) + "/" for root in roots]
    targets = []
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            target = line.split()[4].replace("\\040", " ")
            if any(target.startswith(p) or target + "/" == p for p in prefixes):
                targets.append(target)
    for target in sorted(set(targets), key=len, reverse=True):
        subprocess.run(["umount", "-l", target], capture_output=True)


# The kubelet's own iptables chains (table, chain) and the jumps to them from built-in chains.
KUBELET_CHAINS = (
    ("filter", "KUBE-FIREWALL"),
    ("filter", "KUBE-KUBELET-CANARY"),
    ("nat", "KUBE-KUBELET-CANARY"),
    ("mangle", "KUBE-KUBELET-CANARY"),
    ("mangle", "KUBE-IPTABLES-HINT"),
)
KUBELET_JUMPS = (("filter", "INPUT", "KUBE-FIREWALL"), ("filter", "OUTPUT", "KUBE-FIREWALL"))


def _remove_kubelet_chains() -> None:
    for command in ("iptables", "ip6tables"):
        if shutil.which(command) is None:
            continue
        for table, chain, target in KUBELET_JUMPS:
            for _ in range(10):  # one jump per start; stop when none is left
                result = subprocess.run(
                    [command, "-t", table, "-D", chain, "-j", target], capture_output=True
                )
                if result.returncode != 0:
                    break
        for table, chain in KUBELET_CHAINS:
            subprocess.run([command, "-t", table, "-F", chain], capture_output=True)
            subprocess.run([command, "-t", table, "-X", chain], capture_output=True)


def clean(kube_proxy: Path, bridge: str) -> None:
    """Remove everything a node left, running or killed. Idempotent; touches nothing else."""
    for _ in range(3):
        pids = [pid for group in node_cgroups() for pid in cgroup_pids(group)] + _shims()
        if not pids:
            break
        _kill(pids)
        subprocess.run(["sleep", "0.5"])
    if kube_proxy.is_file():
        subprocess.run([str(kube_proxy), "--cleanup"], capture_output=True, timeout=60)
    _remove_kubelet_chains()
    _unmount_under(STATE, VAR / "kubelet")
    for group in node_cgroups():
        with contextlib.suppress(OSError):
            group.rmdir()
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)
    shutil.rmtree(STATE / "cni", ignore_errors=True)
    restore_sysctls()


def save_sysctls() -> None:
    """Keep the host's values of SYSCTLS before the kubelet changes them."""
    if SAVED_SYSCTLS.exists():
        return
    values = {name: Path(f"/proc/sys/{name}").read_text().strip() for name in SYSCTLS}
    SAVED_SYSCTLS.parent.mkdir(parents=True, exist_ok=True)
    SAVED_SYSCTLS.write_text(json.dumps(values))


def restore_sysctls() -> None:
    if not SAVED_SYSCTLS.exists():
        return
    with contextlib.suppress(OSError, ValueError):
        for name, value in json.loads(SAVED_SYSCTLS.read_text()).items():
            Path(f"/proc/sys/{name}").write_text(value)
    SAVED_SYSCTLS.unlink()
