"""Voices as weight sets: one stage's tensors packed into one flat buffer per voice.

All the voices of an architecture share one set of stage modules and one set of captured
CUDA graphs. The modules read their weights from a *bound* buffer; a voice is its own flat
copy of the same layout, and running a call for a voice first copies its buffer into the bound
one (`WeightBinding.bind`), on the stream that then runs the call, so the copy is ordered
with the calls before and after it. The graphs keep pointing at the bound buffer, whoever's
weights are in it.

A copy costs the voice's bytes at the device's copy rate: for the joe voice's vocoder
(26.6 MiB in FP16) about 20 us on an H100. A voice whose tensors do not match the bound
layout (names, shapes, strides, dtype) is refused with `ArchitectureMismatch`, before
anything of it is on the device.

*Lanes*: a binding may hold several bound buffers side by side (`lanes`, one row each; the
first is the one the modules read). A grouped call (engines/runtimes/torch_cuda/stages.py,
`GraphedStage.run_lanes`) runs up to that many voices' rows in one call, each lane's rows
against its own lane's weights (`lane_tensors`: every tensor with a leading lane axis). A
lane keeps the voice last bound to it, so the same voices in the same lanes step after step
cost no copy. Each lane past the first costs one voice's weights of that stage.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch

# Each tensor starts on a multiple of this many elements (128 bytes for FP16), as an
# allocation would: the kernels that read them keep their aligned loads.
ALIGN_ELEMENTS = 64


class ArchitectureMismatch(ValueError):
    """A voice's weights are not laid out as the architecture's modules expect."""


@dataclass(frozen=True)
class Slot:
    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    @property
    def extent(self) -> int:
        """Elements the tensor spans in its buffer (its strides may skip none or some)."""
        if any(size == 0 for size in self.shape):
            return 0
        return 1 + sum(
            (size - 1) * step for size, step in zip(self.shape, self.stride, strict=True)
        )


@dataclass(frozen=True)
class WeightLayout:
    """Where each named tensor of a stage lives in its flat buffer."""

    dtype: torch.dtype
    slots: tuple[Slot, ...]
    numel: int

    @classmethod
    def of(cls, tensors: Mapping[str, torch.Tensor]) -> WeightLayout:
        if not tensors:
            raise ValueError("a weight layout needs at least one tensor")
        dtypes = {tensor.dtype for tensor in tensors.values()}
        if len(dtypes) != 1:
            raise ValueError(f"a stage's weights share one dtype, got {sorted(map(str, dtypes))}")
        slots, offset = [], 0
        for name in sorted(tensors):
            tensor = tensors[name]
            slot = Slot(name, tuple(tensor.shape), tuple(tensor.stride()), offset)
            slots.append(slot)
            offset += -(-slot.extent // ALIGN_ELEMENTS) * ALIGN_ELEMENTS
        return cls(dtypes.pop(), tuple(slots), offset)

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def check(self, other: WeightLayout, stage: str) -> None:
        """ArchitectureMismatch naming the first difference between the architecture's layout
        (self) and a voice's (`other`)."""
        if other.dtype != self.dtype:
            raise ArchitectureMismatch(
                f"{stage}: the voice's weights are {other.dtype}, the architecture's {self.dtype}"
            )
        mine = {slot.name: slot for slot in self.slots}
        theirs = {slot.name: slot for slot in other.slots}
        missing, extra = sorted(set(mine) - set(theirs)), sorted(set(theirs) - set(mine))
        if missing or extra:
            parts = []
            if missing:
                parts.append(f"lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
            if extra:
                parts.append(f"has {', '.join(extra[:3])}{' ...' if len(extra) > 3 else ''}")
            raise ArchitectureMismatch(
                f"{stage}: the voice {' and '.join(parts)} where the architecture does not"
            )
        for name, slot in mine.items():
            if theirs[name].shape != slot.shape:
                raise ArchitectureMismatch(
                    f"{stage}: {name} is {list(theirs[name].shape)} in the voice and "
                    f"{list(slot.shape)} in the architecture"
                )

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            slot.name: flat.as_strided(slot.shape, slot.stride, flat.storage_offset() + slot.offset)
            for slot in self.slots
        }

    def lane_views(self, lanes: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each tensor of `lanes` ([lanes, numel], one buffer a row) with a leading lane axis."""
        width = lanes.stride(0)
        return {
            slot.name: lanes.as_strided(
                (lanes.shape[0], *slot.shape),
                (width, *slot.stride),
                lanes.storage_offset() + slot.offset,
            )
            for slot in self.slots
        }

    def pack(self, tensors: Mapping[str, torch.Tensor], device: torch.device) -> torch.Tensor:
        """A new flat buffer on `device` holding `tensors` at this layout's places (a voice
        read on the host for a GPU goes there in one piece: `WeightBinding.upload`)."""
        flat = torch.zeros(self.numel, dtype=self.dtype, device=device)
        for name, view in self.views(flat).items():
            view.copy_(tensors[name])
        return flat


def _upload(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`host` (pinned) copied to `device` on a CUDA stream of its own, waited for here: a voice
    loaded under streams neither queues copies behind their calls nor holds their next calls
    behind its copies, as hundreds of copies a tensor at a time from pageable memory on the
    calls' stream did. (On an H200 its loads under 200 streams took at most 1.06 s where they
    took up to 1.58 s, but other voices' streams still underran during them:
    docs/gpu-runs.md.) The copy starts after the work queued on the current stream, which may
    still read the memory the new buffer reuses."""
    flat = torch.empty(host.shape, dtype=host.dtype, device=device)
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        flat.copy_(host, non_blocking=True)
    side.synchronize()
    return flat


