"""The TTSVoice API: defaults, rejections users can act on, and the CRD generated from it."""

from __future__ import annotations

import copy
import subprocess
import sys
from typing import Any

import celpy
import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError
from voxfleet_operator.crd import build_crd
from voxfleet_operator.spec import TTSVoiceSpec
from voxfleet_operator.voices import describe_validation_error

URL_SOURCE = {"url": "https://voices.example.com/joe.onnx", "sha256": "ab" * 32}


def spec_schema() -> dict[str, Any]:
    crd = build_crd()
    schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema["properties"]["spec"]  # type: ignore[no-any-return]


def test_minimal_voice_gets_the_documented_defaults() -> None:
    spec = TTSVoiceSpec.model_validate({"source": URL_SOURCE})
    assert spec.pool is None  # the operator's default pool
    assert spec.precision.value == "fp16"
    assert (spec.streaming.first_window_frames, spec.streaming.steady_window_frames) == (16, 32)
    assert spec.streaming.context_frames == 8
    assert spec.streaming.max_lead_ms == 0  # audio as fast as it is made
    assert (spec.batching.max_batch_size, spec.batching.max_queue_delay_ms) == (8, 25)
    assert spec.batching.instances == 1
    assert spec.batching.encoder_launch.value == "queued"  # the encoder behind the windows
    assert (spec.limits.max_text_bytes, spec.limits.max_concurrent_streams) == (4096, 64)
    assert spec.speaking_rate == 1.0
    assert (spec.autoscaling.min_replicas, spec.autoscaling.max_replicas) == (1, 4)
    assert spec.autoscaling.target_first_audio_p95_ms == 300


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"source": {}}, "exactly one of pvc or url, got neither"),
        (
            {"source": {**URL_SOURCE, "pvc": {"claimName": "v", "path": "joe.onnx"}}},
            "exactly one of pvc or url, got ['pvc', 'url']",
        ),
        ({"source": {"url": "https://x/j.onnx"}}, "source.url needs source.sha256"),
        (
            {"source": URL_SOURCE, "autoscaling": {"minReplicas": 5, "maxReplicas": 2}},
            "minReplicas must not exceed autoscaling.maxReplicas (5 > 2)",
        ),
        (
            {"source": URL_SOURCE, "streaming": {"firstWindowFrames": 64}},
            "firstWindowFrames must not exceed streaming.steadyWindowFrames (64 > 32)",
        ),
        (
            {
                "source": URL_SOURCE,
                "batching": {"maxBatchSize": 64},
                "streaming": {"steadyWindowFrames": 256},
            },
            "= 17408 frames, the limit is 8192",
        ),
        (
            {
                "source": URL_SOURCE,
                "batching": {"maxBatchSize": 16},
                "limits": {"maxConcurrentStreams": 4},
            },
            "maxBatchSize must not exceed limits.maxConcurrentStreams (16 > 4)",
        ),
        (
            {"source": URL_SOURCE, "autoscaling": {"perVoice": True}},
            "autoscaling.perVoice needs spec.replicas",
        ),
        ({"source": URL_SOURCE, "replicas": 0}, "spec.replicas: Input should be greater"),
        (
            {"source": URL_SOURCE, "batching": {"instances": 5}},
            "spec.batching.instances: Input should be less than or equal to 4",
        ),
        ({"source": URL_SOURCE, "speakingRate": 9}, "speakingRate: Input should be less"),
        ({"source": URL_SOURCE, "precision": "int4"}, "spec.precision: Input should be"),
        (
            {"source": URL_SOURCE, "batching": {"encoderLaunch": "sideways"}},
            "spec.batching.encoderLaunch: Input should be 'inline', 'beside' or 'queued'",
        ),
        ({"source": URL_SOURCE, "colour": "blue"}, "spec.colour: Extra inputs"),
    ],
)
def test_invalid_specs_say_what_is_wrong(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        TTSVoiceSpec.model_validate(spec)
    assert message in describe_validation_error(caught.value)


def test_crd_identity_printer_columns_and_status() -> None:
    crd = build_crd()
    assert crd["metadata"]["name"] == "ttsvoices.voxfleet.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        "TTSVoice",
        "ttsvoices",
        ["ttsv"],
    )
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == [
        "Phase",
        "Pool",
        "Endpoint",
        "Ready",
        "Pods",
        "Streams",
        "P95-ms",
        "Refused-5m",
        "Age",
    ]
    # The CRD itself is a valid object for the API server's own schema.
    kubernetes_validate.validate(crd, "1.30", strict=True)


def _walk(node: dict[str, Any], path: str = "spec") -> Any:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{name}")
    if "items" in node:
        yield from _walk(node["items"], f"{path}[]")


def test_schema_is_structural_and_documented() -> None:
    for path, node in _walk(spec_schema()):
        assert "type" in node, f"{path} has no type"
        assert "description" in node, f"{path} has no description"
        forbidden = {"$ref", "anyOf", "allOf", "additionalProperties", "title"} & set(node)
        assert not forbidden, f"{path} has {forbidden}"
        if node.get("type") == "string" and "x-kubernetes-validations" in node:
            assert "maxLength" in node  # CEL cost estimation needs bounded strings


def _default(schema: dict[str, Any], value: Any) -> Any:
    """Apply schema defaults the way the API server does (before CEL runs)."""
    if schema.get("type") != "object" or not isinstance(value, dict):
        return value
    out = dict(value)
    for name, prop in (schema.get("properties") or {}).items():
        if name not in out and "default" in prop:
            out[name] = copy.deepcopy(prop["default"])
        if name in out:
            out[name] = _default(prop, out[name])
    return out


