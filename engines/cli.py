"""The `voxfleet` command. Each subcommand lives in its own module and registers itself.

A command module exposes `register(subparsers)`, which adds its parser and sets
`func=handler`, where `handler(args) -> int` is the exit status.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# Data-plane commands first, then the control plane's. A module that cannot be imported
# (an optional part not installed) leaves its commands out instead of breaking the CLI.
COMMAND_MODULES = (
    "engines.commands.serve",
    "engines.commands.api",
    "engines.commands.triton",
    "engines.commands.say",
    "engines.commands.demo",
    "engines.commands.build_engines",
    "engines.bench.cli",
    "voxfleet_operator.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="voxfleet",
        description="Streaming text-to-speech on NVIDIA Triton, from a laptop to Kubernetes.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name is not None and name.startswith(error.name):
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    if raw[:1] == ["triton"]:
        # tritonserver's options are its own: passed on as they are, never parsed here.
        from engines.commands.triton import run

        return run(raw[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
