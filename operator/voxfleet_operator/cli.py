"""`voxfleet crd`, `voxfleet render` and `voxfleet operator`."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any


def _dump_yaml(documents: list[dict[str, Any]]) -> str:
    import yaml

    class NoAliasDumper(yaml.SafeDumper):
        # Anchors and aliases are valid YAML but confuse readers and some tools.
        def ignore_aliases(self, data: Any) -> bool:
            return True

    return yaml.dump_all(documents, Dumper=NoAliasDumper, sort_keys=False, default_flow_style=False)


def crd_command(args: argparse.Namespace) -> int:
    from voxfleet_operator.crd import build_crd

    sys.stdout.write(_dump_yaml([build_crd()]))
    return 0


def render_command(args: argparse.Namespace) -> int:
    import yaml

    from voxfleet_operator.config import (
        DEFAULT_ENGINE_CACHE_PVC,
        ENGINE_CACHE_PVC_ENV,
        REPOSITORY_KEY_FILE_ENV,
        ConfigError,
        read_repository_key,
    )
    from voxfleet_operator.pools import PoolsConfigError, load_pools
    from voxfleet_operator.render import render_voices
    from voxfleet_operator.voices import InvalidVoice, voice_from_object

    try:
        pools = load_pools(args.pools)
    except PoolsConfigError as error:
        print(f"voxfleet render: {error}", file=sys.stderr)
        return 2
    voices = []
    for path in args.filename:
        try:
            with sys.stdin if path == "-" else open(path) as stream:
                documents = [d for d in yaml.safe_load_all(stream) if d is not None]
        except OSError as error:
            print(f"voxfleet render: cannot read {path}: {error.strerror}", file=sys.stderr)
            return 2
        except yaml.YAMLError as error:
            print(f"voxfleet render: {path} is not valid YAML: {error}", file=sys.stderr)
            return 2
        for index, document in enumerate(documents):
            try:
                if not isinstance(document, dict):
                    raise InvalidVoice("NotATTSVoice", "the document is not a mapping")
                voices.append(voice_from_object(document, pools, args.namespace))
            except InvalidVoice as error:
                print(
                    f"voxfleet render: {path} document {index + 1}: {error.reason}: {error}",
                    file=sys.stderr,
                )
                return 1
    if not voices:
        print("voxfleet render: no TTSVoice in the input", file=sys.stderr)
        return 1
    key = None
    key_file = args.repository_key_file or os.environ.get(REPOSITORY_KEY_FILE_ENV)
    if key_file:
        try:
            key = read_repository_key(key_file)
        except ConfigError as error:
            print(f"voxfleet render: {error}", file=sys.stderr)
            return 2
    objects = render_voices(
        voices,
        pools,
        args.engine_cache_pvc or os.environ.get(ENGINE_CACHE_PVC_ENV) or DEFAULT_ENGINE_CACHE_PVC,
        service_monitor=not args.no_service_monitor,
        repository_key=key,
    )
    sys.stdout.write(_dump_yaml(objects))
    return 0


def operator_command(args: argparse.Namespace) -> int:
    from voxfleet_operator.runner import run_operator

    return run_operator(namespaces=args.namespace, verbose=args.verbose, liveness=args.liveness)


def register(subparsers: Any) -> None:
    crd = subparsers.add_parser("crd", help="print the TTSVoice CustomResourceDefinition as YAML")
    crd.set_defaults(func=crd_command)

    render = subparsers.add_parser(
        "render",
        help="print, as YAML, every object the operator would create for some TTSVoices",
        description="Offline: reads TTSVoice documents and prints the Jobs, Deployments, "
        "Services, HPAs, PDBs and ServiceMonitors the operator would create, ready for "
        "`kubectl apply --dry-run=server -f -`. Owner references are left out (they need "
        "the live objects' uids).",
    )
    render.add_argument(
        "-f",
        "--filename",
        action="append",
        required=True,
        help="YAML file with one or more TTSVoice documents ('-' for stdin); repeatable",
    )
    render.add_argument(
        "--pools",
        default=None,
        help="pools YAML (default: $VOXFLEET_POOLS_FILE, else one built-in T4 pool)",
    )
    render.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace of voices that name none (default: default)",
    )
    render.add_argument(
        "--engine-cache-pvc",
        default=None,
        help="engine cache PVC name (default: $VOXFLEET_ENGINE_CACHE_PVC or voxfleet-engine-cache)",
    )
    render.add_argument(
        "--repository-key-file",
        default=None,
        help="also render the namespace's repository-key Secret from this file "
        "(default: $VOXFLEET_REPOSITORY_KEY_FILE; left out when neither is set)",
    )
    render.add_argument(
        "--no-service-monitor",
        action="store_true",
        help="leave out the ServiceMonitor (clusters without the Prometheus operator)",
    )
    render.set_defaults(func=render_command)

    operator = subparsers.add_parser(
        "operator",
        help="run the TTSVoice operator (kopf) against the current kubeconfig",
        description="Configured by VOXFLEET_POOLS_FILE, VOXFLEET_WATCH_NAMESPACES, "
        "VOXFLEET_REPOSITORY_KEY_FILE and VOXFLEET_ENGINE_CACHE_PVC.",
    )
    operator.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=None,
        help="watch only this namespace (repeatable; default: $VOXFLEET_WATCH_NAMESPACES, "
        "else all namespaces)",
    )
    operator.add_argument("--verbose", action="store_true", help="debug logging")
    operator.add_argument(
        "--liveness",
        default=None,
        help="serve kopf's liveness probe at this URL, e.g. http://0.0.0.0:8080/healthz",
    )
    operator.set_defaults(func=operator_command)
