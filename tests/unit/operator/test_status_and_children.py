"""Status bookkeeping and create-or-patch decisions: what makes a write, what does not."""

from __future__ import annotations

from voxfleet_operator.children import _patch_of, drift, in_line, with_owners
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
    assert in_line(desired, live)
    assert not in_line({"spec": {"ports": [{"name": "grpc"}, {"name": "http"}]}}, live)
    assert not in_line({"spec": {"replicas": 2}}, live)
    assert not in_line({"a": True}, {"a": 1})  # a boolean is not a number


def test_selectors_must_match_exactly_and_extra_keys_are_removed() -> None:
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
    assert not in_line(desired, live)  # one more label would select other pods
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


POD_TEMPLATE = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "d", "namespace": "n"},
    "spec": {
        "template": {
            "spec": {
                "securityContext": {"runAsNonRoot": True},
                "containers": [
                    {
                        "name": "triton",
                        "image": "triton",
                        "securityContext": {"allowPrivilegeEscalation": False},
                    }
                ],
            }
        }
    },
}


def _live(**pod_extra: object) -> dict[str, object]:
    """POD_TEMPLATE as an API server returns it: defaults filled in, plus `pod_extra`."""
    import copy

    live = copy.deepcopy(POOL_DEFAULTED)
    live["spec"]["template"]["spec"].update(pod_extra)  # type: ignore[index]
    return live


POOL_DEFAULTED: dict[str, object] = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "d", "namespace": "n", "uid": "u", "annotations": {"x": "y"}},
    "spec": {
        "replicas": 3,  # the HPA's
        "revisionHistoryLimit": 10,
        "progressDeadlineSeconds": 600,
        "template": {
            "metadata": {"creationTimestamp": None},
            "spec": {
                "securityContext": {"runAsNonRoot": True},
                "restartPolicy": "Always",
                "dnsPolicy": "ClusterFirst",
                "schedulerName": "default-scheduler",
                "serviceAccountName": "default",
                "serviceAccount": "default",
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "triton",
                        "image": "triton",
                        "imagePullPolicy": "IfNotPresent",
                        "terminationMessagePath": "/dev/termination-log",
                        "terminationMessagePolicy": "File",
                        "resources": {},
                        "securityContext": {"allowPrivilegeEscalation": False},
                    }
                ],
            },
        },
    },
    "status": {"replicas": 3},
}


def test_server_defaults_and_the_hpas_replicas_are_not_drift() -> None:
    assert drift(POD_TEMPLATE, _live()) == []
    # apiVersion and kind name the object; an answer with or without them is the same object.
    without_kind = {k: v for k, v in _live().items() if k not in ("apiVersion", "kind")}
    assert in_line(POD_TEMPLATE, without_kind)
    assert in_line({k: v for k, v in POD_TEMPLATE.items() if k != "kind"}, _live())
    live = _live(hostNetwork=True)
    assert "kind" not in _patch_of(POD_TEMPLATE, live)  # never a null kind


def test_fields_added_to_a_rendered_object_are_drift_and_patched_away() -> None:
    live = _live(hostNetwork=True, serviceAccountName="admin", serviceAccount="admin")
    container = live["spec"]["template"]["spec"]["containers"][0]  # type: ignore[index]
    container["securityContext"]["privileged"] = True
    found = drift(POD_TEMPLATE, live)
    assert ".spec.template.spec.hostNetwork" in found
    assert ".spec.template.spec.serviceAccountName" in found
    assert ".spec.template.spec.containers[0].securityContext.privileged" in found
    patch = _patch_of(POD_TEMPLATE, live)
    pod = patch["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is None and pod["serviceAccountName"] is None
    # Lists are replaced whole by a merge patch: the rendered container, without privileged.
    assert pod["containers"] == POD_TEMPLATE["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    assert "replicas" not in patch["spec"]  # the HPA's, left alone


def test_an_extra_sidecar_is_drift() -> None:
    live = _live()
    containers = live["spec"]["template"]["spec"]["containers"]  # type: ignore[index]
    containers.append({"name": "sidecar", "image": "busybox"})
    assert drift(POD_TEMPLATE, live) == [".spec.template.spec.containers"]
