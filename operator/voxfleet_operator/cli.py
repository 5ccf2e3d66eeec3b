"""`voxfleet crd`, `voxfleet render` and `voxfleet operator`."""

from __future__ import annotations

import argparse
import sys
from typing import Any


def _dump_yaml(documents: list[dict[str, Any]]) -> str:
    import yaml

    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)


def crd_command(args: argparse.Namespace) -> int:
    from voxfleet_operator.crd import build_crd

    sys.stdout.write(_dump_yaml([build_crd()]))
    return 0


def register(subparsers: Any) -> None:
    crd = subparsers.add_parser(
        "crd", help="print the TTSVoice CustomResourceDefinition as YAML"
    )
    crd.set_defaults(func=crd_command)
