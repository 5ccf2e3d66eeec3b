"""The e2e suite's node (e2e/cluster/node.py) on this machine: what a machine lacks is named at
once, in one line that says how to get it, and a run killed with SIGKILL leaves nothing that
the next run trips over (e2e/cluster/leftovers.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cluster import LocalCluster, NodeError, leftovers
from cluster.controlplane import missing_binaries
from cluster.images import Archive, missing_product_images, product_archives
from cluster.node import BRIDGE, missing_image, node_missing

ROOT = Path(__file__).resolve().parents[3]
TRITON_IMAGE = "voxfleet-triton-cpu:e2e"


def test_without_containerd_the_node_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    message = node_missing()
    assert message is not None
    assert message.startswith("containerd is not on PATH: `apt-get install containerd runc")
    assert "\n" not in message


def test_without_runc_the_node_names_runc(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for tool in ("containerd", "containerd-shim-runc-v2", "ctr"):
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed (make setup installs it)")
        (tmp_path / tool).symlink_to(found)
    monkeypatch.setenv("PATH", str(tmp_path))
    message = node_missing()
    assert message is not None and message.startswith("runc is not on PATH"), message


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only file system (root)")
def test_without_cgroup_write_access_the_node_says_so(tmp_path: Path) -> None:
    if node_missing() is not None:
        pytest.skip(f"this machine cannot run the node at all: {node_missing()}")
    cgroups = tmp_path / "cgroup"
    cgroups.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(cgroups)], check=True)
    try:
        (cgroups / "memory").mkdir()
        subprocess.run(["mount", "-o", "remount,ro", str(cgroups)], check=True)
        message = node_missing(cgroups=cgroups)
    finally:
        subprocess.run(["umount", str(cgroups)], check=True)
    assert message is not None
    assert message.startswith(f"cannot create a cgroup ({cgroups}/memory/"), message
    assert "Read-only file system" in message and "write access" in message


def test_a_missing_image_is_named_with_the_command_that_builds_it(tmp_path: Path) -> None:
    message = missing_image(product_archives(tmp_path))
    assert message == (
        f"the image voxfleet-operator:e2e is missing ({tmp_path}/operator.tar not found): "
        "run `make images`, which builds docker/'s images without Docker"
    )


needs_node = pytest.mark.skipif(
    bool(node_missing() or missing_binaries() or missing_product_images()),
    reason="needs root, containerd and runc, `make setup` and `make images`",
)


@needs_node
def test_a_missing_image_stops_the_cluster_before_anything_starts(tmp_path: Path) -> None:
    started = time.monotonic()
    cluster = LocalCluster(tmp_path, archives=[Archive("voxfleet-none:e2e", tmp_path / "no.tar")])
    with pytest.raises(NodeError, match=r"voxfleet-none:e2e is missing .* run `make images`"):
        cluster.start()
    assert time.monotonic() - started < 10
    assert not (tmp_path / "control-plane" / "logs").exists()  # no process was started


SLEEPER = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "sleeper", "namespace": "default"},
    "spec": {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "sleep",
                "image": TRITON_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "-c", "import time; time.sleep(100000)"],
            }
        ],
    },
}

FIRST_RUN = textwrap.dedent(
    """
    import sys, time
    from cluster import LocalCluster
    cluster = LocalCluster(sys.argv[1]).start()
    cluster.kubectl("apply", "-f", "-", input=sys.argv[2])
    phase = ("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}")
    while cluster.kubectl(*phase) != "Running":
        time.sleep(0.5)
    print("running", flush=True)
    time.sleep(100000)
    """
)


# A run as the suite and `make autoscale` make one: SIGTERM unwinds it (`stop_on_sigterm`), so
# the cluster's `with` stops the node and its containers, and Prometheus dies with it.
TERMINATED_RUN = textwrap.dedent(
    """
    import sys, time
    from cluster import LocalCluster
    from cluster.processes import stop_on_sigterm
    from hpa.prometheus import PrometheusServer
    stop_on_sigterm()
    with LocalCluster(sys.argv[1]) as cluster:
        prometheus = PrometheusServer(work_dir=cluster.workdir / "prometheus").start()
        cluster.kubectl("apply", "-f", "-", input=sys.argv[2])
        phase = ("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}")
        while cluster.kubectl(*phase) != "Running":
            time.sleep(0.5)
        print("running", prometheus.process.pid, flush=True)
        time.sleep(100000)
    """
)


def start_run(script: str, workdir: Path, manifest: str) -> subprocess.Popen[str]:
    """`script` run as the suite runs, with the harness (`cluster`) importable."""
    env = dict(os.environ, PATH=f"{ROOT / '.tools' / 'bin'}:{os.environ['PATH']}")
    env["PYTHONPATH"] = f"{ROOT / 'e2e'}:{ROOT}"  # the harness is `cluster`
    return subprocess.Popen(
        [sys.executable, "-c", script, str(workdir), manifest],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )


def running(run: subprocess.Popen[str]) -> list[str]:
    """Wait for the run's "running" line; the words after it."""
    assert run.stdout is not None
    words = run.stdout.readline().split()
    assert words[:1] == ["running"], run.stderr.read() if run.stderr else ""
    return words[1:]


def host_state() -> dict[str, object]:
    """What a node leaves on the host when it is not cleaned up."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    saved = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
    chains = "\n".join(line for line in saved.splitlines() if line.startswith(":"))
    mounts = Path("/proc/self/mountinfo").read_text()
    return {
        "cgroups": [str(p) for p in leftovers.node_cgroups()],
        "bridge": f" {BRIDGE}:" in links,
        "kube_chains": sorted({line.split()[0] for line in chains.splitlines() if "KUBE-" in line}),
        "mounts": sum(str(leftovers.STATE) in line for line in mounts.splitlines()),
        "sysctls": {n: Path(f"/proc/sys/{n}").read_text().strip() for n in leftovers.SYSCTLS},
    }


@needs_node
def test_a_killed_run_leaves_nothing_the_next_run_trips_over(tmp_path: Path) -> None:
    before = host_state()
    manifest = json.dumps(SLEEPER)
    first = start_run(FIRST_RUN, tmp_path / "first", manifest)
    try:
        assert running(first) == []
    finally:
        first.kill()
        first.wait()
    # Killed: containerd, the kubelet and kube-proxy died with it, the pod did not.
    left = host_state()
    assert left["cgroups"] and left["bridge"] and left["kube_chains"], left
    # The next run starts, runs the same pod, and leaves the host as it found it.
    with LocalCluster(tmp_path / "second") as cluster:
        cluster.kubectl("apply", "-f", "-", input=manifest)
        deadline = time.monotonic() + 120
        while cluster.kubectl("get", "pod", "sleeper", "-o", "jsonpath={.status.phase}") != (
            "Running"
        ):
            assert time.monotonic() < deadline, cluster.kubectl("describe", "pod", "sleeper")
            time.sleep(0.5)
    assert host_state() == before


@needs_node
def test_a_terminated_run_stops_its_pods_and_prometheus(tmp_path: Path) -> None:
    before = host_state()
    run = start_run(TERMINATED_RUN, tmp_path / "run", json.dumps(SLEEPER))
    try:
        prometheus = int(running(run)[0])
        run.terminate()
        run.wait(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    # Nothing of it runs on: no container, no Prometheus, the host as it was.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{prometheus}").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not Path(f"/proc/{prometheus}").exists(), "Prometheus outlived the terminated run"
    assert not leftovers.node_cgroups() and not leftovers._shims()
    assert host_state() == before
