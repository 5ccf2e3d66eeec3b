"""`voxfleet api`: the speech API (OpenAI's `/v1/audio/speech` and a WebSocket for text as
it is written) in front of the voices' Triton endpoints.

Two ways to find the voices (engines/gateway/directory.py):
- `--upstream HOST:PORT` (repeatable): Triton servers that hold the voices, such as
  `voxfleet serve`'s; the voices are what their repository index lists.
- `--voice-table FILE`: the voice table the operator renders in the cluster (each voice
  with the address of its headless Service, resolved by DNS).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEFAULT_API_PORT = 8080


def _host_port(value: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT (e.g. localhost:8001), got {value!r}")
    return value


def _port(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise argparse.ArgumentTypeError(f"expected a port number (1 to 65535), got {value!r}")
    return int(value)


def _alias(value: str) -> tuple[str, str]:
    from engines.gateway.voices import VoiceTableError, parse_alias

    try:
        return parse_alias(value)
    except VoiceTableError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `voxfleet api` shares with `voxfleet serve --api-port`."""
    parser.add_argument(
        "--voice-alias",
        action="append",
        type=_alias,
        default=[],
        metavar="NAME=VOICE",
        help="a voice name clients may send for VOICE, e.g. alloy=joe (repeatable); OpenAI's "
        "built-in names not given here go to --default-voice",
    )
    parser.add_argument(
        "--default-voice",
        help="the voice for OpenAI's built-in names (alloy, echo, ...) without an alias "
        "(default: the first voice by name)",
    )
    parser.add_argument(
        "--api-keys-file",
        type=Path,
        help="bearer keys, one per line; without it (and without $VOXFLEET_API_KEYS) the API "
        "is open",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "api",
        help="serve the OpenAI-compatible speech API in front of voxfleet voices",
        description="OpenAI-compatible POST /v1/audio/speech, GET /v1/models, GET "
        "/v1/audio/voices and the WebSocket /v1/audio/speech/stream, streaming from the "
        "voices' Triton endpoints over gRPC (docs/speech-api.md).",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--upstream",
        action="append",
        type=_host_port,
        metavar="HOST:PORT",
        help="a Triton gRPC endpoint holding the voices (repeatable)",
    )
    source.add_argument(
        "--voice-table",
        type=Path,
        metavar="FILE",
        help="the voice table (JSON) with each voice's address, as the operator renders it",
    )
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument("--port", type=_port, default=DEFAULT_API_PORT)
    add_gateway_arguments(parser)
    parser.add_argument(
        "--max-attempts",
        type=int,
        default=3,
        help="pods one stream may try when pods refuse it (default 3)",
    )
    parser.add_argument(
        "--max-text-bytes",
        type=int,
        default=None,
        help="longest text sent to a pod in one stream; longer inputs go in pieces cut "
        "between sentences (default 5000, the pods' default)",
    )
    parser.add_argument("--log-level", default="warning", help="uvicorn's (default warning)")
    parser.set_defaults(func=handle)


def handle(args: argparse.Namespace) -> int:
    from engines.gateway.server import GatewaySettings, run_gateway
    from engines.gateway.voices import VoiceTableError

    try:
        settings = GatewaySettings(
            host=args.host,
            port=args.port,
            upstreams=tuple(args.upstream or ()),
            voice_table=args.voice_table,
            aliases=tuple(args.voice_alias),
            default_voice=args.default_voice,
            api_keys_file=args.api_keys_file,
            max_attempts=args.max_attempts,
            max_text_bytes=args.max_text_bytes,
            log_level=args.log_level,
        )
        return run_gateway(settings)
    except (VoiceTableError, ValueError, OSError) as error:
        print(f"voxfleet api: {error}", file=sys.stderr)
        return 1


def gateway_command(
    upstream: str,
    host: str,
    port: int,
    aliases: list[tuple[str, str]] | None = None,
    default_voice: str | None = None,
    api_keys_file: Path | None = None,
) -> list[str]:
    """The `voxfleet api` command line for a gateway in front of one Triton server."""
    command = [sys.executable, "-m", "engines.cli", "api", "--upstream", upstream]
    command += ["--host", host, "--port", str(port)]
    for name, voice in aliases or []:
        command += ["--voice-alias", f"{name}={voice}"]
    if default_voice:
        command += ["--default-voice", default_voice]
    if api_keys_file is not None:
        command += ["--api-keys-file", str(api_keys_file)]
    return command


def start_gateway_process(command: list[str]):  # -> subprocess.Popen[bytes]
    """Run a gateway beside this process; it is stopped (SIGTERM) if this process dies."""
    import subprocess

    from engines.pod.processes import ended_with_this_process

    return subprocess.Popen(ended_with_this_process(command))


def stop_gateway_process(process, timeout_s: float = 30.0) -> None:  # process: subprocess.Popen
    import signal
    import subprocess

    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)
