"""What one stream looked like to a listener: first audio, gaps between chunks, underruns.

A player starts at the first chunk and plays the audio received so far without pause. A chunk
that arrives after everything received before it has finished playing is an underrun: the
listener hears silence until it arrives, then playback resumes from that chunk (as a real
player does after a stall), so one late chunk counts once, not for every chunk after it.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chunk:
    """One audio response, stamped on arrival (seconds on a monotonic clock)."""

    arrival_s: float
    samples: int


@dataclass
class StreamRecord:
    """The raw timeline of one request as the client saw it."""

    text: str
    sent_s: float
    sample_rate: int = 0
    chunks: list[Chunk] = field(default_factory=list)
    ended_s: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class StreamStats:
    completed: bool
    first_audio_s: float | None
    gaps_s: tuple[float, ...]
    underruns: int
    stall_s: float
    audio_s: float
    duration_s: float | None


@dataclass(frozen=True)
class LateChunk:
    """A chunk that arrived after the audio before it had finished playing."""

    index: int  # among the chunks with audio; the first is 0
    stall_s: float  # how long the listener heard silence before it
    after_first_s: float  # its arrival, seconds after the first chunk's


def late_chunks(record: StreamRecord, tolerance_s: float = 0.0) -> list[LateChunk]:
    """The stream's underruns, chunk by chunk (see the module's docstring)."""
    chunks = [chunk for chunk in record.chunks if chunk.samples > 0]
    if not chunks or record.sample_rate <= 0:
        return []
    rate = float(record.sample_rate)
    first = chunks[0]
    playing_until = first.arrival_s + first.samples / rate
    late = []
    for index, chunk in enumerate(chunks[1:], start=1):
        if chunk.arrival_s > playing_until + tolerance_s:
            late.append(
                LateChunk(index, chunk.arrival_s - playing_until, chunk.arrival_s - first.arrival_s)
            )
            playing_until = chunk.arrival_s
        playing_until += chunk.samples / rate
    return late


def analyse_stream(record: StreamRecord, tolerance_s: float = 0.0) -> StreamStats:
    """Reduce a timeline to what a listener notices.

    `tolerance_s` forgives lateness up to that much (a device buffer); the default 0 counts
    every chunk that arrives after the audio before it has run out.
    """
    chunks = [chunk for chunk in record.chunks if chunk.samples > 0]
    completed = record.error is None and record.ended_s is not None and bool(chunks)
    if not chunks or record.sample_rate <= 0:
        return StreamStats(completed, None, (), 0, 0.0, 0.0, None)
    rate = float(record.sample_rate)
    first = chunks[0]
    gaps = [later.arrival_s - earlier.arrival_s for earlier, later in itertools.pairwise(chunks)]
    late = late_chunks(record, tolerance_s)
    audio_s = sum(chunk.samples for chunk in chunks) / rate
    end = record.ended_s if record.ended_s is not None else chunks[-1].arrival_s
    return StreamStats(
        completed=completed,
        first_audio_s=first.arrival_s - record.sent_s,
        gaps_s=tuple(gaps),
        underruns=len(late),
        stall_s=sum(chunk.stall_s for chunk in late),
        audio_s=audio_s,
        duration_s=end - record.sent_s,
    )