def _cel_failures(schema: dict[str, Any], value: Any) -> list[str]:
    env = celpy.Environment()
    failures = []
    for rule in schema.get("x-kubernetes-validations") or []:
        program = env.program(env.compile(rule["rule"]))
        if not program.evaluate({"self": celpy.json_to_cel(value)}):
            failures.append(rule["message"])
    for name, prop in (schema.get("properties") or {}).items():
        if isinstance(value, dict) and name in value:
            failures += _cel_failures(prop, value[name])
    return failures


CROSS_FIELD_CASES = [
    {"source": URL_SOURCE},
    {"source": {"pvc": {"claimName": "voices", "path": "en/joe.onnx"}}},
    {"source": {}},
    {"source": {**URL_SOURCE, "pvc": {"claimName": "v", "path": "j.onnx"}}},
    {"source": {"url": "https://x/j.onnx"}},
    {"source": URL_SOURCE, "autoscaling": {"minReplicas": 3, "maxReplicas": 3}},
    {"source": URL_SOURCE, "autoscaling": {"minReplicas": 4, "maxReplicas": 3}},
    {"source": URL_SOURCE, "streaming": {"firstWindowFrames": 32}},
    {"source": URL_SOURCE, "streaming": {"firstWindowFrames": 33}},
    {
        "source": URL_SOURCE,
        "batching": {"maxBatchSize": 64},
        "streaming": {"steadyWindowFrames": 96, "contextFrames": 16},
    },
    {
        "source": URL_SOURCE,
        "batching": {"maxBatchSize": 64},
        "streaming": {"steadyWindowFrames": 96, "contextFrames": 17},
    },
    {"source": URL_SOURCE, "batching": {"maxBatchSize": 65}},
    {"source": URL_SOURCE, "batching": {"maxBatchSize": 8}, "limits": {"maxConcurrentStreams": 7}},
    {"source": URL_SOURCE, "autoscaling": {"perVoice": True}},
    {"source": URL_SOURCE, "autoscaling": {"perVoice": True}, "replicas": 1},
    {"source": URL_SOURCE, "replicas": 2},
]


@pytest.mark.parametrize("spec", CROSS_FIELD_CASES)
def test_cel_rules_and_operator_validation_agree(spec: dict[str, Any]) -> None:
    """The API server (OpenAPI + CEL) and the operator accept and reject the same voices."""
    schema = spec_schema()
    defaulted = _default(schema, spec)
    plain = yaml.safe_load(yaml.safe_dump(schema).replace("x-kubernetes-validations", "x-cel"))
    try:
        jsonschema.validate(defaulted, plain)
        server_accepts = not _cel_failures(schema, defaulted)
    except jsonschema.ValidationError:
        server_accepts = False
    try:
        TTSVoiceSpec.model_validate(spec)
        operator_accepts = True
    except ValidationError:
        operator_accepts = False
    assert server_accepts == operator_accepts


def test_voxfleet_crd_prints_the_generated_crd() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "engines.cli", "crd"], capture_output=True, text=True, check=True
    )
    assert yaml.safe_load(result.stdout) == build_crd()


NAME_CASES = ["joe", "en-us-joe-medium", "a" * 45, "a" * 46, "joe.v2", "Joe", "9joe", "joe-"]


@pytest.mark.parametrize("name", NAME_CASES)
def test_name_rule_at_apply_and_the_operator_agree(name: str) -> None:
    """A name the API server accepts never fails later in the operator, and the reverse."""
    from voxfleet_operator.names import voice_name_problem

    crd = build_crd()
    root = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    (rule,) = root["x-kubernetes-validations"]
    env = celpy.Environment()
    accepted = env.program(env.compile(rule["rule"])).evaluate(
        {"self": celpy.json_to_cel({"metadata": {"name": name}, "spec": {}})}
    )
    assert bool(accepted) == (voice_name_problem(name) is None)


def test_the_name_limit_is_the_longest_for_which_every_child_name_fits() -> None:
    from voxfleet_operator.names import (
        MAX_VOICE_NAME,
        engine_job_name,
        serving_label,
        voice_name_problem,
        voice_service_name,
    )

    longest = "a" * MAX_VOICE_NAME
    names = [voice_service_name(longest), engine_job_name(longest, "f" * 20)]
    names.append(serving_label(longest).split("/", 1)[1])
    assert max(len(n) for n in names) == 63  # one more character would break a child's name
    problem = voice_name_problem(longest + "a")
    assert problem is not None and "the limit is 45" in problem
    assert "engine-<name>-0000000000" in problem


def test_the_api_offers_the_precisions_the_runtime_registry_knows() -> None:
    from voxfleet_operator.spec import Precision

    from engines.contract.plan import PRECISIONS, RUNTIMES

    assert {p.value for p in Precision} == set(PRECISIONS)
    assert set().union(*(info.precisions for info in RUNTIMES.values())) == set(PRECISIONS)


def test_the_api_offers_the_encoder_launches_the_plan_knows() -> None:
    from voxfleet_operator.spec import EncoderLaunch

    from engines.contract.plan import ENCODER_LAUNCHES

    assert tuple(mode.value for mode in EncoderLaunch) == ENCODER_LAUNCHES


def test_the_api_offers_the_encoder_precisions_the_plan_knows() -> None:
    from voxfleet_operator.spec import EncoderPrecision

    from engines.contract.plan import ENCODER_PRECISIONS, RUNTIMES

    assert tuple(mode.value for mode in EncoderPrecision) == ENCODER_PRECISIONS
    assert set().union(*(i.encoder_precisions for i in RUNTIMES.values())) == set(
        ENCODER_PRECISIONS
    )
    assert TTSVoiceSpec.model_validate({"source": URL_SOURCE}).encoder_precision.value == "fp32"
