"""Generated files (CRD, manifests/, adapter values) match their sources, and the kubectl
install in manifests/ is valid and namespace-scoped."""

from __future__ import annotations

import importlib.util
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from chart_support import (
    CHART,
    ROOT,
    CrdValidator,
    all_schema_problems,
    chart_pools_file,
    crd_from_chart,
    helm_template,
    load_yaml_documents,
    run,
    tool,
)

MANIFESTS = ROOT / "manifests"


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "generate_manifests", ROOT / "scripts" / "generate-manifests.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_have_not_drifted_from_their_sources() -> None:
    module = generator()
    diffs = module.drift(module.expected_files())
    assert not diffs, (
        "generated files are out of date; run `python scripts/generate-manifests.py`:\n"
        + "".join(diffs)[:4000]
    )


def test_crd_is_the_one_the_operator_builds() -> None:
    from voxfleet_operator.crd import build_crd

    assert crd_from_chart() == build_crd()
    assert load_yaml_documents(MANIFESTS / "crd.yaml") == [build_crd()]


def schema_nodes(node: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    found = [(path or ".", node)]
    for name, sub in node.get("properties", {}).items():
        found += schema_nodes(sub, f"{path}.{name}")
    if "items" in node:
        found += schema_nodes(node["items"], f"{path}[]")
    return found


def test_crd_schema_is_structural() -> None:
    """The API server refuses a CRD whose schema is not structural: every node typed, no
    $ref, and no nullable unions."""
    version = crd_from_chart()["spec"]["versions"][0]
    for path, node in schema_nodes(version["schema"]["openAPIV3Schema"]):
        if path == ".metadata":
            continue
        assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert not {"$ref", "anyOf", "oneOf", "allOf", "nullable"} & set(node), path


def test_crd_names_and_columns_match_the_api_contract() -> None:
    crd = crd_from_chart()
    names = crd["spec"]["names"]
    assert (crd["spec"]["group"], names["kind"], names["plural"]) == (
        "voxfleet.io", "TTSVoice", "ttsvoices",
    )  # fmt: skip
    assert names["shortNames"] == ["ttsv"]
    assert crd["spec"]["scope"] == "Namespaced"
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    # `kubectl scale ttsv` and per-voice HPAs set the pool pods a voice is loaded on.
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


def test_crd_and_namespaced_install_are_valid_for_kubernetes_1_30_to_1_35() -> None:
    objects = load_yaml_documents(MANIFESTS / "crd.yaml")
    objects += load_yaml_documents(MANIFESTS / "install-namespaced.yaml")
    objects += load_yaml_documents(MANIFESTS / "prometheus-adapter-rules.yaml")
    assert all_schema_problems(objects) == []


def test_namespaced_install_needs_no_cluster_rights() -> None:
    objects = load_yaml_documents(MANIFESTS / "install-namespaced.yaml")
    kinds = {o["kind"] for o in objects}
    assert kinds == {"ServiceAccount", "ConfigMap", "Role", "RoleBinding", "Deployment"}
    assert {o["metadata"]["namespace"] for o in objects} == {"voxfleet"}
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    env = {
        e["name"]: e.get("value")
        for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["VOXFLEET_WATCH_NAMESPACES"] == "voxfleet"


@pytest.fixture(scope="module")
def notes() -> str:
    # Helm 4 renders NOTES offline; Helm 3.17's install --dry-run needs a cluster.
    result = run(
        [tool("helm"), "install", "voxfleet", str(CHART), "--namespace", "speech",
         "--dry-run=client", "--set", "watchNamespaces={speech}"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_verify_the_install_with_real_commands(notes: str) -> None:
    assert "kubectl -n speech rollout status deployment/voxfleet" in notes
    assert "kubectl get ttsv --all-namespaces" in notes
    assert "kubectl -n speech wait ttsv/joe --for=condition=Available" in notes


def test_notes_voice_is_accepted_by_the_crd(notes: str) -> None:
    body = notes.split("<<'YAML'\n", 1)[1].split("\nYAML\n", 1)[0]
    voice = yaml.safe_load(body)
    assert CrdValidator(crd_from_chart()).problems(voice) == []


def test_notes_say_command_is_a_real_voxfleet_command(notes: str) -> None:
    from engines.cli import build_parser

    (line,) = [line for line in notes.splitlines() if line.strip().startswith("voxfleet say")]
    args = build_parser().parse_args(shlex.split(line)[1:])
    assert (args.command, args.url, args.voice) == ("say", "localhost:8001", "joe")
    # The Service it port-forwards is the one the operator creates for the voice.
    from voxfleet_operator.names import GRPC_PORT, voice_service_name

    assert f"service/{voice_service_name('joe')} {GRPC_PORT}:{GRPC_PORT}" in notes


def test_adapter_values_snippet_holds_the_rules_of_the_configmap() -> None:
    values = yaml.safe_load((CHART / "prometheus-adapter-values.yaml").read_text())
    configmap = load_yaml_documents(MANIFESTS / "prometheus-adapter-rules.yaml")[0]
    assert values["rules"]["custom"] == yaml.safe_load(configmap["data"]["config.yaml"])["rules"]
    assert configmap["metadata"]["namespace"] == "monitoring"


def test_helm_test_pod_renders_a_voice_with_the_chart_pools(tmp_path: Path) -> None:
    """The in-cluster `helm test`: its offline half (the operator image's `voxfleet render`
    with the mounted pools file) runs here as is; its API half needs a cluster."""
    (pod,) = [
        o for o in helm_template("helm", "--set", "watchNamespaces={speech}") if o["kind"] == "Pod"
    ]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["serviceAccountName"] == "voxfleet"
    code = pod["spec"]["containers"][0]["args"][0]
    assert "/apis/voxfleet.io/v1alpha1/namespaces/speech/ttsvoices" in code
    offline, _api = code.split("account = ", 1)
    pools = chart_pools_file(tmp_path)
    offline = offline.replace("/etc/voxfleet/pools.yaml", str(pools))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        [sys.executable, "-c", offline], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "the operator accepts the pools file; joe renders" in result.stdout
