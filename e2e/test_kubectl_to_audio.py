"""`helm install`, then `kubectl apply` to audio: the scenarios of a user's first day with
voxfleet, in order, ending with `helm upgrade` and `helm uninstall`.

One installation (see installation.py) serves every scenario; each scenario leaves the
cluster as the next one expects it (joe and joe-fast on the CPU pool, the pool's size).
Durations are compared with piper-tts's own synthesis of the same text; times that a user
would feel (apply to first audio, recovery after a crash) are reported at the end of the run.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from e2e_support import (
    CHART,
    NAMESPACE,
    POOL,
    REAL_CLUSTER,
    RELEASE,
    VALUES,
    condition,
    eventually,
    parse_endpoint,
)
from installation import OPERATOR_SELECTOR, Installation, describe
from speech import LONG_TEXT, TEXT, SayError, Speech, piper_seconds, say
from voices import (
    POOL_DEPLOYMENT,
    POOL_PODS,
    model_stats,
    pool_pods,
    ready_voice,
    say_many_through,
    serving,
    stream,
    voice,
)


@pytest.fixture(scope="module")
def joe(installation: Installation) -> dict[str, Any]:
    """joe applied with kubectl and streaming: the first scenario, shared by the rest."""
    started = time.monotonic()
    out = installation.kubectl.apply(voice("joe"))
    assert "ttsvoice.voxfleet.io/joe created" in out
    obj = ready_voice(installation, "joe", timeout=300)
    try:
        first = stream(installation, obj["status"]["endpoint"], "joe")
    except SayError as error:
        # What the Service selects on, as the cluster sees it now: its pods' labels and
        # readiness (a refusal right after Ready said nothing of them).
        seen = [
            {
                "pod": p["metadata"]["name"],
                "labels": p["metadata"].get("labels"),
                "conditions": (p.get("status") or {}).get("conditions"),
            }
            for p in pool_pods(installation)
        ]
        raise AssertionError(f"{error}\npool pods: {json.dumps(seen)[:3000]}") from None
    installation.timings["apply_to_first_audio_s"] = first.first_audio_at - started
    installation.timings["joe_first_audio_ms"] = first.first_audio_s * 1000
    return {"voice": obj, "first": first}


def test_joe_applied_with_kubectl_speaks_as_long_as_piper(
    installation: Installation, joe: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    obj = joe["voice"]
    status = obj["status"]
    assert status["observedGeneration"] == obj["metadata"]["generation"]
    engine = condition(obj, "EngineReady")
    assert engine and engine["status"] == "True", status
    service, namespace, port = parse_endpoint(status["endpoint"])
    assert (service, namespace, port) == ("joe-tts", NAMESPACE, 8001)
    # The engine Job really ran `voxfleet build-engines` and completed.
    jobs = kubectl.items("jobs", "voxfleet.io/voice=joe")
    assert len(jobs) == 1, [j["metadata"]["name"] for j in jobs]
    job_spec = jobs[0]["spec"]["template"]["spec"]["containers"][0]
    assert "build-engines" in job_spec["command"] + job_spec.get("args", [])
    assert condition(jobs[0], "Complete")["status"] == "True"  # type: ignore[index]
    # The pool pod runs tritonserver as rendered: explicit model control, restricted API.
    pods = pool_pods(installation)
    assert len(pods) == 1 and serving(pods[0], "joe")
    args = " ".join(pods[0]["spec"]["containers"][0].get("args", []))
    assert "--model-control-mode=explicit" in args
    assert "--grpc-restricted-protocol=model-repository:" in args
    # Installed by `helm install`: the release is a Secret of Helm's own, and the operator
    # runs as the chart's Deployment under the chart's ServiceAccount.
    (release,) = kubectl.items("secrets", f"owner=helm,name={RELEASE}")
    assert release["type"] == "helm.sh/release.v1"
    assert release["metadata"]["labels"]["status"] == "deployed"
    (operator_pod,) = kubectl.items("pods", OPERATOR_SELECTOR)
    account = operator_pod["spec"]["serviceAccountName"]
    assert kubectl.get("serviceaccount", account) is not None
    assert account != "default"
    # `kubectl get ttsv` shows what a user looks for.
    table = kubectl.run("get", "ttsv", "joe").stdout.splitlines()
    assert table[0].split()[:5] == ["NAME", "PHASE", "POOL", "ENDPOINT", "READY"]
    assert table[1].split()[:5] == ["joe", "Ready", POOL, status["endpoint"], "True"]
    # Speech through the voice's Service, as long as piper's own synthesis of the text.
    first: Speech = joe["first"]
    assert first.chunks > 1, "the audio came in one piece, not streamed"
    reference = piper_seconds(TEXT)
    assert abs(first.audio_seconds - reference) <= 0.10 * reference, (
        first.audio_seconds,
        reference,
    )


def test_second_voice_shares_the_pool_and_speaks_faster(
    installation: Installation, joe: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    kubectl.apply(voice("joe-fast", speakingRate=1.25))
    fast = ready_voice(installation, "joe-fast", timeout=240)
    pods = pool_pods(installation)
    assert len(pods) == 1, "a second voice on the pool needs no second pod"
    assert serving(pods[0], "joe") and serving(pods[0], "joe-fast")
    normal = stream(installation, joe["voice"]["status"]["endpoint"], "joe")
    quick = stream(installation, fast["status"]["endpoint"], "joe-fast")
    # ~1.25x shorter, as piper makes it at that rate (pauses between sentences do not scale).
    ratio = normal.audio_seconds / quick.audio_seconds
    piper_ratio = piper_seconds(TEXT) / piper_seconds(TEXT, 1.25)
    assert 1.1 < piper_ratio <= 1.25
    assert abs(ratio - piper_ratio) <= 0.1 * piper_ratio, (normal, quick, piper_ratio)
    reference = piper_seconds(TEXT, 1.25)
    assert abs(quick.audio_seconds - reference) <= 0.10 * reference, (quick, reference)
    # Both are models of the same Triton process.
    stats = model_stats(installation, pods[0]["metadata"]["name"])
    assert stats.get("joe", 0) >= 1 and stats.get("joe-fast", 0) >= 1, stats


def test_scaling_the_pool_loads_both_voices_and_spreads_streams(
    installation: Installation, joe: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    kubectl.run("scale", "deployment", POOL_DEPLOYMENT, "--replicas=2")

    def both_pods_serve_both() -> list[dict[str, Any]] | None:
        pods = pool_pods(installation)
        if len(pods) == 2 and all(serving(p, "joe") and serving(p, "joe-fast") for p in pods):
            return pods
        return None

    pods = eventually(both_pods_serve_both, timeout=240, what="two pool pods serve both voices")
    if REAL_CLUSTER:
        pytest.skip("kubectl port-forward to a Service pins one pod: spreading is local-only")
    before = {p["metadata"]["name"]: model_stats(installation, p["metadata"]["name"]) for p in pods}
    # Six clients, six connections: the Service spreads connections, as kube-proxy does.
    say_many_through(installation, joe["voice"]["status"]["endpoint"], "joe", 6)
    after = {p["metadata"]["name"]: model_stats(installation, p["metadata"]["name"]) for p in pods}
    served = {name: after[name].get("joe", 0) - before[name].get("joe", 0) for name in after}
    assert sum(served.values()) == 6, served
    assert all(count >= 1 for count in served.values()), f"one pod took every stream: {served}"


def test_rolling_update_with_streams_in_flight_loses_none(
    installation: Installation, joe: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    endpoint = joe["voice"]["status"]["endpoint"]
    old = {p["metadata"]["name"] for p in pool_pods(installation)}
    stop = threading.Event()
    streams: list[dict[str, Any]] = []  # wall-clock start and end, audio or error, per stream
    deleted: dict[str, float] = {}  # old pod -> wall-clock time it was marked for deletion

    def client(address: str) -> None:
        """A user's client: `voxfleet say` again and again (a new connection each time)."""
        while not stop.is_set():
            record: dict[str, Any] = {"started": time.time()}
            try:
                record["audio_seconds"] = say(address, "joe", LONG_TEXT).audio_seconds
            except SayError as error:
                record["error"] = str(error)
            record["ended"] = time.time()
            streams.append(record)

    with installation.reach_service(endpoint) as address, ThreadPoolExecutor(8) as pool:
        # Eight clients stream back to back all through the update, so that streams are in
        # flight whenever an old pod is taken out.
        clients = [pool.submit(client, address) for _ in range(8)]
        try:
            time.sleep(3)
            started = time.time()
            kubectl.run("rollout", "restart", "deployment", POOL_DEPLOYMENT)
            deadline = time.monotonic() + 300
            while True:
                pods = kubectl.items("pods", POOL_PODS)
                for pod in pods:
                    name = pod["metadata"]["name"]
                    if name in old and pod["metadata"].get("deletionTimestamp"):
                        deleted.setdefault(name, time.time())
                live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
                if (
                    not {p["metadata"]["name"] for p in live} & old
                    and len(live) == 2
                    and all(serving(p, "joe") for p in live)
                ):
                    break
                assert time.monotonic() < deadline, "the rolling update did not finish in 300 s"
                time.sleep(0.5)
            # The clients go on until eight more streams, begun after the update, are done.
            eventually(
                lambda: len([s for s in list(streams) if s["started"] > started]) >= 8,
                timeout=180,
                what="eight streams begun after the update started",
            )
        finally:
            stop.set()
            for future in clients:
                future.result(timeout=300)
    # A stream every pod it reached refused before its first audio, because they were full
    # (eight clients can be more than two pods hold on a busy machine), was never cut.
    refused = [s for s in streams if "(RESOURCE_EXHAUSTED)" in s.get("error", "")]
    errors = [s["error"] for s in streams if "error" in s and s not in refused]
    assert not errors, f"{len(errors)} of {len(streams)} streams failed: {errors[:3]}"
    installation.timings["rolling_update_refused_streams"] = float(len(refused))
    reference = piper_seconds(LONG_TEXT)
    spoken = [s for s in streams if "audio_seconds" in s]
    short = [s["audio_seconds"] for s in spoken if s["audio_seconds"] < 0.9 * reference]
    assert not short, f"streams cut short by the update: {short} (piper: {reference:.2f} s)"
    assert set(deleted) == old
    crossing = [s for s in spoken if any(s["started"] < t < s["ended"] for t in deleted.values())]
    installation.timings["rolling_update_streams"] = float(len(streams))
    installation.timings["rolling_update_streams_across_a_pod_deletion"] = float(len(crossing))
    assert crossing, "no stream was in flight when an old pod was taken out: nothing tested"


