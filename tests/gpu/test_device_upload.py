"""Host arrays onto the GPU without stalling the host (marked `gpu`; skipped without CUDA).

Every call the voice host launches uploads a little: a vocoder call its frame index, an
encoder call its phonemes, a flow call its mask. A copy from pageable memory may wait for
everything queued on the stream, so the host would stall behind the calls it launched before
and the device would idle while the host launches the next ones. `upload` must return while
the device is still busy, with the values the host had when it asked.

Run on the GPU machine: ``pytest -q tests/gpu/test_device_upload.py``.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BUSY_S = 0.3


def _keep_the_device_busy(seconds: float) -> None:
    """Queue a kernel that spins for about `seconds` (calibrated on this GPU)."""
    cycles = 10_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    per_cycle_s = start.elapsed_time(end) / 1000.0 / cycles
    torch.cuda._sleep(int(seconds / per_cycle_s))


@pytest.mark.parametrize("windows", [1, 16, 128])
def test_an_upload_returns_while_the_device_is_busy(windows: int) -> None:
    from engines.runtimes.device_frames import upload

    device = torch.device("cuda", torch.cuda.current_device())
    # A vocoder call's frame index: windows x 144 frames of int64 (1 to 147 KiB), and a flow
    # call's mask of as many float32 frames.
    index = np.arange(windows * 144, dtype=np.int64).reshape(windows, 144)
    mask = np.ones((windows, 1, 2048), dtype=np.float32)
    torch.cuda.synchronize()
    _keep_the_device_busy(BUSY_S)
    started = time.perf_counter()
    on_device = [upload(index, device), upload(mask, device)]
    took = time.perf_counter() - started
    still_busy = not torch.cuda.current_stream().query()
    index[:] = -1  # the caller may reuse its arrays at once
    mask[:] = 0.0
    torch.cuda.synchronize()
    assert still_busy, "the device finished before the uploads returned"
    assert took < BUSY_S / 6, f"the uploads waited {took * 1000:.0f} ms for the device"
    assert torch.equal(on_device[0].cpu(), torch.arange(windows * 144).reshape(windows, 144))
    assert bool((on_device[1] == 1.0).all())


def test_a_voice_load_does_not_wait_for_the_calls_queued_before_it() -> None:
    from engines.runtimes.torch_cuda.weights import WeightLayout

    host = {"a": torch.randn(512, 192), "b": torch.randn(4096)}
    layout = WeightLayout.of(host)
    device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.synchronize()
    _keep_the_device_busy(BUSY_S)
    started = time.perf_counter()
    flat = layout.pack(host, device)
    took = time.perf_counter() - started
    torch.cuda.synchronize()
    assert took < BUSY_S / 6, f"the load waited {took * 1000:.0f} ms for the device"
    views = layout.views(flat)
    assert all(torch.equal(views[name].cpu(), tensor) for name, tensor in host.items())
