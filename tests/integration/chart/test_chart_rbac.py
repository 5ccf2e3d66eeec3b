"""The operator's RBAC: everything it creates or reads is allowed, nothing more."""

from __future__ import annotations

from typing import Any

import pytest
from chart_support import CHART, by_kind, helm_template

# Kinds the operator renders, by (apiGroup, plural); kept in step with voxfleet render below.
RESOURCES = {
    "Job": ("batch", "jobs"),
    "Deployment": ("apps", "deployments"),
    "Service": ("", "services"),
    "HorizontalPodAutoscaler": ("autoscaling", "horizontalpodautoscalers"),
    "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
    "ServiceMonitor": ("monitoring.coreos.com", "servicemonitors"),
    "Secret": ("", "secrets"),
}
CHILD_VERBS = {"create", "get", "list", "watch", "patch", "delete"}


def allowed(
    rules: list[dict[str, Any]], group: str, resource: str, name: str | None = None
) -> set[str]:
    verbs: set[str] = set()
    for rule in rules:
        if group in rule["apiGroups"] and resource in rule["resources"]:
            names = rule.get("resourceNames")
            if names is None or (name is not None and name in names):
                verbs |= set(rule["verbs"])
    return verbs


@pytest.fixture(scope="module")
def cluster_rules() -> list[dict[str, Any]]:
    objects = helm_template("helm")
    (role,) = [r for r in by_kind(objects, "ClusterRole") if r["metadata"]["name"] == "voxfleet"]
    return list(role["rules"])


def test_namespaced_and_cluster_wide_installs_grant_the_same_rules(
    cluster_rules: list[dict[str, Any]],
) -> None:
    objects = helm_template("helm", "--values", str(CHART / "ci" / "namespaced-values.yaml"))
    (role,) = by_kind(objects, "Role")
    assert role["rules"] == cluster_rules


def test_no_wildcards(cluster_rules: list[dict[str, Any]]) -> None:
    for rule in cluster_rules:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], rule


def test_every_child_kind_the_operator_renders_is_allowed(
    cluster_rules: list[dict[str, Any]], rendered_children: list[dict[str, Any]]
) -> None:
    from voxfleet_operator.names import REPOSITORY_KEY_SECRET

    kinds = {o["kind"] for o in rendered_children}
    assert kinds <= set(RESOURCES), f"RBAC test does not know {kinds - set(RESOURCES)}"
    for kind in kinds - {"Secret"}:
        group, resource = RESOURCES[kind]
        assert allowed(cluster_rules, group, resource) == CHILD_VERBS, kind
    # Secrets: create the namespace's key copy, then only that one Secret by name (its watch
    # asks for it by name).
    assert allowed(cluster_rules, "", "secrets") == {"create"}
    assert allowed(cluster_rules, "", "secrets", REPOSITORY_KEY_SECRET) == CHILD_VERBS


def test_the_operator_can_reconcile_voices_but_not_delete_them(
    cluster_rules: list[dict[str, Any]],
) -> None:
    assert allowed(cluster_rules, "voxfleet.io", "ttsvoices") == {"get", "list", "watch", "patch"}
    assert allowed(cluster_rules, "voxfleet.io", "ttsvoices/status") == {"get", "patch"}
    assert allowed(cluster_rules, "voxfleet.io", "ttsvoices/finalizers") == {"update"}
    assert allowed(cluster_rules, "", "pods") == {"get", "list", "watch", "patch"}
    assert allowed(cluster_rules, "", "events") == {"create"}
    # Never granted: reading arbitrary Secrets, ConfigMaps, nodes, or changing RBAC.
    for group, resource in (
        ("", "configmaps"),
        ("", "nodes"),
        ("rbac.authorization.k8s.io", "roles"),
    ):
        assert allowed(cluster_rules, group, resource) == set()


def test_crd_discovery_is_read_only_and_optional() -> None:
    objects = helm_template("helm")
    (role,) = [
        r
        for r in by_kind(objects, "ClusterRole")
        if r["metadata"]["name"].endswith("crd-discovery")
    ]
    assert allowed(role["rules"], "apiextensions.k8s.io", "customresourcedefinitions") == {
        "get",
        "list",
        "watch",
    }
    assert len(role["rules"]) == 1  # cluster-wide, kopf never lists namespaces
    objects = helm_template("helm", "--set", "watchNamespaces={speech}")
    (role,) = [r for r in by_kind(objects, "ClusterRole")]
    assert allowed(role["rules"], "", "namespaces") == {"list", "watch"}
    assert len(role["rules"]) == 2
    objects = helm_template("helm", "--set", "crdDiscovery=false")
    assert [r["metadata"]["name"] for r in by_kind(objects, "ClusterRole")] == ["voxfleet"]


def test_every_resource_the_operator_client_knows_is_granted(
    cluster_rules: list[dict[str, Any]],
) -> None:
    """The operator's API client can only address the resources in its table; each of them
    must be reachable with the chart's rules, or the operator fails with 403 in a cluster."""
    from voxfleet_operator.kube import PLURALS
    from voxfleet_operator.names import REPOSITORY_KEY_SECRET

    for resource in PLURALS.values():
        if resource.plural == "configmaps":
            continue  # only with speechApi.enabled (test_chart_speech_api checks those rules)
        name = REPOSITORY_KEY_SECRET if resource.plural == "secrets" else None
        verbs = allowed(cluster_rules, resource.group, resource.plural, name)
        assert {"get"} <= verbs, f"{resource.group or 'core'}/{resource.plural}: {verbs}"


def test_every_resource_kopf_watches_is_listable_and_watchable(
    cluster_rules: list[dict[str, Any]],
) -> None:
    """kopf lists and watches every resource a handler is registered for (TTSVoices, and the
    Jobs and Pods the operator reacts to); a 403 there stops the operator in a cluster.
    kopf keeps its handlers in private registries (kopf 1.45); the test reads them."""
    from voxfleet_operator.handlers import build_registry
    from voxfleet_operator.names import REPOSITORY_KEY_SECRET

    registry = build_registry()
    watched: set[tuple[str, str]] = set()
    for name in ("_indexing", "_watching", "_changing", "_spawning"):
        for handler in getattr(registry, name).get_all_handlers():
            selector = handler.selector
            resource = selector.plural or selector.any_name
            assert resource, f"cannot tell which resource {selector} watches"
            watched.add((selector.group or "", resource))
    assert ("voxfleet.io", "ttsvoices") in watched
    for group, resource in sorted(watched):
        # The key Secret is watched by its name (a field selector): RBAC grants that one.
        name = REPOSITORY_KEY_SECRET if resource == "secrets" else None
        verbs = allowed(cluster_rules, group, resource, name)
        assert {"list", "watch"} <= verbs, (group, resource)
