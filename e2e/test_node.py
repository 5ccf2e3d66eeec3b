"""What a real node makes real, on the installation the other scenarios share: the images run
as the chart renders them (users, read-only root filesystems, no capabilities), cgroups hold
containers to their CPU and memory limits and the kernel's OOM killer acts at the memory
limit, `kubectl logs`, `exec` and `port-forward` reach the pods, and the speech gateway finds a
voice's pods through cluster DNS.

Each check runs inside the containers with `kubectl exec`, as a user would look, so the same
scenarios hold on kind. Runs after the first day's scenarios (test_kubectl_to_audio.py), which
leave joe Ready; joe is applied here if it is not.
"""

from __future__ import annotations

import json
import time
import urllib.request
from typing import Any

import pytest
from e2e_support import NAMESPACE, eventually, port_forward
from installation import OPERATOR_SELECTOR, Installation
from speech import TEXT, piper_seconds, say
from voices import pool_pods, ready_voice, serving, stream, voice

GATEWAY_SELECTOR = "app.kubernetes.io/name=voxfleet-speech-api"
TRITON_IMAGE = "voxfleet-triton-cpu:e2e"

# Who the process is, what it may do and whether it can write where the image's files are.
WHO_AM_I = """
import errno, json, os
caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]
try:
    open('/usr/local/voxfleet-write-probe', 'w')
    root = 'writable'
except OSError as error:
    root = errno.errorcode[error.errno]
tmp = os.access('/tmp', os.W_OK)
print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), 'cap_eff': caps, 'root': root,
                  'tmp_writable': tmp}))
"""


@pytest.fixture(scope="module")
def joe_voice(installation: Installation) -> dict[str, Any]:
    if installation.kubectl.get("ttsv", "joe") is None:
        installation.kubectl.apply(voice("joe"))
    return ready_voice(installation, "joe", timeout=300)


def exec_python(installation: Installation, pod: str, container: str, script: str) -> Any:
    """`kubectl exec POD -c CONTAINER -- python3 -c SCRIPT`; the JSON it prints last."""
    result = installation.kubectl.run(
        "exec", pod, "-c", container, "--", "python3", "-c", script, timeout=180
    )
    return json.loads(result.stdout.strip().splitlines()[-1])


def one_pod(installation: Installation, selector: str) -> str:
    pods = [
        p["metadata"]["name"]
        for p in installation.kubectl.items("pods", selector)
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
    ]
    assert pods, f"no running pod with {selector}"
    return pods[0]


def test_containers_run_as_the_chart_renders_them(
    installation: Installation, joe_voice: dict[str, Any]
) -> None:
    """runAsUser, readOnlyRootFilesystem and `capabilities: drop: [ALL]` hold in the
    containers: the operator and the gateway as 65532, the pool pods as 1000, none with a
    capability, none able to write the image's files, each with its /tmp emptyDir writable."""
    pool = pool_pods(installation)[0]["metadata"]["name"]
    eventually(
        lambda: installation.kubectl.items("pods", GATEWAY_SELECTOR),
        timeout=120,
        what="the gateway's pod",
    )
    seen = {
        "operator": exec_python(
            installation, one_pod(installation, OPERATOR_SELECTOR), "operator", WHO_AM_I
        ),
        "gateway": exec_python(
            installation, one_pod(installation, GATEWAY_SELECTOR), "speech-api", WHO_AM_I
        ),
        "pool": exec_python(installation, pool, "triton", WHO_AM_I),
    }
    expected_uid = {"operator": 65532, "gateway": 65532, "pool": 1000}
    for name, found in seen.items():
        assert found["uid"] == found["gid"] == expected_uid[name], (name, found)
        assert int(found["cap_eff"], 16) == 0, (name, found)
        assert found["root"] == "EROFS", (name, found)
        assert found["tmp_writable"], (name, found)


