"""Starts one container inside its pod's namespaces; run as `launcher.py SPEC.json [FD]`.

The kubelet runs `ip netns exec <pod netns> unshare --mount --propagation private python
launcher.py SPEC.json`; each step execs the next, so the container process keeps the pid the
kubelet started. Here, in a mount namespace of its own: every volume is mounted at its
rendered path (bind mounts of host directories, tmpfs for memory-backed emptyDirs; read-only
where asked), the CPU set is applied, and the container's argv is exec'ed with its
environment and working directory. Mount points missing on the host's root filesystem are
created there (empty; the mounts themselves stay private) and listed in SPEC's
`created_file`, so that the cluster removes them when it stops.
FD, when given, is a pipe's write end that the exec closes: the kubelet reports the
container running (and starts probing it) only then.
Standard library only: it runs before anything of the pod exists.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys


def _mount(args: list[str], pass_fds: tuple[int, ...] = ()) -> None:
    subprocess.run(["mount", *args], check=True, pass_fds=pass_fds)


def _make_mount_point(target: str, is_file: bool, created: list[str]) -> None:
    missing: list[str] = []
    parent = os.path.dirname(target) if is_file else target
    while parent and not os.path.exists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    os.makedirs(os.path.dirname(target) if is_file else target, exist_ok=True)
    if is_file and not os.path.exists(target):
        open(target, "a").close()
        missing.insert(0, target)
    created.extend(missing)


def main(spec_path: str) -> None:
    with open(spec_path) as handle:
        spec = json.load(handle)
    mounts = spec["mounts"]
    # Open every source before mounting anything: a mount over /tmp must not hide a source
    # under /tmp from the mounts that follow it.
    fds = [os.open(m["source"], os.O_PATH) if m["source"] else -1 for m in mounts]
    files = [bool(m["source"]) and os.path.isfile(m["source"]) for m in mounts]
    created: list[str] = []
    for mount, fd, is_file in zip(mounts, fds, files, strict=True):
        target = mount["target"]
        _make_mount_point(target, is_file, created)
        if fd < 0:
            _mount(["-t", "tmpfs", "-o", f"size={mount['tmpfs_bytes']}", "tmpfs", target])
        else:
            _mount(["--bind", f"/proc/self/fd/{fd}", target], pass_fds=(fd,))
            if mount["read_only"]:
                _mount(["-o", "remount,bind,ro", target])
        if fd >= 0:
            os.close(fd)
    if created:
        with open(spec["created_file"], "a") as handle:
            handle.writelines(path + "\n" for path in created)
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
