"""`voxfleet triton ARGS...`: run `tritonserver ARGS...`, ready for the voxfleet stream model.

This is the Triton container's command in a pool pod. With a `tritonserver` on PATH (NVIDIA's
Triton image) it runs that one with the arguments as given; otherwise the one bundled in the
nvidia-pytriton wheel, with the Python backend's stub for the running Python (as
`voxfleet serve` does) and its libraries on the library path. The process replaces itself
with tritonserver, so the kubelet's signals and exit codes are Triton's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

BACKEND_DIRECTORY_ARG = "--backend-directory"


def triton_command(args: list[str], work_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The command and environment that run tritonserver with `args`."""
    installed = shutil.which("tritonserver")
    if installed:
        return [installed, *args], dict(os.environ)
    from engines.triton_server import prepare_backends, server_env, tritonserver_dist

    binary = str(tritonserver_dist() / "bin" / "tritonserver")
    extra = []
    if not any(arg.startswith(BACKEND_DIRECTORY_ARG) for arg in args):
        extra.append(f"{BACKEND_DIRECTORY_ARG}={prepare_backends(work_dir)}")
    return [binary, *extra, *args], server_env()


def run(triton_args: list[str]) -> int:
    """Replace this process with tritonserver; returns only on an error."""
    from engines.triton_server import TritonError

    work_dir = Path(tempfile.mkdtemp(prefix="voxfleet-triton-"))
    try:
        command, env = triton_command(triton_args, work_dir)
    except TritonError as error:
        print(f"voxfleet triton: {error}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)
    return 0  # not reached


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