def test_kubectl_logs_exec_and_port_forward_reach_a_pool_pod(
    installation: Installation, joe_voice: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    pod = next(p for p in pool_pods(installation) if serving(p, "joe"))["metadata"]["name"]
    # logs: the container's own output, through the API server and the kubelet.
    logs = kubectl.run("logs", pod, "-c", "triton").stdout
    assert "Started GRPCInferenceService" in logs, logs[-2000:]
    # exec: a process in the container's namespaces, beside its main process (PID 1).
    found = exec_python(
        installation,
        pod,
        "triton",
        "import json; print(json.dumps(open('/proc/1/cmdline').read().split(chr(0))))",
    )
    assert found[:2] == ["/opt/voxfleet/bin/python3", "/opt/voxfleet/bin/voxfleet"] or (
        "voxfleet" in found[1] and found[2] == "triton"
    ), found
    # port-forward: the pod's own gRPC port on this machine's loopback, streaming speech.
    with port_forward(kubectl, f"pod/{pod}", 8001) as address:
        speech = say(address, "joe")
    reference = piper_seconds(TEXT)
    assert abs(speech.audio_seconds - reference) <= 0.10 * reference, (speech, reference)


def test_the_gateway_finds_a_voices_pods_through_cluster_dns(
    installation: Installation, joe_voice: dict[str, Any]
) -> None:
    """The gateway's voice table names `<voice>-tts-pods.<namespace>.svc`; inside its pod
    that name resolves, through cluster DNS, to the pods serving the voice."""
    kubectl = installation.kubectl
    gateway = one_pod(installation, GATEWAY_SELECTOR)
    name = f"joe-tts-pods.{NAMESPACE}.svc"

    def answers() -> dict[str, Any] | None:
        serving_ips = sorted(
            p["status"]["podIP"]
            for p in pool_pods(installation)
            if serving(p, "joe") and p.get("status", {}).get("podIP")
        )
        found = exec_python(
            installation,
            gateway,
            "speech-api",
            "import json, socket\n"
            f"infos = socket.getaddrinfo({name!r}, 8001, proto=socket.IPPROTO_TCP)\n"
            "servers = [l.split()[1] for l in open('/etc/resolv.conf') "
            "if l.startswith('nameserver')]\n"
            "print(json.dumps({'ips': sorted({i[4][0] for i in infos}), 'dns': servers}))",
        )
        found["serving"] = serving_ips
        return found if found["ips"] == serving_ips else None

    found = eventually(answers, timeout=60, interval=2, what=f"{name} names joe's pods")
    dns_service = kubectl.run("get", "service", "-n", "kube-system", "kube-dns", "-o", "json")
    assert found["dns"] == [json.loads(dns_service.stdout)["spec"]["clusterIP"]], found


def _pod(name: str, script: str, resources: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": "voxfleet-e2e-limits"}},
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "work",
                    "image": TRITON_IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", script],
                    "resources": resources,
                }
            ],
        },
    }


CPU_USAGE = """
import json, os, time
def used_s():
    if os.path.exists('/sys/fs/cgroup/cpu.stat'):  # cgroup v2
        for line in open('/sys/fs/cgroup/cpu.stat'):
            if line.startswith('usage_usec'):
                return int(line.split()[1]) / 1e6
    return int(open('/sys/fs/cgroup/cpuacct/cpuacct.usage').read()) / 1e9
first, started = used_s(), time.monotonic()
time.sleep(6)
print(json.dumps({'cores': (used_s() - first) / (time.monotonic() - started)}))
"""


def test_a_cpu_limit_holds_a_busy_container_to_its_share(installation: Installation) -> None:
    """Two processes spinning in a container limited to 200m get 0.2 of a core between them
    (CFS quota), however idle the machine's other core is."""
    kubectl = installation.kubectl
    spin = "import os\nos.fork()\nwhile True: pass\n"
    kubectl.apply(_pod("cpu-limited", spin, {"limits": {"cpu": "200m", "memory": "128Mi"}}))
    try:
        eventually(
            lambda: (
                (kubectl.get("pod", "cpu-limited") or {}).get("status", {}).get("phase")
                == "Running"
            ),
            timeout=120,
            what="cpu-limited runs",
        )
        time.sleep(2)
        used = exec_python(installation, "cpu-limited", "work", CPU_USAGE)
    finally:
        kubectl.run("delete", "pod", "cpu-limited", "--wait=false")
    assert 0.05 < used["cores"] <= 0.3, used
    installation.timings["cpu_limited_200m_cores"] = used["cores"]


