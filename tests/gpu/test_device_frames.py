"""The GPU backend's frame stores (`DeviceBackend`), on the CPU with PyTorch and on a GPU where
there is one: a stored sentence reads back whole, a scatter writes the frames a window owns and
nothing else (the zero page included), and a vocoder call reads its windows with zero padding.

Run: ``pytest -q tests/gpu/test_device_frames.py`` (needs PyTorch; the CPU build is enough).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from engines.runtimes.device_frames import DeviceBackend  # noqa: E402
from engines.streaming.frames import LATENT_CHANNELS, PAGE_FRAMES, FramePool  # noqa: E402

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Doubling:
    """The device tensor API of a GPU runtime whose flow doubles its prior and whose vocoder
    returns each latent frame's first channel as one sample."""

    def __init__(self, device: str) -> None:
        self.device = torch.device(device)
        self.flow_dtype = self.vocoder_dtype = torch.float32

    def flow_tensor(self, prior: Any, mask: Any, speaker_ids: Any = None) -> Any:
        return prior * 2.0 * mask

    def vocode_tensor(self, latent: Any, speaker_ids: Any = None) -> Any:
        return latent[:, 0, :] / 1000.0


def _sentences(backend: DeviceBackend, rng: np.random.Generator, count: int) -> tuple:
    frames = rng.integers(1, 300, size=count)
    tables = [backend.pool.allocate(int(n)) for n in frames]
    return tables, frames


@pytest.mark.parametrize("device", DEVICES)
def test_a_stored_sentence_reads_back_whole_and_the_zero_page_stays_zero(device: str) -> None:
    rng = np.random.default_rng(4)
    backend = DeviceBackend(Doubling(device), initial_pages=8, async_calls=False)
    # Enough sentences that the pool (and with it the stores) grows past its first pages.
    tables, frames = _sentences(backend, rng, 12)
    width = int(frames.max()) + 5
    prior = torch.from_numpy(rng.standard_normal((12, LATENT_CHANNELS, width), dtype=np.float32))
    backend.store_prior(prior.to(device), tables, frames)
    assert backend.flow_sentences(prior.to(device), tables, frames, None)
    for row, (table, count) in enumerate(zip(tables, frames, strict=True)):
        index, _ = FramePool.window_index([table], np.zeros(1, np.int64), np.array([count]), count)
        where = torch.from_numpy(index[0]).to(device)
        stored_prior = backend._prior[where].cpu()
        assert torch.equal(stored_prior, prior[row, :, :count].T)
        assert torch.allclose(backend._latent[where].cpu(), 2.0 * prior[row, :, :count].T)
    assert not bool(backend._prior[:PAGE_FRAMES].any()) and not bool(
        backend._latent[:PAGE_FRAMES].any()
    )


@pytest.mark.parametrize("device", DEVICES)
def test_a_flow_window_writes_only_past_its_context_and_before_its_end(device: str) -> None:
    backend = DeviceBackend(Doubling(device), initial_pages=16, async_calls=False)
    table = backend.pool.allocate(100)
    prior = torch.arange(100, dtype=torch.float32).repeat(LATENT_CHANNELS, 1)[None] + 1.0
    backend.store_prior(prior.to(device), [table], np.array([100]))
    # A window of 40 frames from frame 30: 8 of context before its own frames, which end at 60.
    backend.flow([table], np.array([30]), np.array([70]), 40, 8, np.array([60]), None)
    index, _ = FramePool.window_index([table], np.zeros(1, np.int64), np.array([100]), 100)
    latent = backend._latent[torch.from_numpy(index[0]).to(device)][:, 0].cpu().numpy()
    expected = np.zeros(100, np.float32)
    expected[38:60] = 2.0 * (np.arange(38, 60) + 1.0)
    assert np.array_equal(latent, expected)


@pytest.mark.parametrize("device", DEVICES)
def test_a_vocoder_call_reads_its_windows_and_pads_with_zeros(device: str) -> None:
    backend = DeviceBackend(Doubling(device), initial_pages=16, async_calls=False)
    tables = [backend.pool.allocate(50), backend.pool.allocate(70)]
    frames = np.array([50, 70])
    prior = torch.arange(70, dtype=torch.float32).repeat(2, LATENT_CHANNELS, 1) + 1.0
    backend.store_prior(prior.to(device), tables, frames)
    assert backend.flow_sentences(prior.to(device), tables, frames, None)
    pcm = backend.vocode(tables, np.array([-4, 60]), frames, 16, None, (0, 16))
    # Latents are 2 (frame + 1); the vocoder gives latent / 1000 as int16 of the full scale.
    expected_first = np.r_[np.zeros(4), 2.0 * np.arange(1, 13)] / 1000.0
    expected_second = np.r_[2.0 * np.arange(61, 71), np.zeros(6)] / 1000.0
    for row, expected in enumerate([expected_first, expected_second]):
        assert np.abs(pcm[row] - expected * 32767.0).max() <= 1.0  # int16's rounding


class Unmasked(Doubling):
    """`Doubling` whose flow leaves its padding frames non-zero, as a VITS flow does (the prior
    past a sentence's end is noise)."""

    def __init__(self, device: str) -> None:
        super().__init__(device)
        self.masks: list[Any] = []

    def flow_tensor(self, prior: Any, mask: Any, speaker_ids: Any = None) -> Any:
        self.masks.append(mask.cpu())
        return prior * 2.0 + 7.0


@pytest.mark.parametrize("device", DEVICES)
def test_whole_sentence_calls_write_each_sentences_frames_and_their_padding_nowhere_read(
    device: str,
) -> None:
    rng = np.random.default_rng(7)
    backend = DeviceBackend(Unmasked(device), initial_pages=4, async_calls=False)
    first = backend.pool.allocate(40)  # a sentence already playing, beside the new ones
    backend.flow_sentences(torch.ones(1, LATENT_CHANNELS, 40, device=device), [first], [40], None)
    # Sizes of two whole-sentence calls (256 and 512 frames), and more pages than the pool
    # had: the stores grow while the spare page stays last.
    frames = np.array([300, 17, 250, 33, 420, 1])
    tables = [backend.pool.allocate(int(n)) for n in frames]
    prior = torch.from_numpy(
        rng.standard_normal((len(frames), LATENT_CHANNELS, 512), dtype=np.float32)
    )
    assert backend.flow_sentences(prior.to(device), tables, frames, None)
    masks = backend.runtime.masks[1:]
    assert [m.shape[-1] for m in masks] == [256, 512]
    assert [m.sum().item() for m in masks] == [17 + 250 + 33 + 1, 300 + 420]
    for row, (table, count) in enumerate(zip(tables, frames, strict=True)):
        index, _ = FramePool.window_index([table], np.zeros(1, np.int64), np.array([count]), count)
        stored = backend._latent[torch.from_numpy(index[0]).to(device)].cpu()
        assert torch.equal(stored, 2.0 * prior[row, :, :count].T + 7.0), f"sentence {row}"
    index, _ = FramePool.window_index([first], np.zeros(1, np.int64), np.array([40]), 40)
    assert torch.equal(
        backend._latent[torch.from_numpy(index[0]).to(device)].cpu(),
        torch.full((40, LATENT_CHANNELS), 9.0),
    )
    assert not bool(backend._latent[:PAGE_FRAMES].any()), "the zero page was written"
    assert not bool(backend._prior.any()), "whole sentences need no prior in the store"
