"""The TTSVoice CustomResourceDefinition, generated from the pydantic spec.

Pydantic's JSON Schema is turned into a Kubernetes structural schema: `$ref`s inlined, titles
and `additionalProperties` dropped (pruning drops unknown fields instead), optional fields made
non-nullable and non-required, and a default on optional objects whose fields all have
defaults, so that the API server fills nested defaults even when a whole block is omitted.
That default spells out every nested default rather than `{}`: the API server checks a
default against the object's CEL rules as it is written, and a rule such as
`self.minReplicas <= self.maxReplicas` fails on `{}` ("no such key"), which rejects the CRD.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

from voxfleet_operator.names import MAX_VOICE_NAME, VOICE_NAME_PATTERN
from voxfleet_operator.spec import (
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    TTSVoiceSpec,
    TTSVoiceStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"

PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
    {"name": "Pool", "type": "string", "jsonPath": ".status.pool"},
    {"name": "Endpoint", "type": "string", "jsonPath": ".status.endpoint"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Available")].status',
    },
    {
        "name": "Pods",
        "type": "integer",
        "jsonPath": ".status.readyPods",
        "description": "Ready pool pods serving the voice.",
    },
    # Empty unless the operator reads Prometheus (the chart's prometheus.url).
    {
        "name": "Streams",
        "type": "integer",
        "jsonPath": ".status.liveStreams",
        "description": "Streams in progress on the voice's pods.",
    },
    {
        "name": "P95-ms",
        "type": "integer",
        "jsonPath": ".status.firstAudioP95Ms",
        "description": "Time to first audio, 95th percentile over 5 minutes (ms).",
    },
    {
        "name": "Refused-5m",
        "type": "integer",
        "jsonPath": ".status.refusedStreams",
        "description": "Streams refused because the pods were full, over 5 minutes.",
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]

# `kubectl scale ttsv` and HPAs: spec.replicas is the number of pool pods a voice is loaded on.
SCALE_SUBRESOURCE = {
    "specReplicasPath": ".spec.replicas",
    "statusReplicasPath": ".status.replicas",
    "labelSelectorPath": ".status.selector",
}

_DROPPED_KEYS = ("title", "additionalProperties", "$defs")

# Checked at `kubectl apply`, as the operator checks it (names.voice_name_problem): a name
# the API accepted must never fail later for being too long for a child's name.
NAME_RULE: dict[str, str] = {
    "rule": f"self.metadata.name.size() <= {MAX_VOICE_NAME} && "
    f"self.metadata.name.matches('{VOICE_NAME_PATTERN}')",
    "message": f"metadata.name must be a DNS label of at most {MAX_VOICE_NAME} characters "
    "(lower-case letters, digits and '-', starting with a letter), so that every object "
    "named after the voice is valid",
}


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_resolve(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = defs[node.pop("$ref").rsplit("/", 1)[-1]]
        node = {**_resolve(target, defs), **node}
    if "allOf" in node and len(node["allOf"]) == 1:
        node = {**_resolve(node.pop("allOf")[0], defs), **node}
    if "anyOf" in node:
        # `X | None` fields: Kubernetes expresses optionality by absence, not by null.
        options = [o for o in node["anyOf"] if o.get("type") != "null"]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            node = {**_resolve(options[0], defs), **rest}
    if node.get("default", "") is None:
        del node["default"]
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "properties":
            out[key] = {name: _resolve(prop, defs) for name, prop in value.items()}
        elif key in ("items", "anyOf", "x-kubernetes-validations"):
            out[key] = _resolve(value, defs)
        else:
            out[key] = value
    if out.get("type") == "object":
        required = set(out.get("required", ()))
        for name, prop in out.get("properties", {}).items():
            if (
                name not in required
                and prop.get("type") == "object"
                and "default" not in prop
                and not prop.get("required")
                and prop.get("properties")
            ):
                prop["default"] = {
                    key: value["default"]
                    for key, value in prop["properties"].items()
                    if "default" in value
                }
    return out


def structural_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The OpenAPI v3 structural schema of a pydantic model, with CEL rules kept."""
    raw = model.model_json_schema(by_alias=True)
    schema: dict[str, Any] = _resolve(raw, raw.get("$defs", {}))
    return schema


def build_crd() -> dict[str, Any]:
    """The complete `apiextensions.k8s.io/v1` CustomResourceDefinition for TTSVoice."""
    spec_schema = structural_schema(TTSVoiceSpec)
    status_schema = structural_schema(TTSVoiceStatus)
    schema = {
        "type": "object",
        "description": "A streaming text-to-speech voice served by a Triton GPU pool.",
        "required": ["spec"],
        "x-kubernetes-validations": [dict(NAME_RULE)],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME, "labels": {"app.kubernetes.io/part-of": "voxfleet"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "listKind": f"{KIND}List",
                "shortNames": list(SHORT_NAMES),
                "categories": ["voxfleet"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, "scale": dict(SCALE_SUBRESOURCE)},
                    "additionalPrinterColumns": copy.deepcopy(PRINTER_COLUMNS),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }
