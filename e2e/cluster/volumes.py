"""Volumes: host directories behind each pod volume, and the mounts of each container.

- persistentVolumeClaim: the hostPath of the claim's bound PersistentVolume (the suite's
  provisioner makes one directory per claim, provisioner.py), shared by every pod that mounts
  the claim (capacity and access modes are not enforced).
- emptyDir: a directory per pod; `medium: Memory` is a tmpfs of `sizeLimit` (or 64 MiB).
- secret / configMap: their keys (or `items`) written as files with `defaultMode` into a
  directory per pod, mounted read-only.
- projected: secret, configMap, downwardAPI (fieldRef) and serviceAccountToken sources (a
  token from the TokenRequest API, bound to the pod; not refreshed before it expires, unlike
  the kubelet's at 80 % of its lifetime). The service account's `kube-api-access-*` volume
  is one of these, added to every pod by the API server's ServiceAccount admission.
- hostPath: the host path itself.
`subPath` and `readOnly` are honoured. The mounts are made in the container's own mount
namespace (see launcher.py), so every path is the rendered one.
"""

from __future__ import annotations

import base64
import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .env import ConfigError, _field
from .objects import memory_bytes

Obj = dict[str, Any]
# A projected token's (audience, expirationSeconds); "" is the API server's own audience.
TokenKey = tuple[str, int]
DEFAULT_TOKEN_SECONDS = 3600


@dataclasses.dataclass
class References:
    """What a pod names and the node must read before its containers start."""

    secrets: set[str] = dataclasses.field(default_factory=set)
    config_maps: set[str] = dataclasses.field(default_factory=set)
    claims: set[str] = dataclasses.field(default_factory=set)
    tokens: set[TokenKey] = dataclasses.field(default_factory=set)


def token_key(source: Obj) -> TokenKey:
    return (
        str(source.get("audience") or ""),
        int(source.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS),
    )


