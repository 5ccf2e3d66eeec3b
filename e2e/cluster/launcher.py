"""Starts one container inside its pod's namespaces; run as `launcher.py SPEC.json [FD]`.

The kubelet runs `ip netns exec <pod netns> unshare --mount --propagation private python
launcher.py SPEC.json`; each step execs the next, so the container process keeps the pid the
kubelet started. Here, in a mount namespace of its own: every volume is mounted at its
rendered path (bind mounts of host directories, tmpfs for memory-backed emptyDirs; read-only
where asked), the CPU set is applied, and the container's argv is exec'ed with its
environment and working directory. Mount points missing on the host's root filesystem are
created there (empty; the mounts themselves stay private) and listed in SPEC's
`created_file`, so that the cluster removes them when it stops. SPEC's `image_paths` stand
for the image's own files: one that a volume's mount point lies above (an emptyDir at /tmp,
the project checked out in /tmp) is bound back at its path inside that volume, so the
container's command still runs; a volume mounted at such a path itself hides it, as in a
container.
FD, when given, is a pipe's write end that the exec closes: the kubelet reports the
container running (and starts probing it) only then.
Standard library only: it runs before anything of the pod exists.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys


def _mount(args: list[str], pass_fds: tuple[int, ...] = ()) -> None:
    subprocess.run(["mount", *args], check=True, pass_fds=pass_fds)


def _bind(fd: int, target: str) -> None:
    """Binds what `fd` (opened before any mount) is at `target`. Not canonicalized: mount(8)
    would otherwise turn /proc/self/fd/N back into its path, which a mount made since may
    cover."""
    _mount(["--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", target], pass_fds=(fd,))


def _make_mount_point(target: str, is_file: bool, created: list[str]) -> None:
    missing: list[str] = []
    parent = os.path.dirname(target) if is_file else target
    while parent and parent != "/" and not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(os.path.dirname(target) if is_file else target, exist_ok=True)
    if is_file and not os.path.exists(target):
        open(target, "a").close()
        missing.insert(0, target)
    created.extend(missing)


def _keep_image_paths(target: str, image: dict[str, int]) -> None:
    """Binds back, inside the volume just mounted at `target`, each image path below it."""
    for path, fd in image.items():
        if path.startswith(target.rstrip("/") + "/"):
            os.makedirs(path, exist_ok=True)  # inside the volume, not on the host
            _bind(fd, path)


def _die_with_the_kubelet() -> None:
    """SIGKILL when the kubelet's thread goes (a test process killed without its cleanup):
    the container's main process does not outlive the node. The rest of the pod's processes
    are killed by the next cluster's start (network.py)."""
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG; kept across exec
    if os.getppid() != parent:
        os._exit(137)


def main(spec_path: str) -> None:
    _die_with_the_kubelet()
    with open(spec_path) as handle:
        spec = json.load(handle)
    mounts = spec["mounts"]
    # Open every source before mounting anything: a mount over /tmp must not hide a source
    # under /tmp from the mounts that follow it.
    fds = [os.open(m["source"], os.O_PATH) if m["source"] else -1 for m in mounts]
    files = [bool(m["source"]) and os.path.isfile(m["source"]) for m in mounts]
    image = {path: os.open(path, os.O_PATH) for path in spec.get("image_paths", [])}
    # Opened now for the same reason: the workdir may be under a path a mount covers.
    created_fd = os.open(spec["created_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    created: list[str] = []
    done: list[str] = []
    for mount, fd, is_file in zip(mounts, fds, files, strict=True):
        target = mount["target"]
        # A mount point inside an earlier mount is made there, not on the host.
        inside = any(target.startswith(earlier.rstrip("/") + "/") for earlier in done)
        _make_mount_point(target, is_file, [] if inside else created)
        done.append(target)
        if fd < 0:
            _mount(["-t", "tmpfs", "-o", f"size={mount['tmpfs_bytes']}", "tmpfs", target])
        else:
            _bind(fd, target)
        _keep_image_paths(target, image)
        if fd >= 0 and mount["read_only"]:
            _mount(["-o", "remount,bind,ro", target])
        if fd >= 0:
            os.close(fd)
    for fd in image.values():
        os.close(fd)
    os.write(created_fd, "".join(path + "\n" for path in created).encode())
    os.close(created_fd)
    socket.sethostname(spec["hostname"])  # a UTS namespace of its own, as a pod has
    os.sched_setaffinity(0, spec["cpus"])
    os.chdir(spec.get("working_dir") or "/")
    argv = spec["argv"]
    env = spec["env"]
    if len(sys.argv) > 2:
        # Closed at exec: the kubelet learns that the container's own process now runs.
        os.set_inheritable(int(sys.argv[2]), False)
        fcntl.fcntl(int(sys.argv[2]), fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as error:
        # As a container runtime: the start fails and says why (exit code 127 or 126).
        print(f"exec {argv[0]!r}: {error}", file=sys.stderr, flush=True)
        sys.exit(127 if isinstance(error, FileNotFoundError) else 126)


if __name__ == "__main__":
    main(sys.argv[1])
