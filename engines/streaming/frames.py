"""Where the stream model keeps every live sentence's frames, and how windows are cut from them.

The encoder's prior frames and the flow's latent frames of all live sentences live in two
frame stores, arrays of [capacity, 192] frames, on the device that runs the stages: host
memory for onnxruntime, GPU memory for the GPU runtimes (`engines/runtimes/device_frames.py`),
so latents never travel to the host between the flow and the vocoder. The stores are paged:
a sentence holds whole pages of `PAGE_FRAMES` frames, found through its page table, and
page 0 is never handed out and stays zero, so a position outside a sentence reads as the zero
padding a one-shot decode puts at its edges.

A batch of windows is then one gather (`store[index]`, index [batch, width]) and one
scatter, whatever the batch size, instead of a copy per window; `FramePool.window_index`
builds the index on the host with a few vectorised NumPy operations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

PAGE_FRAMES = 32
LATENT_CHANNELS = 192
# GPU backends flow sentences up to this long in whole-sentence calls right after the encoder,
# padded up to the first of these sizes (one CUDA graph per size and batch bucket); longer ones
# (slow speech) take the windowed flow of the stream model. 2,048 frames = 23.8 s of audio.
SENTENCE_FLOW_FRAMES = (256, 512, 1024, 2048)


def sentence_flow_groups(frames: np.ndarray) -> list[tuple[int, np.ndarray]] | None:
    """(size, rows) of the whole-sentence flow calls for sentences of `frames` frames: one
    call per size of SENTENCE_FLOW_FRAMES that a sentence needs (one call of the longest's
    size for all of them padded short sentences up to the long one's cost); None when a
    sentence is longer than the largest size."""
    sizes = np.searchsorted(np.asarray(SENTENCE_FLOW_FRAMES), frames)
    if len(frames) == 0 or int(sizes.max()) >= len(SENTENCE_FLOW_FRAMES):
        return None
    return [
        (SENTENCE_FLOW_FRAMES[int(size)], np.flatnonzero(sizes == size))
        for size in np.unique(sizes)
    ]


class FramePool:
    """Hands out pages of frames and builds gather indices into the frame stores."""

    def __init__(self, initial_pages: int = 256) -> None:
        self.pages = max(2, initial_pages)
        self._free = list(range(self.pages - 1, 0, -1))  # page 0: the zero page

    @property
    def capacity_frames(self) -> int:
        return self.pages * PAGE_FRAMES

    def free_pages(self) -> int:
        return len(self._free)

    def allocate(self, frames: int) -> np.ndarray:
        """Page table for a sentence of `frames` frames (grows the pool when it must)."""
        needed = max(1, -(-frames // PAGE_FRAMES))
        while len(self._free) < needed:
            grown = self.pages * 2
            self._free[:0] = range(grown - 1, self.pages - 1, -1)
            self.pages = grown
        table = np.array(self._free[-needed:][::-1], dtype=np.int64)
        del self._free[-needed:]
        return table

    def release(self, table: np.ndarray) -> None:
        self._free.extend(int(page) for page in table)

    @staticmethod
    def window_index(
        tables: Sequence[np.ndarray], starts: np.ndarray, limits: np.ndarray, width: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Store rows of positions ``starts[b] + [0, width)`` of each sentence ``b``.

        Positions below 0 or at or above ``limits[b]`` are padding: they index the zero page
        and are False in the returned mask. Returns (index int64 [B, width], valid bool [B, width]).
        """
        positions = starts[:, None] + np.arange(width, dtype=np.int64)[None, :]
        valid = (positions >= 0) & (positions < limits[:, None])
        lengths = np.fromiter((len(t) for t in tables), dtype=np.int64, count=len(tables))
        offsets = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        flat = np.concatenate(tables)
        clipped = np.clip(positions, 0, None)
        slots = np.minimum(offsets[:, None] + clipped // PAGE_FRAMES, len(flat) - 1)
        index = flat[slots] * PAGE_FRAMES + clipped % PAGE_FRAMES
        return np.where(valid, index, 0), valid


@dataclass(frozen=True)
class BackendFeatures:
    """What a stream backend offers beyond the calls every one has (`StreamBackend`): the
    scheduler asks these, never the backend's attributes.

    - `fixed_call_costs`: a call costs about as much for one window as for sixteen (a GPU):
      the cost model learns a fixed part per call.
    - `batch_buckets`: the batch sizes (ascending) calls are padded up to (CUDA graphs); the
      planner fills the padding rows with windows not due yet.
    - `async_calls`: ``vocode_async`` and ``timer`` (`DeviceCalls`): the scheduler plans the
      next step while the device runs this one.
    - `encodes_beside`: ``encode_launch``: encoder calls run beside the windows, up to
      `encoder_calls_in_flight` at once (one by default: an encoder call's cost is mostly
      fixed, so the sentences that arrive while one runs wait for the next and share it);
      `encoder_queued`: on the windows' own stream, so a call with windows behind it is
      waited for without leaving the device idle; `encoder_streams`: a step's queued calls
      spread over that many CUDA streams, the windows' own included, side by side.
    - `launches_encoder`: ``encode_launch`` on the windows' stream: a step's several encoder
      calls (one per voice, or per length) are all launched before the host waits for the
      first one's frame counts, so the device is not left idle between them.
    - `sentence_flow`: ``flow_sentences``: the flow over whole sentences after the encoder.
    - `prepares_shapes`: ``warmup`` and ``calibrate``: every call shape is prepared (CUDA
      graphs captured) before the first listener, and the cost model seeded.
    - `groups_voices`: an encoder, flow or vocoder call may carry rows of several voices
      (its `voice` a sequence, a voice a row), each row run with its own voice's weights:
      in one grouped call where the stage has lanes (engines/runtimes/torch_cuda/weights.py),
      else in a call a voice. Where it is False a call has one voice: onnxruntime's
      sessions hold their weights as constants of the graph, so a voice is a session and
      one call runs one session.
    """

    fixed_call_costs: bool = False
    batch_buckets: tuple[int, ...] = ()
    async_calls: bool = False
    encodes_beside: bool = False
    encoder_queued: bool = False
    encoder_calls_in_flight: int = 1
    encoder_streams: int = 1
    launches_encoder: bool = False
    sentence_flow: bool = False
    prepares_shapes: bool = False
    groups_voices: bool = False


class StreamBackend(Protocol):
    """The stages plus the frame stores, on one device (host or GPU).

    Arrays named ``prior``, ``latent`` and ``audio`` are the backend's own (NumPy arrays or
    device tensors); everything the scheduler reads back is NumPy. What a backend offers
    beyond these calls it declares in `features` (and then has the `DeviceCalls` it names);
    engines/runtimes/device_frames.py is the one that offers them.
    """

    pool: FramePool
    features: BackendFeatures

    def encode(
        self,
        ids: np.ndarray,
        lengths: np.ndarray,
        scales: np.ndarray,
        speakers: np.ndarray,
        voice: Any = None,
    ) -> tuple[Any, np.ndarray]:
        """Prior [B, 192, T] and the frame count of each row, with `voice`'s weights (every
        call takes them: `VoiceSlot.weights`, None for the runtime's own voice)."""
        ...

    def store_prior(self, prior: Any, tables: Sequence[np.ndarray], frames: np.ndarray) -> None:
        """Write rows of an encoder batch into their sentences' pages."""
        ...

    def flow(
        self,
        tables: Sequence[np.ndarray],
        starts: np.ndarray,
        limits: np.ndarray,
        width: int,
        context: int,
        ends: np.ndarray,
        speakers: np.ndarray,
        voice: Any = None,
    ) -> None:
        """Run the flow on windows ``[starts, starts + width)`` of the priors (padding past
        ``limits``) and store latent frames ``[starts + context, ends)`` of each row."""
        ...

    def vocode(
        self,
        tables: Sequence[np.ndarray],
        starts: np.ndarray,
        limits: np.ndarray,
        width: int,
        speakers: np.ndarray,
        cut: tuple[int, int],
        voice: Any = None,
    ) -> np.ndarray:
        """Decode latent windows and return int16 PCM samples ``[cut[0], cut[1])`` of each row
        as one host array [B, cut[1] - cut[0]]."""
        ...

    def sync(self) -> None:
        """Wait for queued device work (so that its time can be measured)."""
        ...


class DeviceCalls(Protocol):
    """The calls a backend has where its `features` say so (engines/runtimes/device_frames.py)."""

    def encode_launch(self, ids, lengths, scales, speakers, voice=None) -> Any: ...

    def timer(self) -> Any: ...

    def vocode_async(self, tables, starts, limits, width, speakers, cut, voice=None) -> Any: ...

    def flow_sentences(self, prior, tables, frames, speakers, voice=None) -> bool: ...

    def warmup(
        self,
        flow_frames: Sequence[int],
        vocoder_frames: Sequence[int],
        windows: int,
        sentences: int,
        phonemes: Sequence[int],
        sentence_frames: Sequence[int] = ...,
    ) -> int: ...

    def calibrate(
        self, vocoder_frames: int, flow_frames: int, phonemes: int, windows: int, sentences: int
    ) -> list[tuple[str, float, int, int]]: ...


def to_pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


class HostBackend:
    """A NumPy `StageRuntime` (onnxruntime on the CPU) with its frame stores in host memory.

    A voice's weights are a `StageRuntime` of its own (its onnxruntime sessions): every call
    runs on the one it is given, or on `runtime` (the first voice's)."""

    def __init__(self, runtime: Any, initial_pages: int = 256) -> None:
        self.runtime = runtime
        self.features = BackendFeatures()
        self.pool = FramePool(initial_pages)
        self._prior = np.zeros((self.pool.capacity_frames, LATENT_CHANNELS), np.float32)
        self._latent = np.zeros_like(self._prior)

    def _fit(self) -> None:
        if self._prior.shape[0] < self.pool.capacity_frames:
            grown = self.pool.capacity_frames - self._prior.shape[0]
            pad = np.zeros((grown, LATENT_CHANNELS), np.float32)
            self._prior = np.concatenate([self._prior, pad])
            self._latent = np.concatenate([self._latent, pad])

    def encode(self, ids, lengths, scales, speakers, voice=None):
        prior, mask = (voice or self.runtime).encode(ids, lengths, scales, speakers)
        return prior, mask[:, 0, :].sum(axis=1).astype(np.int64)

    def store_prior(self, prior, tables, frames):
        self._fit()
        index, valid = FramePool.window_index(
            tables, np.zeros(len(tables), np.int64), frames, prior.shape[-1]
        )
        self._prior[index[valid]] = prior.transpose(0, 2, 1)[valid]

    def flow(self, tables, starts, limits, width, context, ends, speakers, voice=None):
        index, valid = FramePool.window_index(tables, starts, limits, width)
        prior = np.ascontiguousarray(self._prior[index].transpose(0, 2, 1))
        mask = valid[:, None, :].astype(np.float32)
        latent = (voice or self.runtime).flow(prior, mask, speakers)
        keep = valid & (np.arange(width)[None, :] >= context)
        keep &= (starts[:, None] + np.arange(width)[None, :]) < ends[:, None]
        self._latent[index[keep]] = latent.transpose(0, 2, 1)[keep]

    def vocode(self, tables, starts, limits, width, speakers, cut, voice=None):
        index, _ = FramePool.window_index(tables, starts, limits, width)
        latent = np.ascontiguousarray(self._latent[index].transpose(0, 2, 1))
        audio = (voice or self.runtime).vocode(latent, speakers)
        return to_pcm16(audio[:, cut[0] : cut[1]])

    def sync(self) -> None:
        return None


def stream_backend(runtime: Any) -> StreamBackend:
    """The runtime's own backend (GPU runtimes keep frames on the device), else host memory."""
    factory = getattr(runtime, "stream_backend", None)
    return factory() if factory is not None else HostBackend(runtime)
