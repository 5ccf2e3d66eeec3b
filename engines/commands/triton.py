"""`voxfleet triton ARGS...`: run `tritonserver ARGS...`, ready for the voxfleet stream model.

This is the Triton container's command in a pool pod. With a `tritonserver` on PATH (NVIDIA's
Triton image) it runs that one with the arguments as given; otherwise the one bundled in the
nvidia-pytriton wheel, with the Python backend's stub for the running Python (as
`voxfleet serve` does) and its libraries on the library path. It stays as tritonserver's
supervisor (engines/pod/supervisor.py): it restarts the server when a voice's backend process
dies and loads the voices again, answers the pod's probes on its health port (8003, or
$VOXFLEET_HEALTH_PORT: GET /ready, /live), and on SIGTERM drains streams before stopping it.
With VOXFLEET_MPS=1 (a pool with `mps: true`) the voice host runs on the GPU through a CUDA
MPS daemon of the container's own (engines/pod/mps.py).

Before tritonserver it starts the pod's voice host (engines/pod/voice_host), which runs every
voice of the pod in one process. Its options lead the arguments and are not tritonserver's:
`--voice-host-memory-mib=N` (the pool's memory to place voices in; 0: the device's own) and
`--voice-host-cpu-threads=N` (threads per onnxruntime call: the pod's CPU request).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the pod's code is imported when a pod runs, not to parse the command line
    from engines.pod.voice_host.process import HostOptions

BACKEND_DIRECTORY_ARG = "--backend-directory"
HOST_MEMORY_ARG = "--voice-host-memory-mib"
HOST_THREADS_ARG = "--voice-host-cpu-threads"


def split_host_options(args: list[str]) -> tuple[HostOptions, list[str]]:
    """The voice host's options (`--voice-host-...=N`) and tritonserver's arguments, apart;
    ValueError for a voice host option without a whole number."""
    from engines.pod.voice_host.process import HostOptions

    values = {HOST_MEMORY_ARG: 0, HOST_THREADS_ARG: 0}
    rest = []
    for arg in args:
        name, _, value = arg.partition("=")
        if name not in values:
            rest.append(arg)
            continue
        if not value.isdigit():
            raise ValueError(f"{name} takes a whole number (={value!r} given)")
        values[name] = int(value)
    return HostOptions(
        memory_mib=values[HOST_MEMORY_ARG], cpu_threads=values[HOST_THREADS_ARG]
    ), rest


def triton_command(args: list[str], work_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run tritonserver with `args` (and the flags every
    voxfleet server runs with, `with_pod_flags`)."""
    from engines.pod.triton_server import with_pod_flags

    args = with_pod_flags(args)
    installed = shutil.which("tritonserver")
    if installed:
        return [installed, *args], dict(os.environ)
    from engines.pod.triton_server import prepare_backends, server_env, tritonserver_dist

    binary = str(tritonserver_dist() / "bin" / "tritonserver")
    extra = []
    if not any(arg.startswith(BACKEND_DIRECTORY_ARG) for arg in args):
        extra.append(f"{BACKEND_DIRECTORY_ARG}={prepare_backends(work_dir)}")
    return [binary, *extra, *args], server_env()


def run(triton_args: list[str]) -> int:
    """Run and supervise tritonserver until SIGTERM or SIGINT; returns the exit status."""
    from engines.contract import names
    from engines.pod.mps import MpsDaemon, mps_from_env
    from engines.pod.supervisor import Supervisor, TritonEndpoints
    from engines.pod.triton_server import TritonError

    work_dir = Path(tempfile.mkdtemp(prefix="voxfleet-triton-"))
    try:
        host_options, triton_args = split_host_options(triton_args)
        command, env = triton_command(triton_args, work_dir)
        health_port = int(os.environ.get(names.HEALTH_PORT_ENV) or names.HEALTH_PORT)
        mps = MpsDaemon(work_dir) if mps_from_env() else None
    except (TritonError, ValueError) as error:
        print(f"voxfleet triton: {error}", file=sys.stderr)
        return 2
    supervisor = Supervisor(
        command,
        env,
        TritonEndpoints.from_args(triton_args),
        work_dir,
        health_port,
        mps=mps,
        host_options=host_options,
    )
    supervisor.install_signal_handlers()
    try:
        supervisor.start()
    except (OSError, TritonError) as error:  # the health port is taken, MPS cannot run
        print(f"voxfleet triton: {error}", file=sys.stderr)
        return 2
    return supervisor.run()


def handle(args: argparse.Namespace) -> int:
    return run(list(args.triton_args))


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "triton",
        help="run tritonserver with the given arguments (a pool pod's container command)",
        description=__doc__.split("\n\n")[1] if __doc__ else None,
    )
    # engines.cli hands everything after `triton` over unparsed (tritonserver's own options).
    parser.add_argument("triton_args", nargs=argparse.REMAINDER, help="tritonserver's arguments")
    parser.set_defaults(func=handle)