def test_killed_tritonserver_restarts_and_voices_come_back(
    installation: Installation, joe: dict[str, Any]
) -> None:
    """A pool pod's tritonserver killed: its supervisor (`voxfleet triton`, the container's
    main process) starts it again and loads the pod's voices again through the repository
    API; should the supervisor itself give up, the kubelet restarts the container and the
    operator reloads the voices. Either way, streams succeed again through the Service."""
    kubectl = installation.kubectl
    pod = pool_pods(installation)[0]
    name = pod["metadata"]["name"]
    killed_at = time.monotonic()
    assert installation.kill_process(name, "tritonserver") >= 1

    def pod_ready_again() -> bool:
        status = kubectl.get("pod", name)["status"]
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )

    # The pod leaves its Services while it heals, then comes back.
    eventually(pod_ready_again, timeout=180, what=f"{name} ready again after the kill")
    endpoint = joe["voice"]["status"]["endpoint"]
    # Streams through the Service succeed again, on every pod (one client per connection).
    deadline = time.monotonic() + 120
    while True:
        try:
            speeches = say_many_through(installation, endpoint, "joe", 4)
            break
        except SayError:
            assert time.monotonic() < deadline, "streams still fail 120 s after the pod healed"
            time.sleep(1)
    installation.timings["kill_to_recovery_s"] = time.monotonic() - killed_at
    assert all(
        abs(s.audio_seconds - piper_seconds(TEXT)) <= 0.1 * piper_seconds(TEXT) for s in speeches
    )


