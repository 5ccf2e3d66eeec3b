"""A voice whose backend process dies heals itself, and stops are prompt: `voxfleet serve`
and `voxfleet triton` (a pool pod's command, with the pool's own arguments) on a real Triton."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from supervised import Served, running, serve_command, talk_in_background

from engines.client.tts import StreamResult, SynthesisError, stream_tts, synthesize
from engines.commands.local_serving import plan_local_voices
from engines.contract import names
from engines.contract.plan import ServingPlan
from engines.contract.repository import load_request
from engines.pod.ports import free_port

pytestmark = pytest.mark.triton


def kill_under_load(served: Served, victim: Callable[[], psutil.Process], within_s: float) -> float:
    """kill -9 `victim()` with four streams in flight; check what users see until then: the
    pod not ready and every stream ended with UNAVAILABLE, each within `within_s`. Returns
    when it was killed."""
    talkers, results = talk_in_background(served.grpc_url, 4)
    assert served.wait_for(lambda: (served.metric(names.LIVE_STREAMS) or 0) >= 4, 30) is not None
    assert served.ready() == 200
    victim().kill()
    killed_at = time.monotonic()
    # Until it has healed, the pod says it cannot serve.
    assert served.wait_for(lambda: served.ready() == 503, within_s) is not None
    for talker in talkers:
        talker.join(timeout=10)
    for outcome, ended_at in results.values():
        assert isinstance(outcome, SynthesisError), outcome
        assert outcome.code == "UNAVAILABLE", str(outcome)
        later = ended_at - killed_at
        assert later < within_s, f"a stream ended {later:.1f} s later"
    return killed_at


def kill_the_backend_under_load(served: Served) -> None:
    """kill -9 the voice's stub with four streams in flight; check what users would see."""

    def only_stub() -> psutil.Process:
        (stub,) = served.stubs()
        return stub

    killed_at = kill_under_load(served, only_stub, 2.0)
    assert served.live() == 200
    healed = served.wait_for(lambda: served.ready() == 200, 20)
    assert healed is not None, "".join(served.output[-30:])
    assert synthesize(served.grpc_url, "I am back.").audio_seconds > 0.3
    assert time.monotonic() - killed_at < 20
    assert served.metric(names.MODEL_RESTARTS_TOTAL) == 1


def test_serve_heals_a_killed_backend_under_load(engine_cache: Path) -> None:
    command, ports = serve_command(str(engine_cache))
    with running(command, ports) as served:
        kill_the_backend_under_load(served)


def test_serve_heals_one_killed_instance_of_two(engine_cache: Path) -> None:
    """With two stream-model instances, one instance's backend dying is a dead voice too:
    Triton keeps the voice ready and sends part of its streams to the dead one."""
    command, ports = serve_command(str(engine_cache))
    with running([*command, "--instances", "2"], ports) as served:
        first, _ = served.stubs()
        first.kill()

        def said(text: str) -> bool:
            return any(text in line for line in served.output)

        # (The supervisor looks every 0.1 s; on a busy machine its questions to Triton take
        # seconds.)
        died = served.wait_for(lambda: said("of voice 'joe' died; restarting"), 30)
        assert died is not None, "".join(served.output[-30:])
        assert served.wait_for(lambda: said("voxfleet: healed in"), 30) is not None
        assert served.wait_for(lambda: served.ready() == 200, 5) is not None
        assert len(served.stubs()) == 2, "".join(served.output[-30:])
        for _ in range(4):  # Triton spreads them over both instances
            assert synthesize(served.grpc_url, "Both of us are back.").audio_seconds > 0.3
        assert served.metric(names.MODEL_RESTARTS_TOTAL) == 1


def voice_host(served: Served) -> psutil.Process:
    (host,) = [
        child
        for child in psutil.Process(served.process.pid).children(recursive=True)
        if "engines.pod.voice_host" in " ".join(child.cmdline())
    ]
    return host


