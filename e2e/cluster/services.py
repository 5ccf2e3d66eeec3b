"""Services: a TCP proxy per Service port on a loopback address of the Service's own.

Every Service with a selector and a cluster IP gets an address 127.77.{slot}.{n} (its
stand-in cluster IP) and, per port, a listener on that address and the Service's `port`,
so ports stay as rendered. Each new connection goes to the next endpoint, round-robin as
kube-proxy's userspace mode did: the Ready pods (not being deleted; any pod with
`publishNotReadyAddresses`) whose labels match the selector, at the pod IP and the
`targetPort` (a number, or a container port name looked up in each pod; default `port`).
Endpoints are re-evaluated as pods change; with none, a connection is closed at once (as a
REJECT). Headless Services (`clusterIP: None`) get no proxy: they resolve to the pod IPs.
Pods reach a Service at its cluster IP 10.214.{slot}.{n} (an address of the host on the pod
bridge, same listener), by the names `name`, `name.namespace`, `name.namespace.svc` and
`name.namespace.svc.cluster.local` that the kubelet keeps in each pod's /etc/hosts (a
headless Service names its ready pods there); the test code uses the loopback address. UDP,
sessionAffinity, NodePort/LoadBalancer, externalName and Endpoints/EndpointSlice objects are
not emulated. Use `ServiceProxies.resolve("name.namespace.svc:port")`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import subprocess
from typing import Any

from .objects import is_deleting, is_ready, key
from .probes import resolve_port

Obj = dict[str, Any]
log = logging.getLogger("cluster.services")


def _matches(selector: dict[str, str], pod: Obj) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def endpoints(service: Obj, pods: list[Obj], port: Obj) -> list[tuple[str, int]]:
    """(pod IP, target port) of every pod serving `port` of `service` now."""
    spec = service.get("spec") or {}
    namespace, _ = key(service)
    out = []
    for pod in pods:
        if key(pod)[0] != namespace or not _matches(spec.get("selector") or {}, pod):
            continue
        ip = (pod.get("status") or {}).get("podIP")
        ready = is_ready(pod) or (spec.get("publishNotReadyAddresses") and not is_deleting(pod))
        if not ip or not ready:
            continue
        target = port.get("targetPort", port["port"])
        for container in pod["spec"].get("containers") or []:
            try:
                out.append((ip, resolve_port(target, container)))
                break
            except ValueError:
                continue
    return sorted(out)


class _PortProxy:
    def __init__(self) -> None:
        self.backends: list[tuple[str, int]] = []
        self._turn = itertools.count()
        self.server: asyncio.base_events.Server | None = None

    def next_backend(self) -> tuple[str, int] | None:
        if not self.backends:
            return None
        return self.backends[next(self._turn) % len(self.backends)]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = self.next_backend()
        try:
            if backend is None:
                return
            up_reader, up_writer = await asyncio.open_connection(*backend)
        except OSError:
            writer.close()
            return
        finally:
            if backend is None:
                writer.close()
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (OSError, RuntimeError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()


def _names(namespace: str, name: str, for_namespace: str) -> str:
    names = [f"{name}.{namespace}.svc.cluster.local", f"{name}.{namespace}.svc",
             f"{name}.{namespace}"]
    return " ".join(names + ([name] if namespace == for_namespace else []))


class ServiceProxies:
    """The proxies of every Service. `bridge`: the pod bridge, where each Service's cluster
    IP for pods (10.214.{slot}.{n}) is added to the host's addresses."""

    def __init__(self, slot: int, bridge: str | None = None) -> None:
        self.slot = slot
        self.bridge = bridge
        self._addresses: dict[tuple[str, str], str] = {}  # (namespace, name) -> 127.77.slot.n
        self._proxies: dict[tuple[str, str, int], _PortProxy] = {}
        self._headless: dict[tuple[str, str], dict[int, list[tuple[str, int]]]] = {}
        self._free = list(range(1, 255))

    def resolve(self, address: str) -> str:
        """"name.namespace.svc[.cluster.local]:port" (or "name.namespace:port") to the
        "host:port" that reaches the Service from the host; other addresses are returned
        as they are. A headless Service resolves to one of its ready pods."""
        host, _, port = address.rpartition(":")
        parts = host.split(".")
        if len(parts) < 2 or host.replace(".", "").isdigit() or (
            len(parts) > 2 and parts[2] != "svc"
        ):
            return address
        service = (parts[1], parts[0])
        if service in self._addresses:
            return f"{self._addresses[service]}:{port}"
        if service in self._headless:
            backends = self._headless[service].get(int(port)) or []
            if not backends:
                raise LookupError(f"headless service {host} has no ready endpoint on {port}")
            return f"{backends[0][0]}:{backends[0][1]}"
        raise LookupError(f"no service {parts[0]} in namespace {parts[1]} ({address})")

    def address(self, namespace: str, name: str) -> str | None:
        return self._addresses.get((namespace, name))

    def cluster_ip(self, namespace: str, name: str) -> str | None:
        """The Service's address for pods, on the bridge (None: headless or unknown)."""
        address = self._addresses.get((namespace, name))
        if address is None or self.bridge is None:
            return None
        return f"10.214.{self.slot}.{address.rsplit('.', 1)[1]}"

    def hosts_entries(self, for_namespace: str) -> str:
        """/etc/hosts lines naming every Service as pods of `for_namespace` resolve them:
        the cluster IP, or each ready pod of a headless Service."""
        lines = []
        for (namespace, name) in sorted(self._addresses):
            ip = self.cluster_ip(namespace, name)
            if ip:
                lines.append(f"{ip}\t{_names(namespace, name, for_namespace)}\n")
        for (namespace, name), ports in sorted(self._headless.items()):
            for ip in sorted({ip for backends in ports.values() for ip, _ in backends}):
                lines.append(f"{ip}\t{_names(namespace, name, for_namespace)}\n")
        return "".join(lines)

    def backends(self, namespace: str, name: str, port: int) -> list[tuple[str, int]]:
        proxy = self._proxies.get((namespace, name, port))
        if proxy is not None:
            return list(proxy.backends)
        return list((self._headless.get((namespace, name)) or {}).get(port) or [])

    async def sync(self, services: list[Obj], pods: list[Obj]) -> None:
        wanted: set[tuple[str, str, int]] = set()
        headless: dict[tuple[str, str], dict[int, list[tuple[str, int]]]] = {}
        for service in services:
            spec = service.get("spec") or {}
            if not spec.get("selector") or spec.get("type") == "ExternalName":
                continue
            namespace, name = key(service)
            if spec.get("clusterIP") == "None":
                headless[(namespace, name)] = {
                    int(p["port"]): endpoints(service, pods, p) for p in spec.get("ports") or []
                }
                continue
            address = self._addresses.get((namespace, name))
            if address is None:
                address = f"127.77.{self.slot}.{self._free.pop(0)}"
                self._addresses[(namespace, name)] = address
                await self._bridge_address("add", namespace, name)
            listen = [address, *filter(None, [self.cluster_ip(namespace, name)])]
            for port in spec.get("ports") or []:
                if port.get("protocol", "TCP") != "TCP":
                    continue
                proxy_key = (namespace, name, int(port["port"]))
                wanted.add(proxy_key)
                proxy = self._proxies.get(proxy_key)
                if proxy is None:
                    proxy = self._proxies[proxy_key] = _PortProxy()
                    proxy.server = await asyncio.start_server(
                        proxy.handle, listen, int(port["port"]), reuse_address=True
                    )
                proxy.backends = endpoints(service, pods, port)
        self._headless = headless
        for proxy_key in set(self._proxies) - wanted:
            await self._close(proxy_key)
        services_left = {(ns, name) for ns, name, _ in self._proxies}
        for service_key in set(self._addresses) - services_left:
            await self._bridge_address("del", *service_key)
            self._free.append(int(self._addresses.pop(service_key).rsplit(".", 1)[1]))

    async def _bridge_address(self, verb: str, namespace: str, name: str) -> None:
        ip = self.cluster_ip(namespace, name)
        if ip is not None and self.bridge is not None:
            await asyncio.to_thread(
                subprocess.run, ["ip", "addr", verb, f"{ip}/32", "dev", self.bridge],
                capture_output=True, check=verb == "add",
            )

    async def _close(self, proxy_key: tuple[str, str, int]) -> None:
        proxy = self._proxies.pop(proxy_key)
        if proxy.server is not None:
            proxy.server.close()
            with contextlib.suppress(Exception):
                await proxy.server.wait_closed()

    async def stop(self) -> None:
        for proxy_key in list(self._proxies):
            await self._close(proxy_key)
        self._addresses.clear()
