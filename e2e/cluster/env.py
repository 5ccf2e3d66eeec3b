"""A container's environment and argv, resolved as the kubelet does.

Order and rules follow Kubernetes: `envFrom` first (ConfigMaps and Secrets, with `prefix`),
then `env` in order, where a value may reference variables defined before it as `$(NAME)`
(`$$` escapes; unknown references stay as written). `valueFrom` supports `secretKeyRef`,
`configMapKeyRef` (both with `optional`), `fieldRef` (metadata.name, metadata.namespace,
metadata.uid, metadata.labels['k'], metadata.annotations['k'], spec.nodeName,
spec.serviceAccountName, status.podIP, status.podIPs, status.hostIP) and `resourceFieldRef`
(requests/limits of cpu and memory). `command` and `args` are expanded with the result.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Mapping
from typing import Any

from .objects import cpu_cores, memory_bytes

Obj = dict[str, Any]
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ConfigError(RuntimeError):
    """A reference the container cannot start without (CreateContainerConfigError)."""


def expand(text: str, variables: Mapping[str, str]) -> str:
    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return variables.get(name, match.group(0))

    return _REFERENCE.sub(replace, text)


def _data(obj: Obj, secret: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    if secret:
        for name, value in (obj.get("data") or {}).items():
            out[name] = base64.b64decode(value).decode()
        out.update(obj.get("stringData") or {})  # an API server folds stringData into data
    else:
        out.update(obj.get("data") or {})
    return out


def _key_ref(ref: Obj, objects: Mapping[str, Obj], kind: str) -> str | None:
    name, key, optional = ref.get("name", ""), ref["key"], bool(ref.get("optional"))
    obj = objects.get(name)
    if obj is None:
        if optional:
            return None
        raise ConfigError(f'{kind.lower()} "{name}" not found')
    data = _data(obj, kind == "Secret")
    if key not in data:
        if optional:
            return None
        namespace = obj["metadata"].get("namespace")
        raise ConfigError(f"couldn't find key {key} in {kind} {namespace}/{name}")
    return data[key]


def _field(path: str, pod: Obj) -> str:
    meta, status = pod["metadata"], pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", "default"),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
        "status.podIP": status.get("podIP", ""),
        "status.podIPs": ",".join(ip["ip"] for ip in status.get("podIPs") or []),
        "status.hostIP": status.get("hostIP", ""),
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['(.+)'\]", path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ConfigError(f"unsupported fieldRef {path!r}")


def _resource(ref: Obj, container: Obj) -> str:
    section, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(section) or {}).get(name)
    divisor = ref.get("divisor", "1")
    if name == "cpu":
        cores = cpu_cores(value) if value is not None else 0.0
        return str(math.ceil(cores / cpu_cores(divisor))) if value is not None else "0"
    if value is None:
        return "0"
    return str(math.ceil(memory_bytes(value) / memory_bytes(divisor)))


def container_env(
    pod: Obj,
    container: Obj,
    secrets: Mapping[str, Obj],
    config_maps: Mapping[str, Obj],
    base: Mapping[str, str],
) -> tuple[dict[str, str], dict[str, str]]:
    """(the environment the container starts with: `base`, the image's, then envFrom and env;
    the variables that `$(NAME)` in command and args may reference: envFrom and env only)."""
    env = dict(base)
    defined: dict[str, str] = {}  # what `$(NAME)` may reference: envFrom and earlier env
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for field, kind, objects in (
            ("configMapRef", "ConfigMap", config_maps),
            ("secretRef", "Secret", secrets),
        ):
            ref = source.get(field)
            if ref is None:
                continue
            obj = objects.get(ref.get("name", ""))
            if obj is None:
                if ref.get("optional"):
                    continue
                raise ConfigError(f'{kind.lower()} "{ref.get("name")}" not found')
            for name, text in _data(obj, kind == "Secret").items():
                env[prefix + name] = defined[prefix + name] = text
    for item in container.get("env") or []:
        name = item["name"]
        value_from = item.get("valueFrom")
        value: str | None
        if value_from is None:
            value = expand(str(item.get("value", "")), defined)
        elif "secretKeyRef" in value_from:
            value = _key_ref(value_from["secretKeyRef"], secrets, "Secret")
        elif "configMapKeyRef" in value_from:
            value = _key_ref(value_from["configMapKeyRef"], config_maps, "ConfigMap")
        elif "fieldRef" in value_from:
            value = _field(value_from["fieldRef"]["fieldPath"], pod)
        elif "resourceFieldRef" in value_from:
            value = _resource(value_from["resourceFieldRef"], container)
        else:
            raise ConfigError(f"unsupported valueFrom for {name}: {sorted(value_from)}")
        if value is not None:
            env[name] = defined[name] = value
    return env, defined


def container_argv(container: Obj, defined: Mapping[str, str]) -> list[str]:
    """`command` + `args` with `$(VAR)` references expanded from the container's env."""
    command = [expand(str(part), defined) for part in container.get("command") or []]
    args = [expand(str(part), defined) for part in container.get("args") or []]
    if not command:
        raise ConfigError(
            f"container {container.get('name')!r} has no command: images are not run here, "
            "so the command must be rendered"
        )
    return command + args
