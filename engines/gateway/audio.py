"""Audio out: a streaming resampler (soxr) to the listener's rate, and the encoders (PyAV).

The voices speak at their own rate (22,050 Hz for Piper's medium voices); clients expect
24 kHz (OpenAI's rate for every format; Pipecat and LiveKit assume it for `pcm`). One
`soxr.ResampleStream` per response carries its filter state from chunk to chunk, so the
chunk edges leave no clicks, as resampling chunk by chunk would.

A streaming resampler holds back the tail of each chunk until the next one comes (its
filter's delay), which thins the listener's buffer by as much. soxr's VHQ holds back about
16 ms of audio at the voice's chunk sizes (4,096 samples) and is flat to 10 kHz; HQ holds
back 37 ms, LQ 1 ms but loses 3.5 dB at 9 kHz and 22 dB at 10 kHz (measured with
22,050 → 24,000 Hz, python-soxr 1.1).

Every container and codec is FFmpeg's, in process through PyAV, writing to a sink that is
emptied after each chunk: WAV with unknown-length sizes (0xFFFFFFFF, as a stream has),
MP3 (LAME), Ogg Opus with 20 ms pages (the muxer would hold a page for a second otherwise),
FLAC and AAC in ADTS frames. `pcm` is the samples themselves: s16le, mono, no header.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

RESAMPLER_QUALITY = "VHQ"


class StreamResampler:
    """int16 mono in at the source's rate, int16 mono out at `rate`, without seams."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._source_rate: int | None = None
        self._stream: Any = None

    def push(self, samples: np.ndarray, source_rate: int) -> np.ndarray:
        if self._source_rate is None:
            self._source_rate = source_rate
            if source_rate != self.rate:
                import soxr

                self._stream = soxr.ResampleStream(
                    source_rate, self.rate, 1, dtype="int16", quality=RESAMPLER_QUALITY
                )
        elif source_rate != self._source_rate:
            raise ValueError(
                f"the voice changed its sample rate mid-stream ({self._source_rate} → "
                f"{source_rate} Hz)"
            )
        if self._stream is None:
            return samples.astype(np.int16, copy=False)
        return np.asarray(self._stream.resample_chunk(samples.astype(np.int16, copy=False)))

    def finish(self) -> np.ndarray:
        """The samples the filter still holds (call once, at the end)."""
        if self._stream is None:
            return np.zeros(0, dtype=np.int16)
        return np.asarray(self._stream.resample_chunk(np.zeros(0, dtype=np.int16), last=True))


class Encoder(Protocol):
    content_type: str

    def encode(self, samples: np.ndarray) -> bytes: ...

    def finish(self) -> bytes: ...


class PcmEncoder:
    content_type = "audio/pcm"

    def encode(self, samples: np.ndarray) -> bytes:
        return samples.astype("<i2", copy=False).tobytes()

    def finish(self) -> bytes:
        return b""


class _Sink:
    """A write-only file for PyAV: what the muxer wrote since the last `take`."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        self._parts.append(chunk)
        return len(chunk)

    def take(self) -> bytes:
        data = b"".join(self._parts)
        self._parts.clear()
        return data


@dataclass(frozen=True)
class Container:
    format: str
    codec: str
    content_type: str
    options: tuple[tuple[str, str], ...] = ()


CONTAINERS = {
    # bitexact: a plain 44-byte header, no encoder tag (some clients skip 44 bytes).
    "wav": Container("wav", "pcm_s16le", "audio/wav", (("fflags", "+bitexact"),)),
    "mp3": Container("mp3", "libmp3lame", "audio/mpeg"),
    # page_duration is in microseconds: a page per 20 ms Opus frame.
    "opus": Container("ogg", "libopus", "audio/opus", (("page_duration", "20000"),)),
    "flac": Container("flac", "flac", "audio/flac"),
    "aac": Container("adts", "aac", "audio/aac"),
}


class AvEncoder:
    """One FFmpeg muxer and encoder, fed int16 mono at `rate`, emptied after every chunk."""

    def __init__(self, container: Container, rate: int) -> None:
        import av

        self.content_type = container.content_type
        self._rate = rate
        self._sink = _Sink()
        self._output: Any = av.open(
            self._sink,
            mode="w",
            format=container.format,
            options={"flush_packets": "1", **dict(container.options)},
            buffer_size=4096,
        )
        self._stream: Any = self._output.add_stream(container.codec, rate=rate, layout="mono")
        self._pts = 0
        self._closed = False

    def encode(self, samples: np.ndarray) -> bytes:
        import av

        if samples.size:
            frame = av.AudioFrame.from_ndarray(
                samples.astype(np.int16, copy=False).reshape(1, -1), format="s16", layout="mono"
            )
            frame.sample_rate = self._rate
            frame.pts = self._pts
            self._pts += samples.size
            for packet in self._stream.encode(frame):
                self._output.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        if not self._closed:
            self._closed = True
            for packet in self._stream.encode(None):
                self._output.mux(packet)
            self._output.close()
        return self._sink.take()

    def close(self) -> None:
        """Let go of the encoder without finishing the file (a stream cut short)."""
        if not self._closed:
            self._closed = True
            try:
                self._output.close()
            except Exception:  # an unfinished file may fail to finish: it is dropped anyway
                pass


def new_encoder(response_format: str, rate: int) -> PcmEncoder | AvEncoder:
    if response_format == "pcm":
        return PcmEncoder()
    container = CONTAINERS.get(response_format)
    if container is None:
        raise ValueError(f"unknown response format {response_format!r}")
    return AvEncoder(container, rate)


def content_type(response_format: str) -> str:
    if response_format == "pcm":
        return PcmEncoder.content_type
    return CONTAINERS[response_format].content_type
