"""The API server as pods reach it: forwarders from the bridge's gateway address.

- https://kubernetes.default.svc (the name resolves to the gateway through each pod's
  /etc/hosts; port 443, KUBERNETES_SERVICE_HOST/PORT): TLS terminated here with a
  certificate of the cluster's own CA (pki.py), whose `ca.crt` is in every pod's service
  account mount, so in-cluster logins (kopf's, client-go's) work as rendered;
- `LocalCluster.api_url_for_pods`: the API server's own scheme and port on the gateway,
  bytes forwarded as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl


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


async def forward(
    listen_host: str,
    listen_port: int,
    host: str,
    port: int,
    serve_tls: ssl.SSLContext | None = None,
    upstream_tls: ssl.SSLContext | None = None,
) -> asyncio.Server:
    """Forward each connection; `serve_tls` terminates TLS here, `upstream_tls` starts it
    towards the server."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port, ssl=upstream_tls)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return await asyncio.start_server(
        handle, listen_host, listen_port, reuse_address=True, ssl=serve_tls
    )
