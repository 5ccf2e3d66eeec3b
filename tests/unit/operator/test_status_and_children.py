"""Status bookkeeping and create-or-patch decisions: what makes a write, what does not."""

from __future__ import annotations

from typing import Any

from voxfleet_operator.children import departures, foreign_edits, in_line, with_owners
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


def test_live_objects_with_server_defaults_need_no_write() -> None:
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


def test_a_selector_key_someone_added_is_put_back() -> None:
    desired = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "s", "namespace": "n"},
        "spec": {"selector": {"voice": "joe"}},
    }
    written = {
        "metadata": {"name": "s", "labels": {"x": "1"}},
        "spec": {"selector": {"voice": "joe"}, "clusterIP": "10.0.0.1"},
    }
    live = {
        "metadata": {"name": "s", "namespace": "n", "labels": {"x": "1", "y": "2"}},
        "spec": {"selector": {"voice": "joe", "app": "other"}, "clusterIP": "10.0.0.1"},
    }
    # Applying again would not remove it (it is not the operator's); the edit is undone.
    assert in_line(desired, live)
    assert foreign_edits(written, live, desired) == [
        {"op": "remove", "path": "/spec/selector/app"}  # one more label selects other pods
    ]  # other labels on the object are not ours


def test_a_field_the_operator_applied_and_renders_no_more_is_applied_away() -> None:
    desired = {"metadata": {"name": "s"}, "spec": {"selector": {"voice": "joe"}}}
    live = {
        "metadata": {
            "name": "s",
            "managedFields": [
                {
                    "manager": "voxfleet-operator",
                    "operation": "Apply",
                    "fieldsV1": {"f:spec": {"f:selector": {"f:voice": {}, "f:pool": {}}}},
                },
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "fieldsV1": {"f:spec": {"f:clusterIP": {}}},
                },
            ],
        },
        "spec": {"selector": {"voice": "joe", "pool": "t4"}, "clusterIP": "10.0.0.1"},
    }
    assert departures(desired, live) == [".spec.selector.pool"]


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


def test_server_defaults_and_the_hpas_replicas_are_no_departure() -> None:
    assert departures(POD_TEMPLATE, _live()) == []
    # apiVersion and kind name the object; an answer with or without them is the same object.
    without_kind = {k: v for k, v in _live().items() if k not in ("apiVersion", "kind")}
    assert in_line(POD_TEMPLATE, without_kind)
    assert in_line({k: v for k, v in POD_TEMPLATE.items() if k != "kind"}, _live())
    scaled = _live()
    scaled["spec"]["replicas"] = 7  # type: ignore[index]
    assert foreign_edits(_live(), scaled, POD_TEMPLATE) == []


def test_a_rollout_restart_is_not_undone() -> None:
    restarted = _live()
    template = restarted["spec"]["template"]  # type: ignore[index]
    template["metadata"]["annotations"] = {"kubectl.kubernetes.io/restartedAt": "now"}
    assert foreign_edits(_live(), restarted, POD_TEMPLATE) == []
    assert in_line(POD_TEMPLATE, restarted)


def test_fields_added_to_the_gpu_pods_are_put_back_as_they_were() -> None:
    live = _live(hostNetwork=True, serviceAccountName="admin")
    pod = live["spec"]["template"]["spec"]  # type: ignore[index]
    pod["containers"][0]["securityContext"]["privileged"] = True
    pod["containers"].append({"name": "sidecar", "image": "busybox"})
    pod["dnsPolicy"] = "None"
    edits = foreign_edits(_live(), live, POD_TEMPLATE)
    spec = "/spec/template/spec"
    assert sorted(edits, key=lambda e: e["path"]) == [
        {"op": "remove", "path": f"{spec}/containers/0/securityContext/privileged"},
        {"op": "remove", "path": f"{spec}/containers/1"},
        {"op": "replace", "path": f"{spec}/dnsPolicy", "value": "ClusterFirst"},
        {"op": "remove", "path": f"{spec}/hostNetwork"},
        {"op": "replace", "path": f"{spec}/serviceAccountName", "value": "default"},
    ]
    # A rendered field someone changed is the apply's to put back.
    pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] = True
    assert departures(POD_TEMPLATE, live) == [
        ".spec.template.spec.containers[0]"  # no live container is the rendered one
    ]


def test_elements_are_removed_from_the_end_so_indices_hold() -> None:
    base = {"spec": {"tolerations": [{"key": "a"}]}}
    live = {"spec": {"tolerations": [{"key": "a"}, {"key": "b"}, {"key": "c"}]}}
    paths = [
        e["path"] for e in foreign_edits(base, live, {"spec": {"tolerations": [{"key": "a"}]}})
    ]
    assert paths == ["/spec/tolerations/2", "/spec/tolerations/1"]


async def test_a_pass_on_a_voice_older_than_its_last_status_write_writes_nothing() -> None:
    """kopf can hand a pass the voice as it was before the previous pass wrote its status:
    the engines built, that pass must not flip EngineReady again (a new transition time) and
    write it once more."""
    from voxfleet_operator.context import Runtime
    from voxfleet_operator.reconcile import write_status

    class Client:
        def __init__(self) -> None:
            self.writes: list[dict[str, Any]] = []

        async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            self.writes.append(args[3])
            meta = {"namespace": "tts", "name": "joe", "resourceVersion": "12"}
            return {"metadata": meta, "status": args[3]["status"]}

    rt = Runtime.__new__(Runtime)  # only the client and the statuses are used here
    rt.client = Client()  # type: ignore[assignment]
    rt.statuses = {}
    building = [Cond("EngineReady", False, "Building", "Job j")]
    built = [Cond("EngineReady", True, "EnginesBuilt", "Job j built engines k")]
    old = build_status(None, phase="Building", conditions=building, generation=1, now="t1")
    stale = {"metadata": {"name": "joe", "namespace": "tts", "resourceVersion": "10"}}
    stale["status"] = old
    ready = build_status(old, phase="Pending", conditions=built, generation=1, now="t2")
    assert await write_status(rt, stale, ready)

    body = rt.with_latest_status(stale)
    again = build_status(
        body.get("status"), phase="Pending", conditions=built, generation=1, now="t3"
    )
    assert again["conditions"][0]["lastTransitionTime"] == "t2"
    assert not await write_status(rt, body, again)
    assert len(rt.client.writes) == 1  # type: ignore[attr-defined]
