"""The packing run's memory figures: a further voice costs what the pod grew by per voice,
not only what the pod attributes to it, and the fixed cost is what is left at zero voices."""

from __future__ import annotations

import pytest

from lab.packing import memory_costs


def report(used_mib: float, voices: int, each_mib: float = 43.0) -> dict:
    names = ["joe"] + [f"voice-{i:03d}" for i in range(voices - 1)]
    return {"used_mib": used_mib, "voices": {n: {"mib": each_mib} for n in names}}


def test_growth_the_pod_does_not_attribute_counts_against_each_voice() -> None:
    # The H200 run under 16 GiB: 2,998.2 MiB with joe alone, 7,432.2 with 101 voices, each
    # voice reported at 43.0 MiB: 91 MiB grew that no voice reports.
    costs = memory_costs(report(2998.2, 1), report(7432.2, 101), "joe")
    assert costs["per_voice_mib"] == pytest.approx(44.3, abs=0.05)
    assert costs["fixed_mib"] == pytest.approx(2998.2 - 44.34, abs=0.05)
    assert costs["per_voice_attributed_mib"] == 43.0
    assert costs["unattributed_mib"] == pytest.approx(7432.2 - 101 * 43.0)


def test_one_voice_gives_no_slope() -> None:
    costs = memory_costs(report(2998.2, 1), report(2998.2, 1), "joe")
    assert costs["per_voice_mib"] is None and costs["fixed_mib"] is None
