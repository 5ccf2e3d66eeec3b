"""Probe and lifecycle-handler actions: httpGet, tcpSocket, exec and sleep, as the kubelet runs
them. httpGet and tcpSocket go from the host to the pod IP (or `host`) through the bridge;
exec runs inside the container's network and mount namespaces (nsenter) with its env. An
httpGet succeeds on a status from 200 to 399, exec on exit code 0. gRPC probes are not
supported (none is rendered).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aiohttp

Obj = dict[str, Any]


def resolve_port(port: Any, container: Obj) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ValueError(f"container {container.get('name')!r} has no port named {port!r}")


async def run_action(
    action: Obj,
    container: Obj,
    pod_ip: str,
    pid: int | None,
    env: Mapping[str, str],
    timeout_s: float,
    session: aiohttp.ClientSession,
) -> tuple[bool, str]:
    """Run one probe or handler; (succeeded, why not)."""
    try:
        if "httpGet" in action:
            get = action["httpGet"]
            scheme = str(get.get("scheme", "HTTP")).lower()
            url = f"{scheme}://{get.get('host') or pod_ip}:{resolve_port(get['port'], container)}"
            headers = {h["name"]: h["value"] for h in get.get("httpHeaders") or []}
            async with session.get(
                url + get.get("path", "/"),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
                ssl=False,
            ) as response:
                await response.read()
                why = f"HTTP probe failed with statuscode: {response.status}"
                return 200 <= response.status < 400, why
        if "tcpSocket" in action:
            sock = action["tcpSocket"]
            port = resolve_port(sock["port"], container)
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(sock.get("host") or pod_ip, port), timeout_s
            )
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            return True, ""
        if "exec" in action:
            if pid is None:
                return False, "container is not running"
            command = list(action["exec"].get("command") or [])
            process = await asyncio.create_subprocess_exec(
                "nsenter",
                "-t",
                str(pid),
                "-n",
                "-m",
                "--",
                *command,
                env=dict(env),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
            )
            try:
                output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
            except asyncio.TimeoutError:
                process.kill()
                await process.wait()
                return False, f"command timed out after {timeout_s} s"
            return process.returncode == 0, output.decode(errors="replace")[-500:]
        if "sleep" in action:
            await asyncio.sleep(float(action["sleep"]["seconds"]))
            return True, ""
    except (OSError, asyncio.TimeoutError, aiohttp.ClientError) as error:
        return False, f"{type(error).__name__}: {error}"
    return False, f"unsupported action {sorted(action)}"