def test_a_container_over_its_memory_limit_is_oom_killed_and_restarted(
    installation: Installation,
) -> None:
    kubectl = installation.kubectl
    # Touched pages, not just reserved ones: 256 MiB resident against a 64 MiB limit.
    hog = "import time\nx = bytearray(b'\\x01') * (256 << 20)\ntime.sleep(3600)\n"
    kubectl.apply(_pod("memory-limited", hog, {"limits": {"cpu": "500m", "memory": "64Mi"}}))
    try:

        def restarted_after_oom() -> dict[str, Any] | None:
            pod = kubectl.get("pod", "memory-limited") or {}
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                last = (status.get("lastState") or {}).get("terminated") or {}
                if status.get("restartCount", 0) >= 1 and last.get("reason") == "OOMKilled":
                    return dict(status)
            return None

        status = eventually(
            restarted_after_oom, timeout=120, what="memory-limited OOM-killed and restarted"
        )
    finally:
        kubectl.run("delete", "pod", "memory-limited", "--wait=false")
    assert status["lastState"]["terminated"]["exitCode"] == 137, status


# Grows in touched 8 MiB steps inside the container's memory cgroup until the kernel's OOM
# killer has acted there (its oom_kill count rises), then lets go. It gives up its own claim
# on being the victim first (oom_score_adj 0, as low as an unprivileged process may set it;
# the kubelet gives a Burstable pod's processes 900 and more), so the killer takes the pod's
# largest process, the voice host, as it would take a voice host that grew past the limit.
POOL_HOG = """
import json, os, time
with open('/proc/self/oom_score_adj', 'w') as f:
    f.write('0')
def oom_kills():
    for path in ('/sys/fs/cgroup/memory.events', '/sys/fs/cgroup/memory/memory.oom_control'):
        if os.path.exists(path):
            for line in open(path):
                if line.startswith('oom_kill '):
                    return int(line.split()[1])
    return 0
before, held = oom_kills(), []
while oom_kills() == before:
    held.append(bytearray(b'\\x01') * (8 << 20))
held.clear()
print(json.dumps({'before': before, 'after': oom_kills()}))
"""


def test_a_pool_pod_over_its_memory_limit_is_oom_killed_and_heals(
    installation: Installation, joe_voice: dict[str, Any]
) -> None:
    """A pool pod's memory pushed past its limit: the kernel's OOM killer takes its largest
    process, the voice host. Its supervisor starts a new one and loads the voices again; or,
    where the killer also took the pod's main process before the memory was given back, the
    kubelet restarts the container (`OOMKilled`) and the operator loads its voices into it
    again. Either way joe speaks again through its Service, whole, and the pod serves it."""
    kubectl = installation.kubectl
    pod = next(p for p in pool_pods(installation) if serving(p, "joe"))["metadata"]["name"]

    def triton_status() -> dict[str, Any]:
        statuses = (kubectl.get("pod", pod) or {}).get("status", {}).get("containerStatuses")
        return next(s for s in statuses or [] if s["name"] == "triton")

    restarts = triton_status().get("restartCount", 0)
    started = time.monotonic()
    hog = kubectl.run(
        "exec", pod, "-c", "triton", "--", "python3", "-c", POOL_HOG, check=False, timeout=300
    )

    def oom_seen() -> str | None:
        status = triton_status()
        last = (status.get("lastState") or {}).get("terminated") or {}
        if status.get("restartCount", 0) > restarts and last.get("reason") == "OOMKilled":
            return "restarted"
        if "the voice host exited with -9" in kubectl.run("logs", pod, "-c", "triton").stdout:
            return "healed in place"
        return None

    how = eventually(oom_seen, timeout=120, what=f"{pod}'s voice host OOM-killed ({hog.stdout})")

    def speaks() -> Any:
        return stream(installation, joe_voice["status"]["endpoint"], "joe")

    speech = eventually(speaks, timeout=240, interval=2, what="joe speaks again")
    reference = piper_seconds(TEXT)
    assert abs(speech.audio_seconds - reference) <= 0.10 * reference, (speech, reference)
    installation.timings["oom_kill_to_speech_s"] = time.monotonic() - started
    installation.timings["oom_pod_restarted"] = float(how == "restarted")
    eventually(
        lambda: serving(kubectl.get("pod", pod), "joe"),
        timeout=240,
        what=f"{pod} serves joe again",
    )
    with installation.reach_pod(pod, 8003) as address:
        with urllib.request.urlopen(f"http://{address}/ready", timeout=10) as reply:
            assert reply.status == 200
