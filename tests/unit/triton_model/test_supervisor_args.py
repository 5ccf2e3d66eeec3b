"""What the supervisor reads from tritonserver's arguments, and the pod it is rendered into."""

from __future__ import annotations

from voxfleet_operator import names as operator_names
from voxfleet_operator.render.pool import KEY_ENV, triton_args

from engines.contract import names
from engines.pod.supervisor import TritonEndpoints


def test_the_pool_pods_arguments_give_ports_exit_timeout_and_repository_key() -> None:
    args = [arg.replace(f"$({KEY_ENV})", "s3cret") for arg in triton_args()]
    endpoints = TritonEndpoints.from_args(args)
    assert endpoints.http_port == operator_names.HTTP_PORT
    assert endpoints.metrics_port == operator_names.METRICS_PORT
    assert endpoints.exit_timeout_s == 30
    assert endpoints.repository_header == (operator_names.REPOSITORY_HEADER_KEY, "s3cret")


def test_defaults_and_spaced_options() -> None:
    assert TritonEndpoints.from_args([]) == TritonEndpoints()
    spaced = TritonEndpoints.from_args(["--http-port", "9000", "--exit-timeout-secs", "5"])
    assert (spaced.http_port, spaced.exit_timeout_s, spaced.repository_header) == (9000, 5, None)


def test_the_rendered_probes_are_the_supervisors() -> None:
    from voxfleet_operator.pools import Pool
    from voxfleet_operator.render.pool import build_pool_deployment

    deployment = build_pool_deployment(Pool(name="cpu", runtime="onnxruntime"), "tts", "cache")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe, path in (("readinessProbe", names.READY_PATH), ("livenessProbe", names.LIVE_PATH)):
        get = container[probe]["httpGet"]
        assert (ports[get["port"]], get["path"]) == (names.HEALTH_PORT, path)


class FakeProcess:
    def __init__(self, name: str, cmdline: list[str]) -> None:
        self._name, self._cmdline = name, cmdline

    def name(self) -> str:
        return self._name

    def cmdline(self) -> list[str]:
        return self._cmdline


def test_a_stubs_voice_is_read_from_its_instance_name() -> None:
    from engines.pod.supervisor import stub_of

    # As Triton 2.51 starts the Python backend's stub for instance 0 of group 0 of `joe_2`.
    cmdline = [
        "/backends/python/triton_python_backend_stub", "/models/joe_2/1/model.py",
        "triton_python_backend_shm_region_1f2e", "1048576", "1048576", "4242",
        "/backends/python", "336", "joe_2_0_0", "DEFAULT",
    ]  # fmt: skip
    stub = stub_of(FakeProcess("triton_python_backend_stub", cmdline))  # type: ignore[arg-type]
    assert stub is not None
    assert (stub.model, stub.shm_region) == ("joe_2", "triton_python_backend_shm_region_1f2e")
    assert stub_of(FakeProcess("tritonserver", cmdline)) is None  # type: ignore[arg-type]


def test_every_server_loads_voices_without_an_auto_complete_stub(tmp_path) -> None:
    """A voice's model carries its whole config: the pod's tritonserver is told not to start a
    process per load to complete it (the larger part of a voice's load time), whether it runs
    the pool pod's rendered arguments, `voxfleet serve`'s own, or a user's that already say so."""
    from engines.commands.triton import triton_command
    from engines.pod.triton_server import NO_AUTO_COMPLETE, TritonServer

    pool_pod, _ = triton_command(triton_args(), tmp_path)
    server = TritonServer(tmp_path / "models", work_dir=tmp_path).command()
    given, _ = triton_command(["--model-repository=/m", NO_AUTO_COMPLETE], tmp_path)
    for command in (pool_pod, server, given):
        assert command.count(NO_AUTO_COMPLETE) == 1, command
