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


def _render_pools(args: argparse.Namespace) -> tuple[Any, str, str | None, Any]:
    """The pools to render with, where they came from, the values' engine-cache claim, and
    the speech API settings (the values', else off)."""
    import yaml

    from voxfleet_operator.chart_values import (
        engine_cache_claim,
        pools_from_values,
        speech_api_from_values,
    )
    from voxfleet_operator.config import POOLS_FILE_ENV
    from voxfleet_operator.pools import PoolsConfigError, load_pools
    from voxfleet_operator.speech_api import SpeechApiConfig, SpeechApiConfigError

    if args.values and args.pools:
        raise PoolsConfigError("give either --values or --pools, not both")
    if args.values:
        try:
            with open(args.values) as stream:
                values = yaml.safe_load(stream) or {}
        except OSError as error:
            raise PoolsConfigError(f"cannot read {args.values}: {error.strerror}") from None
        except yaml.YAMLError as error:
            raise PoolsConfigError(f"{args.values} is not valid YAML: {error}") from None
        if not isinstance(values, dict):
            raise PoolsConfigError(f"{args.values}: expected a mapping of chart values")
        pools = pools_from_values(values, args.values)
        try:
            speech_api = speech_api_from_values(values)
        except SpeechApiConfigError as error:
            raise PoolsConfigError(str(error)) from None
        origin = f"pools from the chart values {args.values}"
        return pools, origin, engine_cache_claim(values), speech_api
    path = args.pools or os.environ.get(POOLS_FILE_ENV) or None
    if path is None:
        return (
            load_pools(None),
            "the built-in pool t4 (no --values, --pools or $VOXFLEET_POOLS_FILE)",
            None,
            SpeechApiConfig(),
        )
    origin = f"pools file {path}" + ("" if args.pools else f" (${POOLS_FILE_ENV})")
    return load_pools(path), origin, None, SpeechApiConfig()


def render_command(args: argparse.Namespace) -> int:
    import yaml

    from voxfleet_operator.config import engine_cache_pvc
    from voxfleet_operator.pools import PoolsConfigError
    from voxfleet_operator.render import render_voices
    from voxfleet_operator.status import NOT_A_TTSVOICE
    from voxfleet_operator.voices import InvalidVoice, voice_from_object

    try:
        pools, origin, values_claim, speech_api = _render_pools(args)
    except PoolsConfigError as error:
        print(f"voxfleet render: {error}", file=sys.stderr)
        return 2
    # On stderr, so that stdout stays YAML for kubectl.
    print(f"voxfleet render: using {origin}", file=sys.stderr)
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
                    raise InvalidVoice(NOT_A_TTSVOICE, "the document is not a mapping")
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
    if args.repository_key_file:
        try:
            with open(args.repository_key_file) as stream:
                key = stream.read().strip()
        except OSError as error:
            print(
                f"voxfleet render: cannot read {args.repository_key_file}: {error.strerror}",
                file=sys.stderr,
            )
            return 2
        if not key:
            print(f"voxfleet render: {args.repository_key_file} is empty", file=sys.stderr)
            return 2
    claim = args.engine_cache_pvc or values_claim or engine_cache_pvc(os.environ)
    objects = render_voices(
        voices,
        pools,
        claim,
        service_monitor=not args.no_service_monitor,
        repository_key=key,
        speech_api=speech_api,
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
        "--values",
        default=None,
        help="the chart's values (helm get values --all RELEASE): render with the pools and "
        "engine-cache claim the installed operator has",
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
        help="also render the namespace's repository-key Secret with the key in this file "
        "(left out by default: the operator makes a random key per namespace)",
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
        "VOXFLEET_ENGINE_CACHE_PVC and VOXFLEET_RESYNC_SECONDS.",
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
