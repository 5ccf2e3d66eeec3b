"""Putting the gateway together and running it under uvicorn (`voxfleet api`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from engines.client.balancing import Balancer
from engines.contract.plan import DEFAULT_MAX_TEXT_BYTES
from engines.gateway.app import build_app
from engines.gateway.auth import ApiKeys
from engines.gateway.directory import Directory, DnsDirectory, StaticDirectory
from engines.gateway.synthesis import Synthesizer
from engines.gateway.upstream import Upstreams
from engines.gateway.voices import VoiceTable, load_table, with_flags

# How long a stopping gateway lets its open streams and sockets finish.
GRACEFUL_SHUTDOWN_S = 20


@dataclass(frozen=True)
class GatewaySettings:
    host: str = "0.0.0.0"
    port: int = 8080
    upstreams: tuple[str, ...] = ()
    voice_table: Path | None = None
    aliases: tuple[tuple[str, str], ...] = ()
    default_voice: str | None = None
    api_keys_file: Path | None = None
    max_attempts: int = 3
    max_text_bytes: int | None = None
    log_level: str = "warning"


def build_synthesizer(settings: GatewaySettings) -> Synthesizer:
    upstreams = Upstreams()
    directory: Directory
    if settings.voice_table is not None:
        directory = DnsDirectory(
            settings.voice_table, aliases=settings.aliases, default_voice=settings.default_voice
        )
    elif settings.upstreams:
        table = with_flags(VoiceTable(), settings.aliases, settings.default_voice)
        directory = StaticDirectory(settings.upstreams, upstreams, table)
    else:
        raise ValueError("give --upstream HOST:PORT or --voice-table FILE")
    return Synthesizer(
        directory,
        upstreams,
        Balancer(max_attempts=settings.max_attempts),
        settings.max_text_bytes or DEFAULT_MAX_TEXT_BYTES,
    )


def run_gateway(settings: GatewaySettings) -> int:
    import uvicorn

    if settings.voice_table is not None:
        load_table(settings.voice_table)  # a wrong table stops the start, with its reason
    keys = ApiKeys(settings.api_keys_file)
    app = build_app(build_synthesizer(settings), keys)
    try:
        import httptools  # noqa: F401

        http = "httptools"
    except ImportError:
        http = "h11"
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        # grpc.aio runs on asyncio's own loop; uvloop is not used.
        loop="asyncio",
        http=http,
        ws="websockets-sansio",
        log_level=settings.log_level,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        access_log=False,
    )
    server = uvicorn.Server(config)
    print(
        f"voxfleet api: http://{settings.host}:{settings.port}/v1 "
        f"({'keys required' if keys.enabled else 'no keys'})",
        file=sys.stderr,
        flush=True,
    )
    server.run()
    return 0