def test_deleting_a_voice_finishes_its_streams_and_removes_it(
    installation: Installation, joe: dict[str, Any]
) -> None:
    kubectl = installation.kubectl
    fast = kubectl.get("ttsv", "joe-fast")
    endpoint = fast["status"]["endpoint"]
    text = " ".join([LONG_TEXT] * 3)
    reference = piper_seconds(text, 1.25)

    def accepted() -> int:
        """joe-fast's streams accepted so far, by the pool pods' own count."""
        return sum(
            model_stats(installation, p["metadata"]["name"]).get("joe-fast", 0)
            for p in pool_pods(installation)
        )

    before = accepted()
    with installation.reach_service(endpoint) as address, ThreadPoolExecutor(4) as pool:
        in_flight = [pool.submit(say, address, "joe-fast", text) for _ in range(4)]
        # The voice goes only once all four streams are in flight: a client whose request came
        # after it (four `voxfleet say` processes starting on a busy machine took over 3 s once)
        # would rightly be told the voice is gone, which is not what this tests.
        eventually(
            lambda: accepted() >= before + 4,
            timeout=60,
            interval=0.2,
            what="the four streams were accepted",
        )
        kubectl.run("delete", "ttsv", "joe-fast", "--wait=false")
        unlabelled = eventually(
            lambda: (
                not any(serving(p, "joe-fast") for p in pool_pods(installation))
                and time.monotonic()
            ),
            timeout=60,
            interval=0.2,
            what="the pods no longer serve joe-fast",
        )
        finished = [future.result() for future in in_flight]
    crossing = sum(1 for speech in finished if speech.finished > unlabelled)
    assert crossing >= 1, "every stream ended before the voice was taken off: nothing tested"
    for speech in finished:
        assert abs(speech.audio_seconds - reference) <= 0.10 * reference, (
            "a stream was cut short by the deletion",
            [s.audio_seconds for s in finished],
            reference,
        )

    def gone() -> bool:
        if kubectl.get("ttsv", "joe-fast") is not None:
            return False
        if any(serving(p, "joe-fast") for p in pool_pods(installation)):
            return False
        if kubectl.get("service", "joe-fast-tts") is not None:
            return False
        return not kubectl.items("jobs", "voxfleet.io/voice=joe-fast")

    eventually(gone, timeout=120, what="joe-fast, its labels and its children are gone")
    for pod in pool_pods(installation):
        with installation.reach_pod(pod["metadata"]["name"], 8000) as address:
            request = urllib.request.Request(
                f"http://{address}/v2/repository/index", data=b"{}", method="POST"
            )
            try:
                index = urllib.request.urlopen(request, timeout=10).read().decode()
            except urllib.error.HTTPError as error:  # the index may be restricted too
                assert error.code in (401, 403), error
                index = ""
            if index:
                assert '"name":"joe-fast","version":"1","state":"READY"' not in index
            ready = urllib.request.Request(f"http://{address}/v2/models/joe-fast/ready")
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(ready, timeout=10)
    # The other voice is unaffected: it streams, whole, on every pod. In full-suite runs a
    # connection through the Service was once reset right after the deletion (cause not
    # found; docs/e2e.md): such refusals are counted and reported, and must clear in 30 s.
    deadline, refused = time.monotonic() + 30, 0
    while True:
        try:
            speeches = say_many_through(installation, joe["voice"]["status"]["endpoint"], "joe", 4)
            break
        except SayError:
            refused += 1
            assert time.monotonic() < deadline, "the other voice still fails 30 s after"
            time.sleep(1)
    installation.timings["other_voice_refusals_after_delete"] = refused
    assert all(
        abs(s.audio_seconds - piper_seconds(TEXT)) <= 0.10 * piper_seconds(TEXT) for s in speeches
    )


