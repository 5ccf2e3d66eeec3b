"""Volumes: host directories behind each pod volume, and the mounts of each container.

- persistentVolumeClaim: one directory per claim, `<workdir>/claims/<namespace>/<claim>`,
  shared by every pod that mounts the claim (as ReadWriteMany would; capacity and access modes
  are not checked, and no PersistentVolumeClaim object is needed).
- emptyDir: a directory per pod; `medium: Memory` is a tmpfs of `sizeLimit` (or 64 MiB).
- secret / configMap: their keys (or `items`) written as files with `defaultMode` into a
  directory per pod, mounted read-only.
- projected: secret, configMap, downwardAPI (fieldRef) and serviceAccountToken sources.
- hostPath: the host path itself.
- the service account (unless `automountServiceAccountToken: false`): `token`, `namespace`
  and `ca.crt` at /var/run/secrets/kubernetes.io/serviceaccount.
`subPath` and `readOnly` are honoured. The mounts are made in the container's own mount
namespace (see launcher.py), so every path is the rendered one.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .env import ConfigError, _field
from .objects import memory_bytes
from .pki import NAMES as API_NAMES

Obj = dict[str, Any]
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


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
        service_account: Mapping[str, bytes],
        service_hosts: str = "",
    ) -> None:
        self.workdir = workdir
        self.pod = pod
        self.secrets = secrets
        self.config_maps = config_maps
        self.service_account = service_account
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
                path = self.workdir / "claims" / namespace / claim["claimName"]
                path.mkdir(parents=True, exist_ok=True)
                self.sources[name] = (str(path), 0, bool(claim.get("readOnly")))
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
        if self.pod["spec"].get("automountServiceAccountToken", True):
            directory = self.pod_dir / "volumes" / "kube-api-access"
            files = dict(self.service_account)
            files["namespace"] = namespace.encode()
            _write_files(directory, files, 0o644)
            self.sources["kube-api-access"] = (str(directory), 0, True)

    def _name_files(self, namespace: str) -> None:
        """/etc/hosts and /etc/resolv.conf, which the kubelet manages in every pod. There is
        no cluster DNS: /etc/hosts names the pod, the `kubernetes` Service and the others
        (kept up to date by the kubelet, see services.py); the nameserver
        is the pod's own loopback, where nothing answers, so lookups of other names fail at
        once instead of waiting for the host's resolver."""
        directory = self.pod_dir / "etc"
        ip = (self.pod.get("status") or {}).get("podIP", "")
        name = self.pod["metadata"]["name"]
        hosts = f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{ip}\t{name}\n"
        gateway = (self.pod.get("status") or {}).get("hostIP")
        if gateway:  # the `kubernetes` Service, the only name of the cluster pods resolve
            hosts += f"{gateway}\t{' '.join(API_NAMES)}\n"
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
                token = self.service_account.get("token", b"")
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
        if "kube-api-access" in self.sources and not any(
            m["mountPath"] == SERVICE_ACCOUNT_DIR for m in items
        ):
            items.append({"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_DIR})
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
