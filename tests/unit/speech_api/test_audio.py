"""Audio out: a streaming resampler with no seams at chunk edges, and encoders whose first
bytes leave with the first chunk and whose output decodes back to the same length."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest
import soxr

from engines.gateway.audio import RESAMPLER_QUALITY, StreamResampler, new_encoder

SOURCE_RATE = 22050


def tone(seconds: float, rate: int = SOURCE_RATE) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)


def in_chunks(audio: np.ndarray, size: int = 1000) -> list[np.ndarray]:
    return [audio[i : i + size] for i in range(0, len(audio), size)]


def test_streaming_resampler_matches_one_shot_resampling() -> None:
    audio = tone(1.0)
    resampler = StreamResampler(24000)
    streamed = np.concatenate(
        [*(resampler.push(c, SOURCE_RATE) for c in in_chunks(audio)), resampler.finish()]
    )
    whole = soxr.resample(audio, SOURCE_RATE, 24000, quality=RESAMPLER_QUALITY)
    assert abs(len(streamed) - 24000) <= 1
    n = min(len(streamed), len(whole))
    assert np.max(np.abs(streamed[:n].astype(int) - whole[:n].astype(int))) <= 2


def test_chunk_by_chunk_resampling_would_leave_seams() -> None:
    """What the streaming resampler avoids: each chunk resampled alone starts its filter
    afresh, so the chunk edges differ from the one-shot result."""
    audio = tone(1.0)
    chunked = np.concatenate(
        [soxr.resample(c, SOURCE_RATE, 24000, quality=RESAMPLER_QUALITY) for c in in_chunks(audio)]
    )
    whole = soxr.resample(audio, SOURCE_RATE, 24000, quality=RESAMPLER_QUALITY)
    n = min(len(chunked), len(whole))
    assert np.max(np.abs(chunked[:n].astype(int) - whole[:n].astype(int))) > 100


def test_the_resampler_holds_back_little_audio_and_keeps_the_voices_band() -> None:
    """What is held back until the next chunk thins the listener's buffer: at the voice's
    first-window size, under 20 ms; and nothing of the voice's band below 10 kHz is lost."""
    resampler = StreamResampler(24000)
    chunk = tone(4096 / SOURCE_RATE)
    held_back = 4096 * 24000 / SOURCE_RATE - len(resampler.push(chunk, SOURCE_RATE))
    assert held_back / 24000 < 0.020
    t = np.arange(SOURCE_RATE) / SOURCE_RATE
    high = (np.sin(2 * np.pi * 10000 * t) * 8000).astype(np.int16)
    streamed = StreamResampler(24000)
    out = np.concatenate(
        [*(streamed.push(c, SOURCE_RATE) for c in in_chunks(high)), streamed.finish()]
    )
    gain = np.sqrt(np.mean(out[2000:-2000].astype(float) ** 2)) / np.sqrt(
        np.mean(high.astype(float) ** 2)
    )
    assert 20 * np.log10(gain) > -0.5


def test_a_rate_change_mid_stream_is_refused() -> None:
    resampler = StreamResampler(24000)
    resampler.push(tone(0.1), SOURCE_RATE)
    with pytest.raises(ValueError, match="sample rate"):
        resampler.push(tone(0.1, 16000), 16000)


def test_pcm_is_the_samples_themselves() -> None:
    samples = np.array([1, -2, 300], dtype=np.int16)
    assert new_encoder("pcm", 24000).encode(samples) == samples.astype("<i2").tobytes()


def encode(fmt: str, audio: np.ndarray) -> tuple[list[bytes], bytes]:
    encoder = new_encoder(fmt, 24000)
    parts = [encoder.encode(c) for c in in_chunks(audio, 2400)]
    return parts, b"".join(parts) + encoder.finish()


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus", "flac", "aac"])
def test_encoded_streams_decode_to_the_same_length(fmt: str) -> None:
    audio = tone(1.0, 24000)
    _, data = encode(fmt, audio)
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        rate = stream.codec_context.sample_rate
    assert samples / rate == pytest.approx(1.0, abs=0.08)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_first_bytes_leave_with_the_first_chunk(fmt: str) -> None:
    parts, _ = encode(fmt, tone(0.5, 24000))
    assert parts[0], f"{fmt}: nothing after the first 100 ms of audio"


def test_wav_says_its_length_is_unknown() -> None:
    parts, _ = encode("wav", tone(0.2, 24000))
    header = parts[0][:44]
    assert header[:4] == b"RIFF" and header[4:8] == b"\xff\xff\xff\xff"
    assert header[36:40] == b"data" and header[40:44] == b"\xff\xff\xff\xff"
    assert int.from_bytes(header[24:28], "little") == 24000


def test_opus_pages_are_short() -> None:
    parts, _ = encode("opus", tone(0.5, 24000))
    pages = sum(part.count(b"OggS") for part in parts)
    assert pages >= 10  # 20 ms pages: about 25 in 0.5 s, where the muxer's default gives 1
