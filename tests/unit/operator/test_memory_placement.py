"""Placement by measured memory: a voice goes only where its footprint and the margin fit by
the pods' own reports, a full pod never gets one, and the pool is sized for its voices."""

from __future__ import annotations

from typing import Any

import pytest
from voxfleet_operator.placement import (
    DEFAULT_VOICE_MIB,
    MARGIN_MIB,
    PodRoom,
    place_voice,
    pods_for_memory,
    voice_size_mib,
)
from voxfleet_operator.pods import memory_shortfall, pool_memory_pods


def pod(name: str, *voices: str) -> dict[str, Any]:
    labels = {"voxfleet.io/pool": "t4", **{f"serving.voxfleet.io/{v}": "true" for v in voices}}
    return {"metadata": {"name": name, "labels": labels}}


def report(total: float, used: float, **voices: float) -> dict[str, Any]:
    """A pod's /memory report as the voice host writes it (MiB)."""
    return {
        "device": "gpu",
        "total_mib": total,
        "used_mib": used,
        "free_mib": total - used,
        "fixed_mib": used - sum(voices.values()),
        "voices": {name: {"mib": mib} for name, mib in voices.items()},
    }


def rooms(**reports: dict[str, Any]) -> dict[str, PodRoom]:
    return {name: PodRoom.from_report(name, r) for name, r in reports.items()}


def test_a_pod_that_reports_full_memory_never_gets_a_voice() -> None:
    full = rooms(a=report(16384, 16384), b=report(16384, 5000, amy=43))
    placement = place_voice("joe", [pod("a"), pod("b", "amy")], None, rooms=full, need_mib=43)
    assert placement.serve == ("b",) and placement.unplaced == 0
    # With replicas too: the full pod is not taken even when the count asks for it.
    placement = place_voice("joe", [pod("a"), pod("b", "amy")], 2, rooms=full, need_mib=43)
    assert placement.serve == ("b",) and placement.unplaced == 1


def test_the_margin_counts_and_a_pod_that_does_not_report_is_left_to_its_host() -> None:
    # 16384 - 15850 = 534 MiB free: 43 MiB fits, 43 + the 512 MiB margin does not.
    tight = rooms(a=report(16384, 15850))
    assert place_voice("joe", [pod("a")], None, rooms=tight, need_mib=43).unplaced == 1
    assert place_voice("joe", [pod("a")], None, rooms=tight, need_mib=43, margin_mib=0).serve == (
        "a",
    )
    assert place_voice("joe", [pod("a")], None, rooms={}, need_mib=43).serve == ("a",)


def test_a_voice_stays_where_it_is_served_even_on_a_full_pod() -> None:
    full = rooms(a=report(16384, 16384, joe=43))
    placement = place_voice("joe", [pod("a", "joe")], None, rooms=full, need_mib=43)
    assert placement.serve == ("a",) and placement.release == ()


def test_new_pods_are_the_least_loaded_then_the_most_free() -> None:
    state = rooms(a=report(16384, 9000), b=report(16384, 6000), c=report(16384, 12000))
    pods = [pod("a", "amy"), pod("b", "amy"), pod("c")]
    # c serves no voice: least loaded; then b (more free than a).
    assert place_voice("joe", pods, 2, rooms=state, need_mib=43).serve == ("c", "b")


def test_copies_of_a_placed_voice_leave_room_for_voices_that_fit_nowhere() -> None:
    # joe is on `a`; `b` was added for a voice that fit no pod (1 GiB pending).
    state = rooms(a=report(16384, 16000, joe=43), b=report(16384, 15000))
    pods = [pod("a", "joe"), pod("b")]
    assert place_voice("joe", pods, None, rooms=state, need_mib=43).serve == ("a", "b")
    held = place_voice("joe", pods, None, rooms=state, need_mib=43, reserve_mib=1024)
    assert held.serve == ("a",)
    # A voice that is on no pod yet is not held back by the reserve.
    assert place_voice("kim", pods, None, rooms=state, need_mib=43, reserve_mib=1024).serve == (
        "b",
    )


def test_a_voices_size_is_its_own_report_else_its_pools_else_the_default() -> None:
    state = rooms(a=report(16384, 5000, joe=44, amy=40), b=report(16384, 5000, kim=42))
    assert voice_size_mib("joe", state.values(), "gpu") == 44
    assert voice_size_mib("new", state.values(), "gpu") == 42  # median of 44, 40, 42
    assert voice_size_mib("new", [], "gpu") == DEFAULT_VOICE_MIB["gpu"]


@pytest.mark.parametrize(
    ("sizes", "capacity", "pods"),
    [
        ([43.0] * 100, 11325, 1),
        ([43.0] * 500, 11325, 2),
        ([6000, 6000, 6000], 11325, 3),
        ([], 100, 1),
    ],
)
def test_a_pool_is_sized_for_its_voices_memory(
    sizes: list[float], capacity: float, pods: int
) -> None:
    assert pods_for_memory(sizes, capacity) == pods


def test_the_shortfall_message_gives_the_numbers_and_what_happens_next() -> None:
    state = rooms(a=report(16384, 16300), b=report(16384, 16000))
    scaling = memory_shortfall("joe", 43, state, ready_pods=2, max_pods=4)
    assert not scaling.at_max_pods
    assert scaling.message() == (
        f"voice joe needs 43 MiB of memory plus {MARGIN_MIB:.0f} MiB spare on a pod, and the most "
        "any of the pool's 2 ready pod(s) has free is 384 MiB of 16384 MiB; the pool is being "
        "scaled up (maxPods 4)"
    )
    stuck = memory_shortfall("joe", 43, state, ready_pods=4, max_pods=4)
    assert stuck.at_max_pods and stuck.message().endswith("the pool is at its maxPods (4)")


def test_the_pool_floor_counts_every_voice_once_and_those_waiting() -> None:
    # Two pods with 4000 MiB fixed each: 16384 - 4000 - 512 = 11872 MiB for voices a pod.
    state = rooms(
        a=report(16384, 4000 + 6000, joe=6000),
        b=report(16384, 4000 + 6000 + 5000, joe=6000, amy=5000),
    )
    assert pool_memory_pods(state, {}) == 1  # joe (once) and amy: 11000 MiB
    assert pool_memory_pods(state, {"kim": 5000}) == 2
    assert pool_memory_pods({}, {"kim": 5000}) == 0  # no report: the HPA keeps its floor
