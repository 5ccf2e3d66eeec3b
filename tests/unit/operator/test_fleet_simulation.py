"""A fleet of 500 voices placed by the operator's own placement functions.

Each voice's demand follows Zipf(1.1) over 500 voices (20,000 streams in all). A voice takes
one replica per `REPLICA_STREAMS` of its demand (hot voices spread over pods), each replica
on a pod of its own where its memory and its streams fit (`place_voice`, as the operator
places a voice on ready pods by their reports); where a replica fits no pod, the pool gets a
pod (the scale-up the operator asks the HPA for). The pods it ends with are compared with the
lower bound: enough pods for every voice's memory once, and for every stream.

The sizes are measured ones (docs/gpu.md, H200 under a 16 GiB MPS limit, 2026-11-28): a pod
places voices in 16,384 MiB, its fixed part takes 4,547 MiB and keeps 512 MiB spare, and a
voice takes 43 MiB. A pod's streams are taken as 1,000: what a T4 holds is not measured, and
the ratio is what this checks.
"""

from __future__ import annotations

import math

from voxfleet_operator.placement import PodRoom, place_voice

VOICES = 500
STREAMS = 20_000
ZIPF = 1.1
POD_MIB, FIXED_MIB, MARGIN_MIB, VOICE_MIB = 16_384.0, 4_547.0, 512.0, 43.0
POD_STREAMS = 1_000.0
REPLICA_STREAMS = POD_STREAMS / 2


def zipf_demand(voices: int, total: float, exponent: float) -> list[float]:
    weights = [1.0 / (k**exponent) for k in range(1, voices + 1)]
    scale = total / sum(weights)
    return [w * scale for w in weights]


def simulate() -> tuple[int, int, list[PodRoom]]:
    """(pods used, lower bound, the pods)."""
    demand = zipf_demand(VOICES, STREAMS, ZIPF)
    pods: list[dict] = []
    rooms: dict[str, PodRoom] = {}

    def new_pod() -> dict:
        name = f"pod-{len(pods):03d}"
        pod = {"metadata": {"name": name, "labels": {}}}
        pods.append(pod)
        rooms[name] = PodRoom(name, POD_MIB, FIXED_MIB, {}, 0.0, POD_STREAMS)
        return pod

    for index, streams in enumerate(demand):  # hottest first, as Zipf orders them
        voice = f"voice-{index:03d}"
        replicas = max(1, math.ceil(streams / REPLICA_STREAMS))
        share = streams / replicas
        placement = place_voice(
            voice,
            pods,
            replicas,
            rooms=rooms,
            need_mib=VOICE_MIB,
            margin_mib=MARGIN_MIB,
            demand=share,
        )
        chosen = list(placement.serve)
        for _ in range(placement.unplaced):  # scale up: a pod per replica that fits nowhere
            chosen.append(new_pod()["metadata"]["name"])
        for name in chosen:
            rooms[name] = rooms[name].with_voice(voice, VOICE_MIB, share)
            pod = next(p for p in pods if p["metadata"]["name"] == name)
            pod["metadata"]["labels"][f"serving.voxfleet.io/{voice}"] = "true"
    room = POD_MIB - FIXED_MIB - MARGIN_MIB
    lower = max(math.ceil(VOICES * VOICE_MIB / room), math.ceil(STREAMS / POD_STREAMS))
    return len(pods), lower, list(rooms.values())


def test_500_zipf_voices_use_at_most_1_1_times_the_gpus_the_bound_allows() -> None:
    used, lower, rooms = simulate()
    print(f"\nfleet: {used} pods for a lower bound of {lower}: {used / lower:.3f}")
    assert used / lower <= 1.1
    # Nothing was placed past a pod's memory or streams, and every voice is on a pod.
    for room in rooms:
        assert room.used_mib + MARGIN_MIB <= room.total_mib
        assert room.streams <= room.stream_capacity + 1e-6
    placed = {voice for room in rooms for voice in room.voices}
    assert len(placed) == VOICES
