"""Running the real helm binaries and checking what they render, for tests/integration/chart.

Kubernetes API schemas come from kubernetes-validate (offline OpenAPI schemas per minor version);
the ServiceMonitor schema from the Prometheus Operator's CRD, compiled into
@kubernetes-models/prometheus-operator (installed into .tools/node by scripts/install-tools.sh);
TTSVoices are checked against the CRD's own openAPIV3Schema plus its CEL rules (cel-python).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
CHART = ROOT / "charts" / "voxfleet"
CI_VALUES = sorted((CHART / "ci").glob("*.yaml"))
TOOLS = ROOT / ".tools"
KUBE_VERSIONS = ("1.30", "1.31", "1.32", "1.33", "1.34", "1.35")
HELMS = ("helm3", "helm")  # Helm 3 and Helm 4, as installed by scripts/install-tools.sh
SERVICE_MONITOR_CHECK = Path(__file__).with_name("validate_servicemonitors.mjs")
Obj = dict[str, Any]


def tool(name: str) -> str:
    """A binary from .tools/bin (first) or PATH; the test fails, not skips, without it."""
    local = TOOLS / "bin" / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run `make setup` (scripts/install-tools.sh)")
    return found


def run(command: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, input=stdin, capture_output=True, text=True, check=False, timeout=120
    )


def helm_template_text(
    helm: str, *args: str, release: str = "voxfleet", namespace: str = "voxfleet"
) -> str:
    result = run([tool(helm), "template", release, str(CHART), "--namespace", namespace, *args])
    assert result.returncode == 0, f"{helm} template {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def helm_template(
    helm: str, *args: str, release: str = "voxfleet", namespace: str = "voxfleet"
) -> list[Obj]:
    text = helm_template_text(helm, *args, release=release, namespace=namespace)
    return [d for d in yaml.safe_load_all(text) if d]


def helm_template_error(helm: str, *args: str) -> str:
    """The error of a `helm template` that must fail (the test fails if it renders)."""
    result = run([tool(helm), "template", "voxfleet", str(CHART), *args])
    assert result.returncode != 0, f"{helm} template {' '.join(args)} rendered, expected a refusal"
    return result.stderr


def by_kind(objects: list[Obj], kind: str) -> list[Obj]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[Obj], kind: str) -> Obj:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


# --- Kubernetes API schemas ---------------------------------------------------------------

_PRERELEASE = re.compile(r"/v\d+(alpha|beta)\d*$|^v\d+(alpha|beta)\d*$")
CUSTOM_GROUPS = ("voxfleet.io/", "monitoring.coreos.com/")


def kubernetes_problems(obj: Obj, versions: tuple[str, ...] = KUBE_VERSIONS) -> list[str]:
    """Why a built-in object would be refused by any of the Kubernetes versions, if at all.

    Strict schemas reject unknown fields, as `kubectl apply` (strict field validation) does.
    An API version that is alpha or beta, or missing from any version's schemas (removed or
    not yet added), counts as a problem: the chart must use only GA APIs served by them all.
    """
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    api_version = obj.get("apiVersion", "")
    if _PRERELEASE.search(api_version):
        return [f"{name}: {api_version} is not a GA API version"]
    problems = []
    for version in versions:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"{name}: Kubernetes {version} does not serve {api_version}")
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            problems.append(f"{name}: Kubernetes {version}: {path}: {error.message}")
    return problems


def servicemonitor_problems(objects: list[Obj]) -> list[str]:
    """ServiceMonitors checked against the Prometheus Operator's own CRD schema (node)."""
    monitors = by_kind(objects, "ServiceMonitor")
    if not monitors:
        return []
    modules = TOOLS / "node" / "node_modules"
    if not (modules / "@kubernetes-models" / "prometheus-operator").is_dir():
        pytest.fail("the Prometheus Operator schemas are missing: run `make setup`")
    result = run(
        [tool("node"), str(SERVICE_MONITOR_CHECK), str(modules)], stdin=json.dumps(monitors)
    )
    if result.returncode not in (0, 1):
        pytest.fail(f"ServiceMonitor validation did not run:\n{result.stderr}")
    return [line for line in result.stdout.splitlines() if line.startswith("invalid")]


def all_schema_problems(objects: list[Obj]) -> list[str]:
    problems: list[str] = []
    for obj in objects:
        if obj["apiVersion"].startswith(CUSTOM_GROUPS):
            continue
        problems += kubernetes_problems(obj)
    return problems + servicemonitor_problems(objects)


