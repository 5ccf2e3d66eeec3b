"""Values that must be refused, with a message that names what is wrong (Helm 3 and 4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_support import HELMS, helm_template_error

T4 = {"name": "t4", "gpuProduct": "Tesla-T4"}

# (id, values, words the error must contain so that a person can find the field)
BAD_VALUES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("no-pools", {"pools": []}, ["pools"]),
    ("zero-gpus", {"pools": [{**T4, "gpusPerPod": 0}]}, ["gpusPerPod", "1"]),
    ("too-many-gpus", {"pools": [{**T4, "gpusPerPod": 17}]}, ["gpusPerPod", "16"]),
    ("pool-name-not-dns", {"pools": [{"name": "T4_pool"}], "defaultPool": "T4_pool"}, ["name"]),
    ("pool-without-name", {"pools": [{"gpuProduct": "Tesla-T4"}]}, ["name"]),
    ("pool-unknown-field", {"pools": [{**T4, "gpus": 2}]}, ["gpus"]),
    ("max-pods-string", {"pools": [{**T4, "maxPods": "four"}]}, ["maxPods"]),
    ("memory-not-quantity", {"pools": [{**T4, "memory": "16 GB"}]}, ["memory"]),
    ("unknown-runtime", {"pools": [{**T4, "runtime": "cuda"}]}, ["runtime"]),
    ("digest-not-sha256", {"operator": {"image": {"repository": "x", "digest": "latest"}}},
     ["digest"]),
    ("image-repository-empty", {"tritonImage": {"repository": ""}}, ["repository"]),
    ("namespace-not-dns", {"watchNamespaces": ["Speech_Team"]}, ["watchNamespaces"]),
    ("unknown-top-level-value", {"replicaCount": 2}, ["replicaCount"]),
    ("interval-not-duration", {"serviceMonitor": {"interval": "fast"}}, ["interval"]),
    ("access-mode-unknown", {"engineCache": {"accessModes": ["ReadWriteAll"]}}, ["accessModes"]),
    ("prometheus-url-not-http", {"prometheus": {"url": "prometheus:9090"}}, ["url"]),
    ("health-port-privileged", {"operator": {"image": {"repository": "x"}, "healthPort": 80}},
     ["healthPort"]),
    # Cross-field rules the template enforces (JSON Schema draft-07 cannot).
    ("default-pool-unknown", {"defaultPool": "a100"}, ["defaultPool", "a100", "t4"]),
    ("pool-names-repeated", {"pools": [T4, T4]}, ["unique", "t4"]),
]  # fmt: skip


@pytest.mark.parametrize("helm", HELMS)
@pytest.mark.parametrize(
    ("values", "words"), [(v, w) for _, v, w in BAD_VALUES], ids=[i for i, _, _ in BAD_VALUES]
)
def test_bad_values_are_refused_with_a_readable_reason(
    helm: str, values: dict[str, Any], words: list[str], tmp_path: Path
) -> None:
    file = tmp_path / "values.yaml"
    file.write_text(yaml.safe_dump(values))
    error = helm_template_error(helm, "--values", str(file))
    for word in words:
        assert word in error, f"{word!r} missing from:\n{error}"


@pytest.mark.parametrize("helm", HELMS)
def test_clusters_older_than_1_30_are_refused(helm: str) -> None:
    error = helm_template_error(helm, "--kube-version", "1.29.5")
    assert "requires kubeVersion: >=1.30.0-0" in error