def test_a_voice_whose_source_is_missing_fails_with_the_jobs_message(
    installation: Installation,
) -> None:
    kubectl = installation.kubectl
    kubectl.apply(voice("ghost", path="nowhere/ghost.onnx"))

    def failed() -> dict[str, Any] | None:
        obj = kubectl.get("ttsv", "ghost")
        return obj if (obj or {}).get("status", {}).get("phase") == "Failed" else None

    try:
        obj = eventually(failed, timeout=180, what="ghost reaches phase Failed")
    except AssertionError as error:
        raise AssertionError(
            f"{error}\n{describe(kubectl, 'ttsv/ghost')}\n"
            + "\n".join(
                f"{p['metadata']['name']}: {json.dumps(p.get('status'))[:800]}"
                for p in kubectl.items("pods", "voxfleet.io/voice=ghost")
            )
            + "\n"
            + json.dumps(
                [j.get("status") for j in kubectl.items("jobs", "voxfleet.io/voice=ghost")]
            )
        ) from None
    engine = condition(obj, "EngineReady")
    assert engine and engine["status"] == "False"
    jobs = kubectl.items("jobs", "voxfleet.io/voice=ghost")
    assert len(jobs) == 1
    job_failed = condition(jobs[0], "Failed")
    assert job_failed and job_failed["status"] == "True", jobs[0]["status"]
    assert job_failed["message"] in engine.get("message", ""), (engine, job_failed)
    # No retry storm: the failed Job is not recreated, and its pods stop at its backoffLimit.
    pods_then = len(kubectl.items("pods", f"job-name={jobs[0]['metadata']['name']}"))
    time.sleep(5)
    jobs_later = kubectl.items("jobs", "voxfleet.io/voice=ghost")
    assert [j["metadata"]["uid"] for j in jobs_later] == [jobs[0]["metadata"]["uid"]]
    pods_later = kubectl.items("pods", f"job-name={jobs[0]['metadata']['name']}")
    assert len(pods_later) == pods_then
    assert pods_then <= int(jobs[0]["spec"].get("backoffLimit", 6)) + 1
    kubectl.run("delete", "ttsv", "ghost")


