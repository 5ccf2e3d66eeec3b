from __future__ import annotations

import numpy as np
import pytest

from engines.streaming.frames import PAGE_FRAMES, FramePool, HostBackend


def test_pages_are_handed_out_once_and_come_back() -> None:
    pool = FramePool(initial_pages=4)
    first = pool.allocate(2 * PAGE_FRAMES)  # 2 pages
    second = pool.allocate(1)  # 1 page
    assert 0 not in first and 0 not in second, "page 0 is the zero page"
    assert len(set(first) | set(second)) == 3
    third = pool.allocate(3 * PAGE_FRAMES + 1)  # 4 pages: the pool must grow
    assert pool.pages >= 8
    assert len(set(first) | set(second) | set(third)) == 7
    for table in (first, second, third):
        pool.release(table)
    assert pool.free_pages() == pool.pages - 1


@pytest.mark.parametrize("start", [-8, 0, 5, 40])
def test_window_index_reads_a_sentence_and_pads_outside_it(start: int) -> None:
    pool = FramePool(initial_pages=4)
    store = np.zeros((64 * PAGE_FRAMES, 2), dtype=np.float32)
    sentences = {}
    for frames in (70, 33, 100):  # interleaved allocations: tables are not contiguous
        table = pool.allocate(frames)
        values = np.random.default_rng(frames).standard_normal((frames, 2)).astype(np.float32)
        index, valid = FramePool.window_index([table], np.array([0]), np.array([frames]), frames)
        assert valid.all()
        store[index[0]] = values
        sentences[frames] = (table, values)
    tables = [table for table, _ in sentences.values()]
    frames = np.array(list(sentences))
    limits = np.minimum(frames, start + 30)
    index, valid = FramePool.window_index(tables, np.full(3, start), limits, 48)
    window = store[index]
    for row, (count, (_, values)) in enumerate(sentences.items()):
        for column in range(48):
            position = start + column
            inside = 0 <= position < min(count, start + 30)
            assert valid[row, column] == inside
            expected = values[position] if inside else np.zeros(2)
            np.testing.assert_array_equal(window[row, column], expected)


def test_host_backend_grows_its_stores_with_the_pool() -> None:
    class Encoder:
        def encode(self, ids, lengths, scales, speakers):
            frames = 400
            prior = np.arange(ids.shape[0] * 192 * frames, dtype=np.float32)
            return prior.reshape(ids.shape[0], 192, frames), np.ones((ids.shape[0], 1, frames))

    backend = HostBackend(Encoder(), initial_pages=2)
    prior, frames = backend.encode(np.zeros((3, 5), np.int64), None, None, None)
    tables = [backend.pool.allocate(int(count)) for count in frames]
    backend.store_prior(prior, tables, frames)
    assert backend.pool.capacity_frames >= 3 * 400
    index, _ = FramePool.window_index(tables, np.zeros(3, np.int64), frames, 400)
    np.testing.assert_array_equal(backend._prior[index].transpose(0, 2, 1), prior)
