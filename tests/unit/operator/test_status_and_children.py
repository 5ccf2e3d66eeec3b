"""Status bookkeeping and create-or-patch decisions: what makes a write, what does not."""

from __future__ import annotations

from voxfleet_operator.children import is_subset, with_owners
from voxfleet_operator.status import Cond, build_status, status_changed


def test_unchanged_world_gives_an_identical_status() -> None:
    conditions = [Cond("EngineReady", False, "Building", "Job x"), Cond("Available", None, "X")]
    first = build_status(
        None, phase="Building", conditions=conditions, generation=1, now="2026-01-01T00:00:00Z"
    )
    again = build_status(
        first, phase="Building", conditions=conditions, generation=1, now="2026-01-01T00:05:00Z"
    )
    assert again == first
    assert not status_changed(first, again)
    assert [c["status"] for c in first["conditions"]] == ["False", "Unknown"]


def test_transition_time_moves_only_when_the_status_flips() -> None:
    building = [Cond("EngineReady", False, "Building", "running")]
    first = build_status(None, phase="Building", conditions=building, generation=1, now="t1")
    message_only = [Cond("EngineReady", False, "Building", "still running")]
    second = build_status(first, phase="Building", conditions=message_only, generation=1, now="t2")
    assert second["conditions"][0]["lastTransitionTime"] == "t1"
    assert status_changed(first, second)
    ready = [Cond("EngineReady", True, "EnginesBuilt")]
    third = build_status(second, phase="Pending", conditions=ready, generation=2, now="t3")
    assert third["conditions"][0]["lastTransitionTime"] == "t3"
    assert third["conditions"][0]["observedGeneration"] == 2


def test_cleared_fields_count_as_a_change() -> None:
    old = {"phase": "Ready", "engineKey": "abc", "conditions": []}
    new = {"phase": "Ready", "engineKey": None, "conditions": []}
    assert status_changed(old, new)
    assert not status_changed({"phase": "Ready", "conditions": []}, new)


def test_live_objects_with_server_defaults_need_no_patch() -> None:
    desired = {"spec": {"ports": [{"name": "grpc", "port": 8001}], "replicas": 1}}
    live = {
        "metadata": {"uid": "u", "resourceVersion": "9"},
        "spec": {"ports": [{"name": "grpc", "port": 8001, "protocol": "TCP"}], "replicas": 1.0},
        "status": {"ready": True},
    }
    assert is_subset(desired, live)
    assert not is_subset({"spec": {"ports": [{"name": "grpc"}, {"name": "http"}]}}, live)
    assert not is_subset({"spec": {"replicas": 2}}, live)
    assert not is_subset({"a": True}, {"a": 1})  # a boolean is not a number


def test_selectors_must_match_exactly_and_extra_keys_are_removed() -> None:
    from voxfleet_operator.children import _patch_of

    desired = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "n"},
        "spec": {"selector": {"voice": "joe"}},
    }
    live = {
        "metadata": {"name": "s", "labels": {"x": "1"}},
        "spec": {"selector": {"voice": "joe", "app": "other"}, "clusterIP": "10.0.0.1"},
    }
    assert not is_subset(desired, live)  # one more label would select other pods
    patch = _patch_of(desired, live)
    assert patch["spec"] == {"selector": {"voice": "joe", "app": None}}
    assert "labels" not in patch["metadata"]  # other labels on the object are not ours


def test_shared_children_have_no_single_controller() -> None:
    obj = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "n"}}

    def owner(name: str) -> dict[str, object]:
        return {
            "apiVersion": "voxfleet.io/v1alpha1",
            "kind": "TTSVoice",
            "metadata": {"name": name, "uid": f"uid-{name}"},
        }

    one = with_owners(obj, [owner("a")])
    assert one["metadata"]["ownerReferences"][0]["controller"] is True
    two = with_owners(obj, [owner("a"), owner("b")])
    assert [r["controller"] for r in two["metadata"]["ownerReferences"]] == [False, False]
    assert "ownerReferences" not in obj["metadata"]  # the rendered object is left alone
