"""The documented rules of the node agent's pure parts: `$(VAR)` expansion, env order, and
CPU sets from requests."""

from __future__ import annotations

import base64

import pytest
from cluster.cpus import CpuAllocator
from cluster.env import ConfigError, container_argv, container_env, expand

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u", "labels": {"app": "a"}},
    "spec": {},
    "status": {"podIP": "10.213.0.9"},
}


def test_expansion_follows_kubernetes() -> None:
    variables = {"A": "1", "B": "two"}
    assert expand("$(A)-$(B)", variables) == "1-two"
    assert expand("$$(A) $(MISSING) $(cat x)", variables) == "$(A) $(MISSING) $(cat x)"


def test_env_refers_only_to_what_is_defined_before() -> None:
    container = {
        "name": "c",
        "command": ["run", "--who=$(WHO)", "--later=$(LATER)", "--path=$(PATH)"],
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "WHO", "value": "$(CM_X)@$(LATER)"},
            {"name": "LATER", "value": "late"},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "none", "key": "k", "optional": True}},
            },
        ],
    }
    config_maps = {"cm": {"metadata": {"name": "cm"}, "data": {"X": "x"}}}
    env, defined = container_env(POD, container, {}, config_maps, {"PATH": "/bin"})
    assert env["WHO"] == "x@$(LATER)" and env["APP"] == "a" and "OPT" not in env
    assert env["PATH"] == "/bin" and "PATH" not in defined  # the image's env is not expanded
    assert container_argv(container, defined) == [
        "run",
        "--who=x@$(LATER)",
        "--later=late",
        "--path=$(PATH)",
    ]


def test_a_missing_key_says_which() -> None:
    container = {
        "name": "c",
        "command": ["x"],
        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "nope"}}}],
    }
    secret = {
        "metadata": {"name": "s", "namespace": "ns"},
        "data": {"k": base64.b64encode(b"v").decode()},
    }
    with pytest.raises(ConfigError, match="couldn't find key nope in Secret ns/s"):
        container_env(POD, container, {"s": secret}, {}, {})


def test_cpu_sets_spread_then_share() -> None:
    cpus = CpuAllocator({0, 1})
    assert cpus.allocate("a", 1) == [0]
    assert cpus.allocate("b", 0.5) == [1]
    assert cpus.allocate("c", 1) == [0]  # both busy: the lowest least-loaded core
    assert cpus.allocate("d", 2) == [0, 1]
    assert cpus.allocate("e", 0) == [0, 1]  # no request: every core
    cpus.release("b")
    assert cpus.allocate("f", 1) == [1]
