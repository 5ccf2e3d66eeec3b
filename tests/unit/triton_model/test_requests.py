"""Request decoding without Triton: what each input turns into, and every refusal's words."""

from __future__ import annotations

import math

import numpy as np
import pytest

from engines.contract.plan import ServingPlan
from engines.pod.triton_model.requests import (
    RequestError,
    VoiceDefaults,
    decode_request,
    stream_limit_error,
)

PLAN = ServingPlan(name="joe", engine_dir="/engines/joe", max_text_bytes=64)
JOE = VoiceDefaults(num_speakers=1, length_scale=1.0, noise_scale=0.667, noise_w=0.8)


def text(value: str | bytes) -> np.ndarray:
    return np.array([value.encode() if isinstance(value, str) else value], dtype=np.object_)


def scalar(value: float, dtype: type = np.float32) -> np.ndarray:
    return np.array([value], dtype=dtype)


def refusal(inputs: dict[str, object], plan: ServingPlan = PLAN, voice: VoiceDefaults = JOE) -> str:
    with pytest.raises(RequestError) as caught:
        decode_request(inputs, plan, voice)
    assert caught.value.status == "INVALID_ARGUMENT"
    return str(caught.value)


def test_text_alone_speaks_with_the_voices_defaults() -> None:
    spoken, params = decode_request({"TEXT": text("Hello there.")}, PLAN, JOE)
    assert spoken == "Hello there."
    assert params.speaker_id == 0
    assert params.length_scale == pytest.approx(1.0)
    assert params.noise_scale == pytest.approx(0.667)
    assert params.noise_w == pytest.approx(0.8)


def test_the_plans_speaking_rate_is_a_speed() -> None:
    faster = ServingPlan(name="joe", engine_dir="/e", speaking_rate=1.25)
    _, params = decode_request({"TEXT": text("Quick.")}, faster, JOE)
    assert params.length_scale == pytest.approx(0.8)  # shorter durations: faster speech


def test_explicit_scales_and_speaker_win() -> None:
    two = VoiceDefaults(num_speakers=2)
    _, params = decode_request(
        {
            "TEXT": text("Hi."),
            "SPEAKER_ID": scalar(1, np.int32),
            "LENGTH_SCALE": scalar(2.0),
            "NOISE_SCALE": scalar(0.0),
            "NOISE_W": scalar(1.5),
        },
        PLAN,
        two,
    )
    assert (params.speaker_id, params.length_scale, params.noise_scale) == (1, 2.0, 0.0)
    assert params.noise_w == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ({}, "TEXT is missing"),
        ({"TEXT": text("")}, "TEXT is empty"),
        ({"TEXT": text(" \t\n")}, "TEXT is empty"),
        ({"TEXT": text(b"caf\xc3(")}, "not valid UTF-8: invalid continuation byte at byte 3"),
        ({"TEXT": text("a" * 65)}, "65 bytes; the limit is 64 bytes"),
        ({"TEXT": np.array([b"a", b"b"], dtype=np.object_)}, "exactly one string, got 2"),
        ({"TEXT": np.array([1.5])}, "must be a UTF-8 string (BYTES), got dtype float64"),
        ({"TEXT": "Hello"}, "TEXT must be a tensor, got str"),
        ({"TEXT": text("Hi."), "VOLUME": scalar(1.0)}, "unknown input(s) VOLUME"),
        ({"TEXT": text("Hi."), "SPEAKER_ID": scalar(1, np.int32)}, "1 speaker(s), ids 0..0"),
        ({"TEXT": text("Hi."), "SPEAKER_ID": scalar(-1, np.int32)}, "SPEAKER_ID -1 is out"),
        ({"TEXT": text("Hi."), "SPEAKER_ID": scalar(0.5)}, "SPEAKER_ID must be a whole number"),
        ({"TEXT": text("Hi."), "LENGTH_SCALE": scalar(math.nan)}, "must be a finite number"),
        ({"TEXT": text("Hi."), "LENGTH_SCALE": scalar(math.inf)}, "must be a finite number"),
        ({"TEXT": text("Hi."), "LENGTH_SCALE": scalar(1e30)}, "is outside 0.1..10"),
        ({"TEXT": text("Hi."), "NOISE_SCALE": scalar(-0.5)}, "NOISE_SCALE -0.5 is outside 0..2"),
        ({"TEXT": text("Hi."), "NOISE_W": text("loud")}, "NOISE_W must be a number, got dtype"),
        ({"TEXT": text("Hi."), "NOISE_W": np.zeros(3)}, "exactly one value, got 3"),
    ],
)
def test_bad_inputs_are_refused_with_what_was_wrong(inputs: dict[str, object], words: str) -> None:
    assert words in refusal(inputs)


def test_the_stream_limit_is_resource_exhausted_and_names_the_limit() -> None:
    error = stream_limit_error("joe", 8)
    assert error.status == "RESOURCE_EXHAUSTED"
    assert "limit of 8 streams" in str(error) and "max_streams_per_pod" in str(error)
