"""`DeviceBackend`: the stream model's frame stores in GPU memory (see engines/streaming/frames.py).

A GPU runtime (torch-cuda, tensorrt) gives the scheduler this backend instead of the host one:
prior and latent frames of every live sentence stay on the device from the encoder to the
vocoder, a batch of windows is cut with one gather kernel and stored with one scatter, and
the only copies per step are the gather indices up and the batch's int16 PCM down.

The runtime must offer the device tensor API of `TorchCudaStages`: ``device``, ``flow_dtype``,
``vocoder_dtype``, ``encode_tensor``, ``flow_tensor`` and ``vocode_tensor``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from engines.streaming.frames import (
    LATENT_CHANNELS,
    PAGE_FRAMES,
    SENTENCE_FLOW_FRAMES,
    BackendFeatures,
    FramePool,
    sentence_flow_groups,
)

# 4,096 pages of 32 frames: 131,072 frames (25 minutes of audio) before the stores first grow.
INITIAL_PAGES = 4096
# A thread that waits for a vocoder call's audio (the scheduler's delivery thread) sleeps until
# the call's end event is reached, rather than spinning on it in CUDA's driver (its default
# while a process has fewer contexts than processors) beside the thread that launches the calls.
BLOCKING_WAITS = True


def _voice(voice: Any) -> dict[str, Any]:
    """The runtime call's voice argument: none for the runtime's own voice, so that a runtime
    of one voice (TensorRT's) needs no such argument."""
    return {} if voice is None else {"voice": voice}


class PendingAudio:
    """A vocoder call's int16 PCM on its way to the host, and the call's GPU time.

    On a CUDA device the copy goes into pinned host memory without waiting; `result()` waits
    for it (releasing the GIL). Elsewhere the PCM is there already.
    """

    def __init__(
        self,
        host: torch.Tensor,
        seconds: float | None = None,
        events: tuple[Any, Any] | None = None,
    ) -> None:
        self._host = host
        self._seconds = seconds
        self._events = events

    def wait(self) -> None:
        if self._events is not None:
            self._events[1].synchronize()

    def result(self) -> tuple[np.ndarray, float]:
        """(PCM [windows, samples], seconds the call took on the device)."""
        if self._events is not None:
            start, end = self._events
            end.synchronize()
            self._seconds = start.elapsed_time(end) / 1000.0
            self._events = None
        return self._host.numpy(), float(self._seconds or 0.0)


class DeviceTiming:
    """The device time of the work queued between its start and `stop()`, read without
    waiting for it once `done()` (CUDA events); on the CPU, the wall time between the two."""

    def __init__(self, cuda: bool) -> None:
        self._events: tuple[Any, Any] | None = None
        self._started = time.perf_counter()
        self._seconds: float | None = None
        if cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            self._events = (start, torch.cuda.Event(enable_timing=True))

    def stop(self) -> DeviceTiming:
        if self._events is None:
            self._seconds = time.perf_counter() - self._started
        else:
            self._events[1].record()
        return self

    def done(self) -> bool:
        return self._events is None or bool(self._events[1].query())

    def seconds(self) -> float:
        if self._seconds is None:
            assert self._events is not None, "stop() first"
            start, end = self._events
            end.synchronize()
            self._seconds = start.elapsed_time(end) / 1000.0
        return self._seconds


class DeviceBackend:
    """Frame stores on the device and the device calls (`BackendFeatures`): a GPU call costs
    about the same for 1 window as for 16, and the scheduler plans with that."""

    def __init__(
        self, runtime: Any, initial_pages: int = INITIAL_PAGES, async_calls: bool | None = None
    ) -> None:
        self.runtime = runtime
        self.device = torch.device(runtime.device)
        # Vocoder calls return before their audio is on the host (`vocode_async`): the
        # scheduler plans its next step while the GPU decodes this one. On a CUDA device; the
        # scheduler keeps its synchronous path where this is False (the CPU, tests).
        if async_calls is None:
            async_calls = self.device.type == "cuda"
        # With asynchronous calls, a runtime that launches its encoder
        # (TorchCudaStages.encodes_beside: the plan's encoder_launch "beside", on a CUDA
        # stream of its own, or "queued", on the windows' stream) lets the scheduler go on
        # launching windows and take the sentences up once their frame counts are on the host
        # (`encode_launch`), with up to `encoder_calls_in_flight` calls at once ("queued" is
        # the plan's default, docs/gpu.md). The batch sizes the flow and vocoder calls are
        # padded up to (CUDA graphs): the scheduler fills the padding rows with windows not
        # due yet (planner.fill_buckets).
        beside = bool(async_calls and getattr(runtime, "encodes_beside", False))
        self.features = BackendFeatures(
            fixed_call_costs=True,
            batch_buckets=tuple(getattr(runtime, "padded_batch_buckets", ())),
            async_calls=async_calls,
            encodes_beside=beside,
            encoder_queued=beside and bool(getattr(runtime, "encoder_queued", False)),
            encoder_calls_in_flight=int(getattr(runtime, "encoder_calls_in_flight", 1)),
            encoder_streams=int(getattr(runtime, "encoder_streams", 1)) if beside else 1,
            launches_encoder=bool(async_calls and getattr(runtime, "launches_encoder", False)),
            sentence_flow=True,
            prepares_shapes=True,
            groups_voices=bool(getattr(runtime, "groups_voices", False)),
        )
        self.blocking_waits = BLOCKING_WAITS
        # Vocoder calls may run on further CUDA streams beside the windows' own (a runtime's
        # `vocoder_stream`, TorchCudaStages.vocoder_streams); every other call joins them
        # first (`_join`): a flow may write pages a vocoder call still reads. With one stream
        # (the default) neither is looked at again.
        spread = int(getattr(runtime, "vocoder_streams", 1)) > 1
        self._vocoder_stream = runtime.vocoder_stream if spread else None
        self._join_vocoder = runtime.join_vocoder_streams if spread else None
        # Encoder calls launched over further streams (TorchCudaStages.encoder_streams) run
        # as a group the windows' stream waits for before any other call (`_join`).
        grouped = int(getattr(runtime, "encoder_streams", 1)) > 1
        self._join_encoder = runtime.join_encoder_streams if grouped else None
        self.pool = FramePool(initial_pages)
        # The stores hold one page past the pool's (`_spare_page`): a whole-sentence flow call
        # writes its padding there, where nothing reads.
        frames = self.pool.capacity_frames + PAGE_FRAMES
        self._prior = torch.zeros(
            (frames, LATENT_CHANNELS), dtype=runtime.flow_dtype, device=self.device
        )
        self._latent = torch.zeros(
            (frames, LATENT_CHANNELS), dtype=runtime.vocoder_dtype, device=self.device
        )
        self._positions: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def _fit(self) -> None:
        """Grow the stores with the pool, the spare page staying last."""
        kept = self._prior.shape[0] - PAGE_FRAMES
        grown = self.pool.capacity_frames - kept
        if grown > 0:
            self._prior = self._grown(self._prior, kept, grown)
            self._latent = self._grown(self._latent, kept, grown)

    @staticmethod
    def _grown(store: torch.Tensor, kept: int, grown: int) -> torch.Tensor:
        return torch.cat([store[:kept], store.new_zeros(grown + PAGE_FRAMES, LATENT_CHANNELS)])

    def _join(self, encoder_calls: bool = True) -> None:
        if self._join_vocoder is not None:
            self._join_vocoder()
        if encoder_calls and self._join_encoder is not None:
            self._join_encoder()

    def _on_vocoder_stream(self, rows: int) -> Any:
        if self._vocoder_stream is None:
            return contextlib.nullcontext()
        return self._vocoder_stream(rows)

    @property
    def _spare_page(self) -> int:
        return self._prior.shape[0] // PAGE_FRAMES - 1

    def _upload(self, array: np.ndarray) -> torch.Tensor:
        """`array` on the device, queued without the host waiting: through pinned memory on a
        GPU (a copy from pageable memory may wait for the device's queue to drain into the
        driver's staging buffer); the caching host allocator reuses the pinned block once the
        copy is done."""
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type == "cuda":
            tensor = tensor.pin_memory()
        return tensor.to(self.device, non_blocking=True)

    def _sentence_positions(self, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(positions [0, size), each one's page of its sentence, its row in that page), on
        the device, made once a size."""
        cached = self._positions.get(size)
        if cached is None:
            positions = torch.arange(size, device=self.device)
            cached = (positions, positions // PAGE_FRAMES, positions % PAGE_FRAMES)
            self._positions[size] = cached
        return cached

    def _scatter(self, store: torch.Tensor, values: torch.Tensor, index, keep) -> None:
        """store[index[keep]] = values[b, :, t] for every (b, t) kept; values [B, 192, W]."""
        rows, columns = np.nonzero(keep)
        where = self._upload(np.stack([rows, columns, index[keep]]))
        store[where[2]] = values[where[0], :, where[1]].to(store.dtype)

    @staticmethod
    def _encoder_inputs(ids, lengths, scales) -> tuple[torch.Tensor, ...]:
        return (
            torch.from_numpy(np.ascontiguousarray(ids)),
            torch.from_numpy(np.ascontiguousarray(lengths)),
            torch.from_numpy(np.asarray(scales, dtype=np.float32)),
        )

    def encode(self, ids, lengths, scales, speakers, voice=None):
        self._join()
        prior, mask = self.runtime.encode_tensor(
            *self._encoder_inputs(ids, lengths, scales), speakers, **_voice(voice)
        )
        frames = mask[:, 0, :].sum(dim=1).to(torch.int64).cpu().numpy()
        return prior, frames

    def encode_launch(self, ids, lengths, scales, speakers, voice=None) -> Any:
        """`encode` without waiting (where `encodes_beside`): a call whose `done()` says its
        frame counts are on the host and whose `finish()` gives (prior, frames) as `encode`
        does, the prior queued behind the call (engines.runtimes.torch_cuda.stages.EncoderCall)."""
        self._join(encoder_calls=False)  # (a step's encoder calls run side by side)
        return self.runtime.encode_launch(
            *self._encoder_inputs(ids, lengths, scales), speakers, **_voice(voice)
        )

    def flow_sentences(
        self,
        prior: torch.Tensor,
        tables: Sequence[np.ndarray],
        frames: np.ndarray,
        speakers,
        voice: Any = None,
    ) -> bool:
        """The flow over whole sentences of an encoder batch, latents stored; False (nothing
        done) when the longest is beyond SENTENCE_FLOW_FRAMES. The prior is not stored: the
        windows need only the latents (`store_prior` is for the windowed flow).

        On a GPU a flow call of one sentence costs about the same for 2,048 frames as for 80
        (it is bound by its launches), so a few calls per encoder batch replace a few calls
        per window, and the latents are those of a one-shot decode. A batch is not padded to
        its longest sentence, though: a call's rows pad to a batch bucket and its frames to
        the size, so 20 sentences of 100 to 1,500 frames would be a 32 x 2,048-frame call.
        The sentences are flowed in one call per size they need (`sentence_flow_groups`).
        Frames past a sentence's end are masked, so a sentence's latents do not depend on
        its call's width.

        The host's part is one upload of the frame counts and page tables; the masks and
        the store's rows are worked out on the device. A call's padding frames go to the
        rest of their sentence's last page (never read: reads past a sentence's end take the
        zero page) or to the spare page past the pool's.
        """
        groups = sentence_flow_groups(frames)
        if groups is None:
            return False
        self._join()
        self._fit()
        order = np.concatenate([rows for _, rows in groups])
        pages = max(size for size, _ in groups) // PAGE_FRAMES
        table = np.full((len(frames), 2 + pages), self._spare_page, dtype=np.int64)
        table[:, 0] = frames
        table[:, 1] = order
        for row, sentence_pages in enumerate(tables):
            table[row, 2 : 2 + len(sentence_pages)] = sentence_pages
        laid = self._upload(table)
        speakers = np.asarray(speakers) if speakers is not None else None
        taken = 0
        for size, rows in groups:
            if len(rows) == len(frames):
                part, part_laid = prior, laid
            else:
                where = laid[taken : taken + len(rows), 1]
                part, part_laid = prior.index_select(0, where), laid.index_select(0, where)
            taken += len(rows)
            positions, page_of, in_page = self._sentence_positions(size)
            width = min(size, part.shape[-1])
            padded = torch.nn.functional.pad(part[..., :width], (0, size - width))
            mask = (positions[None, :] < part_laid[:, :1]).to(torch.float32)[:, None, :]
            part_voice = [voice[row] for row in rows] if isinstance(voice, list) else voice
            latent = self.runtime.flow_tensor(
                padded,
                mask,
                speakers[rows] if speakers is not None else None,
                **_voice(part_voice),
            )
            index = part_laid[:, 2:][:, page_of] * PAGE_FRAMES + in_page
            self._latent[index.reshape(-1)] = (
                latent.permute(0, 2, 1).reshape(-1, LATENT_CHANNELS).to(self._latent.dtype)
            )
        return True

    def store_prior(self, prior, tables: Sequence[np.ndarray], frames: np.ndarray) -> None:
        self._join()
        self._fit()
        index, valid = FramePool.window_index(
            tables, np.zeros(len(tables), np.int64), frames, prior.shape[-1]
        )
        self._scatter(self._prior, prior, index, valid)

    def flow(self, tables, starts, limits, width, context, ends, speakers, voice=None):
        self._join()
        index, valid = FramePool.window_index(tables, starts, limits, width)
        prior = self._prior[self._upload(index)].permute(0, 2, 1)
        mask = self._upload(valid[:, None, :].astype(np.float32))
        latent = self.runtime.flow_tensor(prior, mask, speakers, **_voice(voice))
        columns = np.arange(width)[None, :]
        keep = valid & (columns >= context) & (starts[:, None] + columns < ends[:, None])
        self._scatter(self._latent, latent, index, keep)

    def vocode(self, tables, starts, limits, width, speakers, cut, voice=None):
        self._join()
        index, _ = FramePool.window_index(tables, starts, limits, width)
        latent = self._latent[self._upload(index)].permute(0, 2, 1)
        audio = self.runtime.vocode_tensor(latent, speakers, **_voice(voice))[:, cut[0] : cut[1]]
        pcm = (audio.float().clamp(-1.0, 1.0) * 32767.0).to(torch.int16)
        return pcm.cpu().numpy()

    def vocode_async(
        self, tables, starts, limits, width, speakers, cut, voice=None
    ) -> PendingAudio:
        """`vocode` without waiting: the PCM comes back through the returned `PendingAudio`,
        after everything queued on the device before it."""
        if self.device.type != "cuda":
            started = time.perf_counter()
            pcm = self.vocode(tables, starts, limits, width, speakers, cut, voice)
            return PendingAudio(torch.from_numpy(pcm), time.perf_counter() - started)
        index, _ = FramePool.window_index(tables, starts, limits, width)
        if self._join_encoder is not None:
            self._join_encoder()  # (no window runs beside a group of encoder calls)
        # On a further stream (where the runtime has them) everything below runs there: the
        # memory it takes goes back to that stream's blocks, and its events time it alone.
        with self._on_vocoder_stream(len(starts)):
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            latent = self._latent[self._upload(index)].permute(0, 2, 1)
            audio = self.runtime.vocode_tensor(latent, speakers, **_voice(voice))
            pcm = (audio[:, cut[0] : cut[1]].float().clamp(-1.0, 1.0) * 32767.0).to(torch.int16)
            # The caching host allocator hands the pinned block back once the copy is done
            # and nothing refers to it (the numpy rows sent as responses keep it alive).
            host = torch.empty(pcm.shape, dtype=torch.int16, pin_memory=True)
            host.copy_(pcm, non_blocking=True)
            end = torch.cuda.Event(enable_timing=True, blocking=self.blocking_waits)
            end.record()
        return PendingAudio(host, events=(start, end))

    def timer(self) -> DeviceTiming:
        """Starts timing the device work queued from now on (work queued before is not
        counted, nor a group of encoder calls on further streams still running);
        `DeviceTiming.stop()` after the last call to count."""
        if self._join_encoder is not None:
            self._join_encoder()
        return DeviceTiming(self.device.type == "cuda")

    def sync(self) -> None:
        self._join()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def calibrate(
        self, vocoder_frames: int, flow_frames: int, phonemes: int, windows: int, sentences: int
    ) -> list[tuple[str, float, int, int]]:
        """Time each stage at batch 1 and at its largest batch (after `warmup`): (stage,
        seconds, rows, width) samples for the scheduler's cost model, so that its first steps
        after a start already know what a GPU call costs, rather than learning it from a
        burst of listeners."""
        import time

        runtime, device = self.runtime, self.device
        scales = torch.tensor([0.667, 1.0, 0.8])
        calls: list[tuple[str, int, int, Any]] = []
        for rows in sorted({1, windows}):
            latent = torch.zeros(rows, LATENT_CHANNELS, vocoder_frames, device=device)
            prior = torch.zeros(rows, LATENT_CHANNELS, flow_frames, device=device)
            mask = torch.ones(rows, 1, flow_frames, device=device)
            calls.append(("vocoder", rows, vocoder_frames, partial(runtime.vocode_tensor, latent)))
            calls.append(("flow", rows, flow_frames, partial(runtime.flow_tensor, prior, mask)))
        for rows in sorted({1, sentences}):
            ids = torch.full((rows, phonemes), 20, dtype=torch.int64)
            lengths = torch.full((rows,), phonemes, dtype=torch.int64)
            encode = partial(runtime.encode_tensor, ids, lengths, scales)
            calls.append(("encoder", rows, phonemes, encode))
        samples = []
        for stage, rows, width, call in calls:
            for attempt in range(2):  # the first may still allocate
                self.sync()
                started = time.perf_counter()
                call()
                self.sync()
                if attempt:
                    samples.append((stage, time.perf_counter() - started, rows, width))
        return samples

    def warmup(
        self,
        flow_frames: Sequence[int],
        vocoder_frames: Sequence[int],
        windows: int,
        sentences: int,
        phonemes: Sequence[int],
        sentence_frames: Sequence[int] = SENTENCE_FLOW_FRAMES,
    ) -> int:
        """Capture the runtime's graphs for these shapes now (if it captures any), and no
        others later: a shape left out runs eagerly (`stop_capturing`, where the runtime has
        it). `sentence_frames`: the whole-sentence flow sizes to capture."""
        warm = getattr(self.runtime, "warmup", None)
        if warm is None:
            return 0
        # The whole-sentence flow sizes take at most an encoder call's sentences a call.
        limits = dict.fromkeys(sentence_frames, sentences)
        limits.update(dict.fromkeys(flow_frames, windows))
        shapes = int(
            warm(
                flow_frames=limits,
                vocoder_frames=vocoder_frames,
                encoder_phonemes=phonemes,
                max_batch=windows,
                max_sentences=sentences,
            )
        )
        stop = getattr(self.runtime, "stop_capturing", None)
        if stop is not None:
            stop()
        return shapes