def test_serve_heals_a_killed_voice_host_under_load(engine_cache: Path) -> None:
    """kill -9 of the voice host, which runs every voice: the streams in flight end with
    UNAVAILABLE at once, the pod is not ready until a new host and server have loaded the
    voices again, and then it speaks."""
    command, ports = serve_command(str(engine_cache))
    with running(command, ports) as served:
        host = voice_host(served)
        kill_under_load(served, lambda: host, 5.0)
        assert served.wait_for(lambda: served.ready() == 200, 60) is not None, "".join(
            served.output[-30:]
        )
        assert voice_host(served).pid != host.pid
        assert synthesize(served.grpc_url, "A new host speaks.").audio_seconds > 0.3


def test_the_health_port_reports_the_servers_memory(engine_cache: Path) -> None:
    """GET /memory: what the operator places voices by (total, used, each voice's footprint),
    and /metrics: the same as gauges for Prometheus."""
    command, ports = serve_command(str(engine_cache))
    with running(command, ports) as served:
        url = f"http://127.0.0.1:{served.health_port}"
        with urllib.request.urlopen(f"{url}{names.MEMORY_PATH}", timeout=5) as reply:
            report = json.loads(reply.read())
        assert report["device"] == "cpu"
        assert report["total_mib"] > report["used_mib"] > report["voices"]["joe"]["mib"] > 10
        assert report["fixed_mib"] == pytest.approx(
            report["used_mib"] - report["voices"]["joe"]["mib"], abs=0.2
        )
        assert report["server_rss_mib"] > 0  # tritonserver and its stream models
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
            text = reply.read().decode()
        assert f'{names.VOICE_MEMORY_BYTES}{{model="joe",device="cpu"}}' in text
        assert f"{names.MEMORY_TOTAL_BYTES}{{" in text


def test_a_killed_serve_takes_its_triton_with_it(engine_cache: Path) -> None:
    """kill -9 of `voxfleet serve` (an OOM kill, a script's timeout): its tritonserver, the
    voice's backend and the voice host do not live on holding the ports (and, on a GPU, its
    memory)."""
    command, ports = serve_command(str(engine_cache))
    with running(command, ports) as served:
        (triton,) = [
            child
            for child in psutil.Process(served.process.pid).children()
            if child.name() == "tritonserver"
        ]
        left = [triton, *served.stubs(), voice_host(served)]
        served.process.kill()
        _, alive = psutil.wait_procs(left, timeout=20)
        # A process that has exited but that no parent has reaped yet (a zombie, reparented to
        # the container's init) holds no port and no memory: it did not live on.
        alive = [p for p in alive if not _exited(p)]
        for process in alive:
            process.kill()  # not left for the tests after this one
        assert not alive, f"still running after serve was killed: {alive}"
        assert served.get(ports[1], "/v2/health/ready") == 0  # Triton's HTTP port is closed


