"""A pod reports the GPU memory the device charges it, not only what its allocations took: the
CUDA context and the pod's MPS server are in `used`, so the operator places no voice past a
pod that the device counts as nearly full (the 512 MiB margin kept on top)."""

from __future__ import annotations

import sys
import types

import pytest
from voxfleet_operator.placement import MARGIN_MIB, PodRoom, place_voice

from engines.pod.voice_host.host import (
    MIB,
    GpuMemoryMeter,
    VoiceHost,
    charged_bytes,
    device_used_bytes,
)

GIB = 1 << 30


def fake_torch(free: int, total: int) -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(mem_get_info=lambda: (free, total))  # type: ignore[attr-defined]
    return torch


def test_the_drivers_count_of_the_pods_processes_is_read_from_nvidia_smi() -> None:
    apps = "4242, 7430\n99, 1200\n4300, 1387\n5000, [N/A]\n"
    assert charged_bytes(apps, {4242, 4300}) == (7430 + 1387) * MIB
    assert charged_bytes(apps, {1}) == 0
    assert charged_bytes("", {4242}) == 0
    # The GPU's own count where nvidia-smi shows the pod's one GPU; not where it shows two.
    assert device_used_bytes("8817\n") == 8817 * MIB
    assert device_used_bytes("8817\n1200\n") is None
    assert device_used_bytes("[N/A]\n") is None


def test_a_pod_the_device_counts_as_nearly_full_gets_no_further_voice(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A 16 GiB budget (MPS per-client limit): the allocator's view says 7,430 MiB are used;
    # the driver counts 15,900 MiB for the voice host and its MPS server together.
    monkeypatch.setitem(sys.modules, "torch", fake_torch(16 * GIB - 7430 * MIB, 80 * GIB))
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=16G")
    meter = GpuMemoryMeter(charged=lambda: 15900 * MIB)
    assert meter.total() == 16 * GIB
    assert meter.used() == 15900 * MIB
    assert meter.allocated() == 7430 * MIB  # what a load measures its footprint by
    host = VoiceHost(gpu_meter=lambda: meter)
    try:
        host._meter("gpu")
        report = host.memory().to_dict()
    finally:
        host.close()
    assert report["device"] == "gpu"
    assert report["used_mib"] == pytest.approx(15900)
    assert report["free_mib"] == pytest.approx(16 * 1024 - 15900)
    pods = [{"metadata": {"name": "triton-0", "labels": {}}}]
    # 484 MiB free: a 43 MiB voice with the 512 MiB margin on top does not fit.
    room = PodRoom.from_report("triton-0", report)
    assert place_voice("amy", pods, None, rooms={"triton-0": room}, need_mib=43.0).serve == ()
    # By the allocator's view alone the operator would have placed it past what the device
    # holds.
    seen = PodRoom.from_report("triton-0", {**report, "used_mib": 7430.0})
    placed = place_voice("amy", pods, None, rooms={"triton-0": seen}, need_mib=43.0)
    assert placed.serve == ("triton-0",)
    assert MARGIN_MIB == 512.0


def test_without_nvidia_smi_the_free_memory_is_the_measure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "torch", fake_torch(10 * GIB, 16 * GIB))
    monkeypatch.delenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", raising=False)
    meter = GpuMemoryMeter(charged=lambda: None)
    assert meter.used() == 6 * GIB
