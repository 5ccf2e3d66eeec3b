"""The `kubernetes` Service for pods: a TCP forwarder from the bridge's gateway address to
the API server, whose address pods get as KUBERNETES_SERVICE_HOST/PORT (as the kubelet
sets them). It forwards bytes only: TLS, if any, is the API server's own.
"""

from __future__ import annotations

import asyncio
import contextlib


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (OSError, RuntimeError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


async def forward(listen_host: str, listen_port: int, host: str, port: int) -> asyncio.Server:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(handle, listen_host, listen_port, reuse_address=True)