def _exited(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_serve_stops_promptly_after_hung_up_streams_with_sigint_ignored(
    engine_cache: Path, tmp_path: Path
) -> None:
    command, ports = serve_command(str(engine_cache))
    with running(command, ports, ignore_sigint=True) as served:
        chunks = stream_tts(served.grpc_url, "A long story that nobody hears to the end. " * 6)
        next(chunks)
        chunks.close()  # a hang-up mid-stream
        # A whole stream, which `voxfleet say` closes when it has its audio.
        say = [sys.executable, "-m", "engines.cli", "say", "Bye.", "--url", served.grpc_url]
        subprocess.run([*say, "-o", str(tmp_path / "bye.wav")], check=True, timeout=60)
        # The hang-up freed its stream: the two streams counted below are the talkers'.
        idle = served.wait_for(lambda: served.metric(names.LIVE_STREAMS) == 0, 10)
        assert idle is not None, "".join(served.output[-30:])
        talkers, results = talk_in_background(served.grpc_url, 2)
        assert served.wait_for(lambda: (served.metric(names.LIVE_STREAMS) or 0) >= 2, 30)
        signalled = time.monotonic()
        served.process.send_signal(signal.SIGINT)
        assert served.wait_for(lambda: served.ready() == 503, 2) is not None
        with pytest.raises(SynthesisError) as refused:
            synthesize(served.grpc_url, "Too late.")
        assert refused.value.code == "UNAVAILABLE"
        served.process.wait(timeout=60)
        stopped_in = time.monotonic() - signalled
        for talker in talkers:
            talker.join(timeout=5)
        # the streams in flight finished; then the server went at once
        outcomes = [outcome for outcome, _ in results.values()]
        assert len(outcomes) == 2, "".join(served.output[-30:])
        assert all(isinstance(o, StreamResult) for o in outcomes), (outcomes, served.output[-30:])
        last_stream = max(ended for _, ended in results.values()) - signalled
        assert stopped_in < last_stream + 10, (stopped_in, last_stream)
        assert served.process.returncode == 0


def pool_args(key: str, ports: tuple[int, int, int, int], repository: Path) -> list[str]:
    """The pool pod's tritonserver arguments, as the kubelet expands them."""
    from voxfleet_operator.render.pool import KEY_ENV, triton_args

    replaced = []
    for arg in triton_args():
        arg = arg.replace(f"$({KEY_ENV})", key)
        name = arg.split("=", 1)[0]
        value = {
            "--grpc-port": ports[0],
            "--http-port": ports[1],
            "--metrics-port": ports[2],
            "--model-repository": repository,
        }.get(name)
        replaced.append(f"{name}={value}" if value is not None else arg)
    return replaced


@contextmanager
def pool_pod(tmp_path: Path) -> Iterator[tuple[Served, Callable[[ServingPlan], None]]]:
    """`voxfleet triton` with a pool pod's arguments, and a load of a plan through its
    restricted repository API, the operator's way."""
    from voxfleet_operator.names import REPOSITORY_HEADER_KEY

    key = "pod-secret"
    ports = (free_port(), free_port(), free_port(), free_port())
    repository = tmp_path / "models"
    repository.mkdir()
    command = [sys.executable, "-m", "engines.cli", "triton", *pool_args(key, ports, repository)]

    def load(plan: ServingPlan) -> None:
        request = urllib.request.Request(
            f"http://127.0.0.1:{ports[1]}/v2/repository/models/{plan.name}/load",
            data=json.dumps(load_request(plan)).encode(),
            headers={REPOSITORY_HEADER_KEY: key},
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=120) as reply:
            assert reply.status == 200

    env = {names.HEALTH_PORT_ENV: str(ports[3])}
    with running(command, ports, env=env, ready_line=None) as served:
        assert served.wait_for(lambda: served.get(ports[1], "/v2/health/live") == 200, 60)
        yield served, load


def test_the_pool_pods_supervisor_reloads_a_killed_voice(
    engine_cache: Path, tmp_path: Path
) -> None:
    with pool_pod(tmp_path) as (served, load):
        (plan,) = plan_local_voices(["joe"], engine_cache)
        load(plan)
        assert served.wait_for(lambda: served.ready() == 200, 10) is not None
        kill_the_backend_under_load(served)
        signalled = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=30) == 0
        assert time.monotonic() - signalled < 10


def test_a_reload_with_fewer_or_more_instances_is_not_a_dead_voice(
    engine_cache: Path, tmp_path: Path
) -> None:
    """The operator reloads a voice whose `batching.instances` changed: the stubs that end
    with the old config are not a backend that died, and nothing is restarted."""
    from dataclasses import replace

    (plan,) = plan_local_voices(["joe"], engine_cache)
    with pool_pod(tmp_path) as (served, load_plan):

        def load(instances: int) -> None:
            load_plan(replace(plan, instances=instances))

        load(2)
        assert served.wait_for(lambda: len(served.stubs()) == 2, 30) is not None
        assert served.wait_for(lambda: served.ready() == 200, 10) is not None
        for instances in (1, 2):
            load(instances)
            # Triton 2.51 ends the old configuration's stubs once the new ones are loaded,
            # within about 3 s. The stream below must not keep them: when the client cancelled
            # its finished stream, Triton kept the old model referenced in most runs here and
            # its stub never ended (engines.client.tts._close_stream). Every old stub must end,
            # and its end must not be taken for a death.
            settled = served.wait_for(lambda n=instances: len(served.stubs()) == n, 30)
            assert settled is not None, "".join(served.output[-30:])
            time.sleep(2)  # the supervisor polls every 0.1 s: time to mistake it for a death
            assert served.ready() == 200
            assert not any("died; restarting" in line for line in served.output), "".join(
                served.output[-30:]
            )
            assert synthesize(served.grpc_url, "Still the same voice.").audio_seconds > 0.3
        assert served.metric(names.MODEL_RESTARTS_TOTAL) == 0
