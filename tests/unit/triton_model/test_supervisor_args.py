"""What the supervisor reads from tritonserver's arguments, and the pod it is rendered into."""

from __future__ import annotations

from voxfleet_operator import names as operator_names
from voxfleet_operator.render.pool import KEY_ENV, triton_args

from engines import names
from engines.supervisor import TritonEndpoints


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
    assert operator_names.HEALTH_PORT == names.HEALTH_PORT
    assert operator_names.SUPERVISOR_READY_PATH == names.READY_PATH
    assert operator_names.SUPERVISOR_LIVE_PATH == names.LIVE_PATH