# --- TTSVoice against the CRD: OpenAPI schema with defaults, then CEL ----------------------


def _walk(schema: Obj, value: Any, path: str) -> Iterator[tuple[Obj, Any, str]]:
    yield schema, value, path
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from _walk(sub, value[name], f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _walk(schema["items"], item, f"{path}[{index}]")


def apply_defaults(schema: Obj, value: Any) -> Any:
    """Structural defaulting as the API server does it, before validation and CEL."""
    if isinstance(value, dict) and schema.get("type") == "object":
        for name, sub in schema.get("properties", {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                value[name] = apply_defaults(sub, value[name])
    elif isinstance(value, list) and "items" in schema:
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def _unknown_fields(schema: Obj, value: Any, path: str) -> Iterator[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return
    if isinstance(value, dict) and "properties" in schema:
        for name, item in value.items():
            if name not in schema["properties"]:
                yield f"{path}.{name}: unknown field"
            else:
                yield from _unknown_fields(schema["properties"][name], item, f"{path}.{name}")
    elif isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _unknown_fields(schema["items"], item, f"{path}[{index}]")


class CrdValidator:
    """Validates custom objects as the API server would with this CRD: defaults, OpenAPI
    schema, unknown fields (kubectl's strict field validation), then the CEL rules."""

    def __init__(self, crd: Obj) -> None:
        self.crd = crd
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        self.api_version = f"{crd['spec']['group']}/{version['name']}"
        self.kind = crd["spec"]["names"]["kind"]
        self.schema: Obj = version["schema"]["openAPIV3Schema"]
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}
        for node in self.schema_nodes():
            for validation in node.get("x-kubernetes-validations", []):
                rule = validation["rule"]
                self._programs[rule] = self._env.program(self._env.compile(rule))

    def schema_nodes(self) -> Iterator[Obj]:
        stack = [self.schema]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.get("properties", {}).values())
            if "items" in node:
                stack.append(node["items"])

    def problems(self, obj: Obj) -> list[str]:
        if obj.get("apiVersion") != self.api_version or obj.get("kind") != self.kind:
            return [f"not a {self.api_version} {self.kind}"]
        value = apply_defaults(self.schema, copy.deepcopy(obj))
        validator = jsonschema.Draft7Validator(self.schema)
        problems = [
            f"{'.'.join(['', *map(str, e.absolute_path)]) or '.'}: {e.message}"
            for e in validator.iter_errors(value)
        ]
        problems += list(_unknown_fields(self.schema, value, ""))
        if problems:  # the API server runs CEL only on objects the schema accepted
            return problems
        for node, item, path in _walk(self.schema, value, ""):
            for validation in node.get("x-kubernetes-validations", []):
                rule = validation["rule"]
                try:
                    result = self._programs[rule].evaluate({"self": celpy.json_to_cel(item)})
                except celpy.CELEvalError as error:
                    result = error
                if isinstance(result, Exception):
                    problems.append(f"{path or '.'}: rule {rule!r} did not evaluate: {result}")
                elif not isinstance(result, celpy.celtypes.BoolType):
                    problems.append(f"{path or '.'}: rule {rule!r} gave {result!r}, not a bool")
                elif not result:
                    problems.append(f"{path or '.'}: {validation['message']}")
        return problems


@cache
def crd_from_chart() -> Obj:
    documents = list(
        yaml.safe_load_all((CHART / "crds" / "ttsvoices.voxfleet.io.yaml").read_text())
    )
    return next(d for d in documents if d)


def load_yaml_documents(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def chart_pools_file(directory: Path, *helm_args: str) -> Path:
    """The pools file exactly as the chart mounts it into the operator."""
    objects = helm_template("helm", *helm_args)
    configmap = next(c for c in by_kind(objects, "ConfigMap") if "pools.yaml" in c["data"])
    path = directory / "pools.yaml"
    path.write_text(configmap["data"]["pools.yaml"])
    return path


def voxfleet_render(*args: str) -> list[dict[str, Any]]:
    result = run([sys.executable, "-m", "engines.cli", "render", *args])
    assert result.returncode == 0, f"voxfleet render {' '.join(args)} failed:\n{result.stderr}"
    return [d for d in yaml.safe_load_all(result.stdout) if d]