@pytest.mark.skipif(REAL_CLUSTER, reason="runs Prometheus and prometheus-adapter beside it")
def test_the_pool_hpa_reads_the_charts_metrics_through_the_real_adapter(
    installation: Installation, joe: dict[str, Any], tmp_path: Path
) -> None:
    """The autoscaling loop's plumbing, real end to end: Prometheus scrapes the pool pods
    the ServiceMonitor selects, prometheus-adapter serves the chart's rules through the API
    server's aggregation layer, and the controller manager's HPA controller reads them."""
    from hpa.adapter import MetricsAdapter, adapter_config_from_chart
    from hpa.controllers import AutoscalingWatch, current_metrics_milli
    from hpa.prometheus import PrometheusServer

    kubectl = installation.kubectl
    config = adapter_config_from_chart("helm", "--set", "prometheusAdapter.rules.rateWindow=30s")
    with (
        PrometheusServer("1s", work_dir=tmp_path / "prometheus") as prometheus,
        MetricsAdapter(
            installation.cluster.control_plane,
            kubectl,
            prometheus.url,
            config,
            tmp_path / "adapter",
        ) as adapter,
    ):
        watch = AutoscalingWatch(kubectl, NAMESPACE, prometheus, target_refresh_s=1).start()
        try:
            endpoint = joe["voice"]["status"]["endpoint"]

            def read_by_the_hpa() -> dict[str, Any] | None:
                stream(installation, endpoint, "joe")  # first-audio samples to read
                hpa = kubectl.get("hpa", POOL_DEPLOYMENT) or {}
                active = condition(hpa, "ScalingActive") or {}
                values = current_metrics_milli(hpa)
                # A window without streams reads 0 (after the scale-out scenarios, a pod
                # that served none of them): keep streaming until the HPA reads a real p95.
                if (
                    active.get("status") == "True"
                    and (values.get("voxfleet_first_audio_p95_seconds") or 0) > 0
                ):
                    return hpa
                return None

            hpa = eventually(
                read_by_the_hpa,
                timeout=180,
                interval=2,
                what="the pool HPA reads the first-audio p95 from the adapter",
            )
            voice_p95 = adapter.metric(
                NAMESPACE, "ttsvoices.voxfleet.io", "joe", "voxfleet_voice_first_audio_p95_seconds"
            )
        finally:
            watch.stop()
    p95_ms = current_metrics_milli(hpa)["voxfleet_first_audio_p95_seconds"]
    assert p95_ms is not None and 0 < p95_ms < 30_000, hpa["status"]
    assert voice_p95 is not None and voice_p95 > 0
    installation.timings["hpa_first_audio_p95_ms"] = float(p95_ms)


