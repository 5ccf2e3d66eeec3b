"""The chart, linted and rendered by the real Helm 3 and Helm 4, against Kubernetes 1.30–1.35."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from chart_support import (
    CHART,
    CI_VALUES,
    HELMS,
    all_schema_problems,
    by_kind,
    helm_template,
    one,
    run,
    tool,
)

VALUE_SETS = [None, *CI_VALUES]
VALUE_IDS = ["defaults", *(p.stem for p in CI_VALUES)]
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Namespace"}
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def values_args(values: Path | None) -> list[str]:
    return [] if values is None else ["--values", str(values)]


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_lint_strict(helm: str, values: Path | None) -> None:
    result = run([tool(helm), "lint", "--strict", str(CHART), *values_args(values)])
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_every_object_is_valid_for_kubernetes_1_30_to_1_35(helm: str, values: Path | None) -> None:
    objects = helm_template(helm, "--include-crds", *values_args(values))
    assert {o["kind"] for o in objects} >= {"CustomResourceDefinition", "Deployment"}
    assert all_schema_problems(objects) == []


@pytest.mark.parametrize("values", VALUE_SETS, ids=VALUE_IDS)
def test_helm_3_and_helm_4_render_the_same_objects(values: Path | None) -> None:
    def rendered(helm: str) -> list[dict[str, object]]:
        objects = helm_template(helm, *values_args(values))
        for secret in by_kind(objects, "Secret"):
            secret["data"] = {key: "<random>" for key in secret["data"]}  # type: ignore[union-attr]
        return objects

    assert rendered("helm3") == rendered("helm")


def test_operator_deployment_is_one_recreated_hardened_pod() -> None:
    deployment = one(helm_template("helm"), "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["resources"]["requests"]["cpu"]
    assert container["resources"]["limits"]["memory"]
    # The probes hit the port the operator is told to serve its liveness endpoint on.
    liveness_arg = next(a for a in container["args"] if a.startswith("--liveness="))
    port = int(re.search(r":(\d+)/", liveness_arg).group(1))  # type: ignore[union-attr]
    (declared,) = [p for p in container["ports"] if p["name"] == "health"]
    assert declared["containerPort"] == port
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_operator_command_is_a_real_voxfleet_command() -> None:
    """The container's command line parses with the real `voxfleet` CLI, flags included."""
    from engines.cli import build_parser

    container = one(helm_template("helm"), "Deployment")["spec"]["template"]["spec"]["containers"][
        0
    ]
    assert container["command"] == ["voxfleet"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "operator"
    assert args.liveness == "http://0.0.0.0:8080/healthz"


def test_operator_configuration_reaches_the_operator_as_files_and_env() -> None:
    objects = helm_template("helm", "--values", str(CHART / "ci" / "full-values.yaml"))
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VOXFLEET_WATCH_NAMESPACES"] == "speech,speech-staging"
    assert env["VOXFLEET_ENGINE_CACHE_PVC"] == "voxfleet-engine-cache"
    assert "VOXFLEET_PROMETHEUS_URL" not in env  # no URL: the status columns stay empty
    with_url = helm_template("helm", "--set", "prometheus.url=http://prometheus.monitoring:9090")
    operator = one(with_url, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "VOXFLEET_PROMETHEUS_URL", "value": "http://prometheus.monitoring:9090"} in (
        operator["env"]
    )
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # The pools file path is the mounted ConfigMap's key.
    pools_dir, pools_key = env["VOXFLEET_POOLS_FILE"].rsplit("/", 1)
    assert mounts["pools"] == pools_dir
    configmap = next(
        c
        for c in by_kind(objects, "ConfigMap")
        if c["metadata"]["name"] == volumes["pools"]["configMap"]["name"]
    )
    assert pools_key in configmap["data"]


def test_pools_file_is_what_the_operator_accepts() -> None:
    from voxfleet_operator.pools import parse_pools

    for values, expected_images in (
        (None, {"t4": "voxfleet-triton:0.1.0"}),
        (
            CHART / "ci" / "full-values.yaml",
            {
                "a10g": "registry.example.com/speech/voxfleet-triton@sha256:" + "1" * 64,
                "t4": "registry.example.com/speech/voxfleet-triton:0.1.0-trt",
            },
        ),
    ):
        objects = helm_template("helm", *values_args(values))
        configmap = next(c for c in by_kind(objects, "ConfigMap") if "pools.yaml" in c["data"])
        pools = parse_pools(yaml.safe_load(configmap["data"]["pools.yaml"]))
        assert {p.name: p.triton_image for p in pools.pools} == expected_images
        assert pools.get(None).name == ("t4" if values is None else "a10g")


def test_images_take_the_app_version_a_tag_or_a_digest() -> None:
    def image(*args: str) -> str:
        deployment = one(helm_template("helm", *args), "Deployment")
        return str(deployment["spec"]["template"]["spec"]["containers"][0]["image"])

    assert image() == "voxfleet-operator:0.1.0"
    assert image("--set", "operator.image.tag=1.2.3") == "voxfleet-operator:1.2.3"
    digest = "sha256:" + "ab" * 32
    assert (
        image("--set", "operator.image.tag=1.2.3", "--set", f"operator.image.digest={digest}")
        == f"voxfleet-operator@{digest}"
    )


def test_long_release_names_are_cut_to_63_characters_without_collisions() -> None:
    release = "speech-synthesis-for-the-customer-support-line-east-1"  # Helm's limit: 53
    assert len(release) == 53
    objects = helm_template("helm", "--set", "serviceMonitor.enabled=true", release=release)
    names = [(o["kind"], o["metadata"]["name"]) for o in objects]
    for _, name in names:
        assert len(name) <= 63 and DNS_LABEL.match(name), name
    assert len(set(names)) == len(names)
    # Suffixes survive the cut, so objects stay recognisable.
    pools = [n for k, n in names if k == "ConfigMap" and n.endswith("-pools")]
    assert len(pools) == 1


def test_name_overrides() -> None:
    objects = helm_template("helm", "--set", "nameOverride=tts", release="prod")
    deployment = one(objects, "Deployment")
    assert deployment["metadata"]["name"] == "prod-tts"
    assert deployment["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "tts"
    objects = helm_template("helm", "--set", "fullnameOverride=speech-operator", release="prod")
    assert one(objects, "Deployment")["metadata"]["name"] == "speech-operator"
    assert one(objects, "ServiceAccount")["metadata"]["name"] == "speech-operator"


def test_selector_labels_stay_fixed_and_common_labels_reach_every_object() -> None:
    objects = helm_template(
        "helm", "--set", "commonLabels.team=speech", "--set", "serviceMonitor.enabled=true"
    )
    for obj in objects:
        assert obj["metadata"]["labels"]["team"] == "speech", obj["kind"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == "voxfleet"
    deployment = one(objects, "Deployment")
    selector = deployment["spec"]["selector"]["matchLabels"]
    # Nothing that changes between releases may be in an (immutable) selector.
    assert set(selector) == {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/component",
    }
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()


def test_cluster_wide_install_uses_a_cluster_role() -> None:
    objects = helm_template("helm")
    assert not by_kind(objects, "Role")
    binding = next(
        b
        for b in by_kind(objects, "ClusterRoleBinding")
        if b["roleRef"]["name"] == "voxfleet" and b["roleRef"]["kind"] == "ClusterRole"
    )
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "voxfleet", "namespace": "voxfleet"}
    ]


def test_watched_namespaces_get_one_role_each_and_nothing_cluster_wide() -> None:
    objects = helm_template(
        "helm",
        "--values",
        str(CHART / "ci" / "namespaced-values.yaml"),
        "--set",
        "watchNamespaces={voxfleet,speech}",
    )
    assert {o["kind"] for o in objects} & CLUSTER_SCOPED == set()
    roles = {r["metadata"]["namespace"] for r in by_kind(objects, "Role")}
    bindings = by_kind(objects, "RoleBinding")
    assert roles == {"voxfleet", "speech"}
    assert {b["metadata"]["namespace"] for b in bindings} == roles
    for binding in bindings:
        assert binding["subjects"][0]["namespace"] == "voxfleet"  # where the operator runs


def test_cluster_wide_objects_are_optional() -> None:
    objects = helm_template("helm", "--set", "crdDiscovery=false", "--set", "rbac.create=false")
    assert {o["kind"] for o in objects} & CLUSTER_SCOPED == set()


def test_the_chart_holds_no_repository_key() -> None:
    """Each voice namespace gets its own random key from the operator: a key made by the
    chart would open every namespace's pools to whoever can read it."""
    objects = helm_template("helm")
    assert not by_kind(objects, "Secret")
    container = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert not [e for e in container["env"] if "REPOSITORY_KEY" in e["name"]]


def test_engine_cache_claim_is_optional_and_survives_uninstall() -> None:
    assert not by_kind(helm_template("helm"), "PersistentVolumeClaim")
    claim = one(
        helm_template("helm", "--set", "engineCache.create=true", "--set", "engineCache.size=5Gi"),
        "PersistentVolumeClaim",
    )
    assert claim["metadata"]["name"] == "voxfleet-engine-cache"
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"


def test_service_monitor_scrapes_the_metrics_services_the_operator_creates() -> None:
    from voxfleet_operator.pools import Pool
    from voxfleet_operator.render.pool import build_pool_metrics_service

    monitor = one(helm_template("helm", "--set", "serviceMonitor.enabled=true"), "ServiceMonitor")
    service = build_pool_metrics_service(Pool(name="t4"), "speech")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    ports = {p["name"] for p in service["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