def pod_references(pod: Obj) -> References:
    found = References()
    spec = pod["spec"]
    for volume in spec.get("volumes") or []:
        if "secret" in volume:
            found.secrets.add(volume["secret"].get("secretName", ""))
        if "configMap" in volume:
            found.config_maps.add(volume["configMap"].get("name", ""))
        if "persistentVolumeClaim" in volume:
            found.claims.add(volume["persistentVolumeClaim"]["claimName"])
        for source in (volume.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                found.secrets.add(source["secret"].get("name", ""))
            if "configMap" in source:
                found.config_maps.add(source["configMap"].get("name", ""))
            if "serviceAccountToken" in source:
                found.tokens.add(token_key(source["serviceAccountToken"]))
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        for item in container.get("envFrom") or []:
            if "secretRef" in item:
                found.secrets.add(item["secretRef"].get("name", ""))
            if "configMapRef" in item:
                found.config_maps.add(item["configMapRef"].get("name", ""))
        for item in container.get("env") or []:
            value_from = item.get("valueFrom") or {}
            if "secretKeyRef" in value_from:
                found.secrets.add(value_from["secretKeyRef"].get("name", ""))
            if "configMapKeyRef" in value_from:
                found.config_maps.add(value_from["configMapKeyRef"].get("name", ""))
    found.secrets.discard("")
    found.config_maps.discard("")
    return found


def _write_files(directory: Path, files: Mapping[str, bytes], mode: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        path.chmod(mode)


def _keys(obj: Obj, secret: bool) -> dict[str, bytes]:
    if secret:
        out = {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        out.update({k: v.encode() for k, v in (obj.get("stringData") or {}).items()})
        return out
    out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return out


def _project(source: Obj, objects: Mapping[str, Obj], kind: str) -> dict[str, bytes] | None:
    name = source.get("name") or source.get("secretName") or ""
    obj = objects.get(name)
    if obj is None:
        if source.get("optional"):
            return {}
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    data = _keys(obj, kind == "Secret")
    if not source.get("items"):
        return data
    picked: dict[str, bytes] = {}
    for item in source["items"]:
        if item["key"] in data:
            picked[item.get("path", item["key"])] = data[item["key"]]
        elif not source.get("optional"):
            raise ConfigError(f"couldn't find key {item['key']} in {kind} {name}")
    return picked


class PodVolumes:
    """Prepares the host side of one pod's volumes under `workdir`."""

    def __init__(
        self,
        workdir: Path,
        pod: Obj,
        secrets: Mapping[str, Obj],
        config_maps: Mapping[str, Obj],
        claims: Mapping[str, str],
        tokens: Mapping[TokenKey, bytes],
        service_hosts: str = "",
    ) -> None:
        self.workdir = workdir
        self.pod = pod
        self.secrets = secrets
        self.config_maps = config_maps
        self.claims = claims
        self.tokens = tokens
        self.service_hosts = service_hosts
        self.pod_dir = workdir / "pods" / pod["metadata"]["uid"]
        self.hosts_path = self.pod_dir / "etc" / "hosts"
        self.hosts_base = ""
        # volume name -> (host path or "" for tmpfs, tmpfs size in bytes, always read-only)
        self.sources: dict[str, tuple[str, int, bool]] = {}

    def prepare(self) -> None:
        namespace = self.pod["metadata"].get("namespace") or "default"
        for volume in self.pod["spec"].get("volumes") or []:
            name = volume["name"]
            directory = self.pod_dir / "volumes" / name
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]
                path = self.claims[claim["claimName"]]
                os.makedirs(path, exist_ok=True)
                self.sources[name] = (path, 0, bool(claim.get("readOnly")))
            elif "emptyDir" in volume:
                empty = volume["emptyDir"] or {}
                if empty.get("medium") == "Memory":
                    size = memory_bytes(empty.get("sizeLimit", "64Mi"))
                    self.sources[name] = ("", size, False)
                else:
                    directory.mkdir(parents=True, exist_ok=True)
                    self.sources[name] = (str(directory), 0, False)
            elif "secret" in volume or "configMap" in volume:
                kind = "Secret" if "secret" in volume else "ConfigMap"
                source = volume["secret"] if kind == "Secret" else volume["configMap"]
                objects = self.secrets if kind == "Secret" else self.config_maps
                files = _project(source, objects, kind) or {}
                _write_files(directory, files, int(source.get("defaultMode", 0o644)))
                self.sources[name] = (str(directory), 0, True)
            elif "projected" in volume:
                files = self._projected(volume["projected"])
                _write_files(directory, files, int(volume["projected"].get("defaultMode", 0o644)))
                self.sources[name] = (str(directory), 0, True)
            elif "hostPath" in volume:
                self.sources[name] = (volume["hostPath"]["path"], 0, False)
            else:
                raise ConfigError(f"volume {name!r}: unsupported type {sorted(volume)}")
        self._name_files(namespace)

    def _name_files(self, namespace: str) -> None:
        """/etc/hosts and /etc/resolv.conf, which the kubelet manages in every pod. There is
        no cluster DNS: /etc/hosts names the pod and every Service, `kubernetes` included
        (kept up to date by the node agent, see services.py); the nameserver
        is the pod's own loopback, where nothing answers, so lookups of other names fail at
        once instead of waiting for the host's resolver."""
        directory = self.pod_dir / "etc"
        ip = (self.pod.get("status") or {}).get("podIP", "")
        name = self.pod["metadata"]["name"]
        hosts = f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{name}\n"
        search = f"{namespace}.svc.cluster.local svc.cluster.local cluster.local"
        resolv = f"nameserver 127.0.0.1\nsearch {search}\noptions ndots:5\n"
        self.hosts_base = hosts
        hosts += self.service_hosts
        _write_files(directory, {"hosts": hosts.encode(), "resolv.conf": resolv.encode()}, 0o644)
        self.sources["etc-hosts"] = (str(directory / "hosts"), 0, False)
        self.sources["etc-resolv-conf"] = (str(directory / "resolv.conf"), 0, False)

    def _projected(self, projected: Obj) -> dict[str, bytes]:
        files: dict[str, bytes] = {}
        for source in projected.get("sources") or []:
            if "secret" in source:
                files.update(_project(source["secret"], self.secrets, "Secret") or {})
            elif "configMap" in source:
                files.update(_project(source["configMap"], self.config_maps, "ConfigMap") or {})
            elif "serviceAccountToken" in source:
                token = self.tokens[token_key(source["serviceAccountToken"])]
                files[source["serviceAccountToken"].get("path", "token")] = token
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    if "fieldRef" in item:
                        value = _field(item["fieldRef"]["fieldPath"], self.pod)
                        files[item["path"]] = value.encode()
        return files

    def mounts(self, container: Obj) -> list[dict[str, Any]]:
        """The container's mounts, parents before children, for launcher.py."""
        out: list[dict[str, Any]] = []
        items = list(container.get("volumeMounts") or [])
        items.append({"name": "etc-hosts", "mountPath": "/etc/hosts"})
        items.append({"name": "etc-resolv-conf", "mountPath": "/etc/resolv.conf"})
        for mount in items:
            if mount["name"] not in self.sources:
                raise ConfigError(f"volumeMount {mount['name']!r} names no volume of the pod")
            path, size, read_only = self.sources[mount["name"]]
            sub_path = mount.get("subPath", "")
            if sub_path and path:
                path = os.path.join(path, sub_path)
                if not os.path.exists(path):
                    os.makedirs(path, exist_ok=True)
            out.append(
                {
                    "source": path,
                    "target": mount["mountPath"],
                    "tmpfs_bytes": size,
                    "read_only": read_only or bool(mount.get("readOnly")),
                }
            )
        out.sort(key=lambda m: m["target"].rstrip("/").count("/"))
        return out