class WeightBinding:
    """One stage's bound buffers: the tensors its modules (and graphs) read, lane 0's, and
    `lanes - 1` more for grouped calls (`lane_tensors`)."""

    def __init__(
        self,
        stage: str,
        tensors: Mapping[str, torch.Tensor],
        device: torch.device,
        lanes: int = 1,
    ):
        if lanes < 1:
            raise ValueError(f"a weight binding needs at least one lane, got {lanes}")
        self.stage = stage
        self.layout = WeightLayout.of(tensors)
        self.lanes = torch.zeros(lanes, self.layout.numel, dtype=self.layout.dtype, device=device)
        self.bound = self.lanes[0]
        self.bound.copy_(self.layout.pack(tensors, device))
        self.tensors = self.layout.views(self.bound)
        self.lane_tensors = self.layout.lane_views(self.lanes)
        self._bound_to: list[object] = [None] * lanes

    @property
    def lane_count(self) -> int:
        return self.lanes.shape[0]

    def upload(self, data: bytes) -> torch.Tensor:
        """A voice's own buffer for this stage from its bytes, laid out as this layout's
        (`WeightLayout.pack` on the host, in a reader process): one copy to pinned memory,
        then one to the device (`_upload`)."""
        layout = self.layout
        if len(data) != layout.nbytes:
            raise ArchitectureMismatch(
                f"{self.stage}: {len(data)} bytes of weights where the layout holds {layout.nbytes}"
            )
        device = self.bound.device
        pinned = device.type == "cuda"
        host = torch.empty(layout.numel, dtype=layout.dtype, pin_memory=pinned)
        with warnings.catch_warnings():  # (read only: torch warns of any buffer not writable)
            warnings.simplefilter("ignore", UserWarning)
            source = torch.frombuffer(data, dtype=torch.uint8)
        host.view(torch.uint8).copy_(source)
        return _upload(host, device) if pinned else host.to(device)

    def bind(self, owner: object, flat: torch.Tensor, lane: int = 0) -> None:
        """Make `flat` (a voice's buffer, `owner` its identity) what lane `lane` reads (lane 0:
        what the modules read), for the calls queued on the current stream from now on."""
        if owner is self._bound_to[lane]:
            return
        self.lanes[lane].copy_(flat, non_blocking=True)
        self._bound_to[lane] = owner

    def forget(self, owner: object) -> None:
        """`owner` is unloaded: its weights may still be bound, but no later bind may be
        skipped for an object that reuses its identity."""
        self._bound_to = [None if bound is owner else bound for bound in self._bound_to]