def _operator_cluster_role(kubectl: Any) -> dict[str, Any]:
    roles = kubectl.items("clusterroles", f"app.kubernetes.io/instance={RELEASE}")
    (role,) = [
        r
        for r in roles
        if any("ttsvoices" in rule.get("resources", []) for rule in r.get("rules") or [])
    ]
    return dict(role)


def test_an_operator_denied_a_verb_says_so_in_the_voice_status_until_helm_upgrade(
    installation: Installation,
) -> None:
    """RBAC that lacks one verb (create Services) is a clear failure in the voice's status,
    not a silent retry loop; `helm upgrade` puts the chart's RBAC back and the voice then
    becomes Ready without being touched."""
    kubectl, helm = installation.kubectl, installation.helm
    assert helm is not None
    role = _operator_cluster_role(kubectl)
    for rule in role["rules"]:
        if rule.get("resources") == ["services"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "create"]
    for key in ("resourceVersion", "managedFields", "uid", "creationTimestamp"):
        role["metadata"].pop(key, None)
    kubectl.run("replace", "-f", "-", stdin=json.dumps(role))
    kubectl.apply(voice("denied"))

    def refused() -> dict[str, Any] | None:
        obj = kubectl.get("ttsv", "denied")
        available = condition(obj, "Available")
        if available and available.get("reason") == "Forbidden":
            return obj
        return None

    obj = eventually(refused, timeout=120, what="denied reports the refusal in its status")
    message = condition(obj, "Available")["message"]  # type: ignore[index]
    assert obj["status"]["phase"] == "Failed"
    assert 'cannot create resource "services"' in message, message
    assert "Grant it to the operator's ServiceAccount" in message
    assert kubectl.get("service", "denied-tts") is None
    # It stays so, unflapping, while the operator waits to try again.
    time.sleep(5)
    assert kubectl.get("ttsv", "denied")["status"] == obj["status"]

    # Helm 4 applies server-side: the fields `kubectl replace` took are another manager's
    # now, and a plain upgrade stops at the conflict and names it; --force-conflicts takes
    # them back, as Helm's documentation says.
    refused_upgrade = helm.run(
        "upgrade", RELEASE, str(CHART), "-f", str(VALUES), "--reuse-values", check=False
    )
    assert refused_upgrade.returncode != 0
    assert 'conflict with \\"kubectl-replace\\"' in refused_upgrade.stderr or (
        'conflict with "kubectl-replace"' in refused_upgrade.stderr
    ), refused_upgrade.stderr
    upgraded = helm.run(
        "upgrade", RELEASE, str(CHART), "-f", str(VALUES), "--reuse-values", "--force-conflicts"
    )
    assert "has been upgraded" in upgraded.stdout, upgraded.stdout
    secrets = kubectl.items("secrets", f"owner=helm,name={RELEASE}")
    statuses = {
        s["metadata"]["labels"]["version"]: s["metadata"]["labels"]["status"] for s in secrets
    }
    assert statuses == {"1": "superseded", "2": "failed", "3": "deployed"}, statuses
    rules = _operator_cluster_role(kubectl)["rules"]
    assert any(r.get("resources") == ["services"] and "create" in r["verbs"] for r in rules)
    ready_voice(installation, "denied", timeout=180)
    kubectl.run("delete", "ttsv", "denied")


@pytest.mark.uninstalls
def test_helm_uninstall_removes_the_release_and_keeps_the_crd(
    installation: Installation,
) -> None:
    """Last: `helm uninstall` takes the operator, its RBAC and the release's Secrets away;
    the CRD stays (Helm never deletes crds/), so the voices are still there to read."""
    kubectl, helm = installation.kubectl, installation.helm
    assert helm is not None
    result = helm.run("uninstall", RELEASE, "--wait", "--timeout", "120s")
    assert f'release "{RELEASE}" uninstalled' in result.stdout, result.stdout
    assert not kubectl.items("secrets", f"owner=helm,name={RELEASE}")
    assert not kubectl.items("deployments", OPERATOR_SELECTOR)
    assert not kubectl.items("clusterroles", f"app.kubernetes.io/instance={RELEASE}")
    eventually(
        lambda: not kubectl.items("pods", OPERATOR_SELECTOR),
        timeout=120,
        what="the operator's pod is gone",
    )
    assert kubectl.get("ttsv", "joe") is not None
