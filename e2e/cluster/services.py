"""The Service proxy: kube-proxy's job for the node agent's host, following real EndpointSlices.

It watches Services and EndpointSlices (as `system:kube-proxy`, bound by the bootstrap RBAC
policy to `system:node-proxier`) and, for every Service with a cluster IP, adds that IP to
the pod bridge and listens on it at each TCP port. Each new connection goes to the next
endpoint, round-robin per connection as kube-proxy's userspace mode did: the endpoints of
the Service's EndpointSlices (label `kubernetes.io/service-name`) whose `ready` condition is
not false, at the slice port of the same name as the Service port; when none is ready,
those `serving` and terminating (kube-proxy's fallback). With no endpoint a connection is
closed at once (a REJECT). The host reaches a Service at its cluster IP too (the address is
the host's own): `resolve("name.namespace.svc:port")` gives "clusterIP:port".

Pods resolve names through /etc/hosts, which the node agent rewrites as Services change:
`name`, `name.namespace`, `name.namespace.svc` and `name.namespace.svc.cluster.local` for
every Service (a headless Service: each ready endpoint's address). There is no cluster DNS.
UDP, sessionAffinity, NodePort/LoadBalancer, externalTrafficPolicy and topology hints are
not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import subprocess
from typing import Any

from .kube import Informer

Obj = dict[str, Any]
log = logging.getLogger("cluster.services")
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


def slice_backends(slices: list[Obj], port: Obj) -> list[tuple[str, int]]:
    """(address, port) of the endpoints behind one Service port, as kube-proxy picks them."""
    name = port.get("name") or ""
    ready: list[tuple[str, int]] = []
    serving: list[tuple[str, int]] = []
    for item in slices:
        numbers = [
            p.get("port")
            for p in item.get("ports") or []
            if (p.get("name") or "") == name and p.get("protocol", "TCP") == "TCP"
        ]
        if not numbers or numbers[0] is None:
            continue
        for endpoint in item.get("endpoints") or []:
            conditions = endpoint.get("conditions") or {}
            for address in endpoint.get("addresses") or []:
                target = (address, int(numbers[0]))
                if conditions.get("ready", True) is not False:
                    ready.append(target)
                elif conditions.get("serving") and conditions.get("terminating"):
                    serving.append(target)
    return sorted(set(ready or serving))


class _PortProxy:
    def __init__(self) -> None:
        self.backends: list[tuple[str, int]] = []
        self._turn = itertools.count()
        self.server: asyncio.Server | None = None

    def next_backend(self) -> tuple[str, int] | None:
        if not self.backends:
            return None
        return self.backends[next(self._turn) % len(self.backends)]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend = self.next_backend()
        if backend is None:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*backend)
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except OSError:
            writer.close()
        except asyncio.CancelledError:  # the proxy stops: the connection ends with it
            writer.close()


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
    names = [
        f"{name}.{namespace}.svc.cluster.local",
        f"{name}.{namespace}.svc",
        f"{name}.{namespace}",
    ]
    return " ".join(names + ([name] if namespace == for_namespace else []))


class ServiceProxies:
    """Proxies for every Service, from two informers (Services, EndpointSlices).
    `bridge`: the pod bridge, where cluster IPs are added to the host's addresses."""

    def __init__(self, services: Informer, slices: Informer, bridge: str) -> None:
        self.services = services
        self.slices = slices
        self.bridge = bridge
        self._proxies: dict[tuple[str, str, int], _PortProxy] = {}
        self._addresses: dict[tuple[str, str], str] = {}  # (namespace, name) -> cluster IP
        self._retired: set[str] = set()  # addresses of deleted Services, still on the bridge

    def _service(self, namespace: str, name: str) -> Obj | None:
        return self.services.objects.get(f"{namespace}/{name}")

    def _slices_of(self, namespace: str, name: str) -> list[Obj]:
        return [
            s
            for s in self.slices.items()
            if s["metadata"].get("namespace") == namespace
            and (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == name
        ]

    def resolve(self, address: str) -> str:
        """ "name.namespace.svc[.cluster.local]:port" (or "name.namespace:port") to the
        "clusterIP:port" that reaches the Service from the host; other addresses are returned
        as they are. A headless Service resolves to one of its ready endpoints."""
        host, _, port = address.rpartition(":")
        parts = host.split(".")
        if (
            len(parts) < 2
            or host.replace(".", "").isdigit()
            or (len(parts) > 2 and parts[2] != "svc")
        ):
            return address
        service = self._service(parts[1], parts[0])
        if service is None:
            raise LookupError(f"no service {parts[0]} in namespace {parts[1]} ({address})")
        cluster_ip = (service.get("spec") or {}).get("clusterIP")
        if cluster_ip and cluster_ip != "None":
            return f"{cluster_ip}:{port}"
        for item in (service.get("spec") or {}).get("ports") or []:
            if int(item["port"]) == int(port):
                backends = slice_backends(self._slices_of(parts[1], parts[0]), item)
                if backends:
                    return f"{backends[0][0]}:{backends[0][1]}"
        raise LookupError(f"headless service {host} has no ready endpoint on {port}")

    def backends(self, namespace: str, name: str, port: int) -> list[tuple[str, int]]:
        service = self._service(namespace, name)
        for item in ((service or {}).get("spec") or {}).get("ports") or []:
            if int(item["port"]) == port:
                return slice_backends(self._slices_of(namespace, name), item)
        return []

    def hosts_entries(self, for_namespace: str) -> str:
        """/etc/hosts lines naming every Service as pods of `for_namespace` resolve them:
        the cluster IP, or each ready endpoint of a headless Service."""
        lines: list[str] = []
        for service in sorted(self.services.items(), key=Informer.key):
            namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
            spec = service.get("spec") or {}
            if spec.get("type") == "ExternalName":
                continue
            if spec.get("clusterIP") and spec["clusterIP"] != "None":
                ips = [spec["clusterIP"]]
            else:
                ips = sorted(
                    {
                        address
                        for s in self._slices_of(namespace, name)
                        for e in s.get("endpoints") or []
                        if (e.get("conditions") or {}).get("ready", True) is not False
                        for address in e.get("addresses") or []
                    }
                )
            lines.extend(f"{ip}\t{_names(namespace, name, for_namespace)}\n" for ip in ips)
        return "".join(lines)

    async def sync(self) -> None:
        wanted: set[tuple[str, str, int]] = set()
        addresses: dict[tuple[str, str], str] = {}
        for service in self.services.items():
            spec = service.get("spec") or {}
            cluster_ip = spec.get("clusterIP")
            if not cluster_ip or cluster_ip == "None" or spec.get("type") == "ExternalName":
                continue
            namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
            addresses[(namespace, name)] = cluster_ip
            if self._addresses.get((namespace, name)) != cluster_ip:
                if cluster_ip not in self._retired:
                    await self._bridge_address("add", cluster_ip)
                self._retired.discard(cluster_ip)
                self._addresses[(namespace, name)] = cluster_ip
            slices = self._slices_of(namespace, name)
            for port in spec.get("ports") or []:
                if port.get("protocol", "TCP") != "TCP":
                    continue
                key = (namespace, name, int(port["port"]))
                wanted.add(key)
                proxy = self._proxies.get(key)
                if proxy is None:
                    proxy = self._proxies[key] = _PortProxy()
                    try:
                        proxy.server = await asyncio.start_server(
                            proxy.handle, cluster_ip, int(port["port"]), reuse_address=True
                        )
                    except OSError as error:
                        log.warning(
                            "service %s/%s port %s: %r", namespace, name, port["port"], error
                        )
                proxy.backends = slice_backends(slices, port)
        for key in set(self._proxies) - wanted:
            await self._close(key)
        # A deleted Service's address stays on the bridge until the proxy stops: connections
        # made through it go on (as kube-proxy's established ones do), which they could not
        # once the host no longer owned the address. A new Service given the same cluster IP
        # gets a listener on the address already there.
        for service_key in set(self._addresses) - set(addresses):
            self._retired.add(self._addresses.pop(service_key))

    async def _bridge_address(self, verb: str, ip: str) -> None:
        result = await asyncio.to_thread(
            subprocess.run,
            ["ip", "addr", verb, f"{ip}/32", "dev", self.bridge],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0 and "File exists" not in result.stderr and verb == "add":
            log.warning("ip addr add %s: %s", ip, result.stderr.strip())

    async def _close(self, key: tuple[str, str, int]) -> None:
        proxy = self._proxies.pop(key)
        if proxy.server is not None:
            proxy.server.close()
            with contextlib.suppress(Exception):
                await proxy.server.wait_closed()

    async def stop(self) -> None:
        for key in list(self._proxies):
            await self._close(key)
        for ip in {*self._addresses.values(), *self._retired}:
            await self._bridge_address("del", ip)
        self._addresses.clear()
        self._retired.clear()
