"""Property tests: whatever a client sends, decoding ends in speech parameters within the
model's ranges or a RequestError that says what was wrong; no other exception escapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from engines.contract import names
from engines.contract.plan import ServingPlan
from engines.pod.triton_model.requests import (
    KNOWN_INPUTS,
    LENGTH_SCALE_RANGE,
    NOISE_RANGE,
    RequestError,
    VoiceDefaults,
    decode_request,
)

# Casting huge numbers to float16/float32 makes inf, which is the point.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

PLAN = ServingPlan(name="joe", engine_dir="/engines/joe", max_text_bytes=200)
VOICES = st.builds(VoiceDefaults, num_speakers=st.integers(-2, 5))
FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def object_array(items: st.SearchStrategy[object]) -> st.SearchStrategy[np.ndarray]:
    def build(values: list[object]) -> np.ndarray:
        array = np.empty(len(values), dtype=np.object_)
        array[:] = values
        return array

    return st.lists(items, min_size=0, max_size=3).map(build)


# What Triton hands the model for a BYTES input (an object array of bytes), and much else.
TEXTS = st.one_of(
    object_array(st.binary(max_size=300)),
    object_array(st.text(max_size=120)),
    object_array(st.one_of(st.integers(), st.floats(), st.none(), st.binary(max_size=8))),
    hnp.arrays(
        hnp.scalar_dtypes() | hnp.byte_string_dtypes() | hnp.unicode_string_dtypes(),
        hnp.array_shapes(min_dims=0, max_dims=2, max_side=3),
    ),
    st.binary(max_size=10),
    st.none(),
)
NUMBERS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(min_value=-3, max_value=12),
    st.integers(min_value=-(2**70), max_value=2**70),
)
SCALARS = st.one_of(
    st.none(),
    st.tuples(NUMBERS, st.sampled_from([np.float16, np.float32, np.float64])).map(
        lambda pair: np.array([pair[0]]).astype(pair[1])
    ),
    st.integers(-(2**31), 2**31 - 1).map(lambda v: np.array([v], dtype=np.int32)),
    st.integers(0, 2**64 - 1).map(lambda v: np.array([v], dtype=np.uint64)),
    hnp.arrays(hnp.scalar_dtypes(), hnp.array_shapes(min_dims=0, max_dims=2, max_side=3)),
    object_array(st.binary(max_size=8)),
    st.text(max_size=5),
)
SCALAR_INPUTS = (names.SPEAKER_ID, names.LENGTH_SCALE, names.NOISE_SCALE, names.NOISE_W)
REQUESTS = st.fixed_dictionaries(
    {names.TEXT: TEXTS},
    optional={name: SCALARS for name in SCALAR_INPUTS},
)
EXTRA_NAMES = st.text(min_size=1, max_size=12).filter(lambda name: name not in KNOWN_INPUTS)


def check(inputs: dict[str, object], voice: VoiceDefaults) -> None:
    try:
        text, params = decode_request(inputs, PLAN, voice)
    except RequestError as error:
        assert error.status == "INVALID_ARGUMENT"
        message = str(error)
        assert message and any(name in message for name in (*KNOWN_INPUTS, "input")), message
        return
    assert text.strip() and len(text.encode("utf-8")) <= PLAN.max_text_bytes
    assert 0 <= params.speaker_id < max(1, voice.num_speakers)
    for value, (low, high) in (
        (params.length_scale, LENGTH_SCALE_RANGE),
        (params.noise_scale, NOISE_RANGE),
        (params.noise_w, NOISE_RANGE),
    ):
        assert math.isfinite(value) and low <= value <= high


@FUZZ
@given(REQUESTS, VOICES)
def test_any_request_ends_in_parameters_or_a_clear_refusal(
    inputs: dict[str, object], voice: VoiceDefaults
) -> None:
    check(inputs, voice)


@FUZZ
@given(REQUESTS, st.dictionaries(EXTRA_NAMES, SCALARS, min_size=1, max_size=2), VOICES)
def test_extra_inputs_are_refused_by_name(
    inputs: dict[str, object], extra: dict[str, object], voice: VoiceDefaults
) -> None:
    try:
        decode_request({**inputs, **extra}, PLAN, voice)
    except RequestError as error:
        assert "unknown input" in str(error) and sorted(extra)[0] in str(error)
    else:
        raise AssertionError("an unknown input was accepted")


@FUZZ
@given(st.dictionaries(st.sampled_from(SCALAR_INPUTS), SCALARS), VOICES)
def test_a_request_without_text_is_refused(inputs: dict[str, object], voice: VoiceDefaults) -> None:
    try:
        decode_request(inputs, PLAN, voice)
    except RequestError as error:
        assert "TEXT is missing" in str(error)
    else:
        raise AssertionError("a request without TEXT was accepted")


@FUZZ
@given(st.text(min_size=1, max_size=60).filter(str.strip), NUMBERS, NUMBERS, NUMBERS)
def test_valid_text_with_any_scales(text: str, length: float, noise: float, noise_w: float) -> None:
    inputs = {
        names.TEXT: np.array([text.encode("utf-8", "surrogatepass")], dtype=np.object_),
        names.LENGTH_SCALE: np.array([length], dtype=np.float32),
        names.NOISE_SCALE: np.array([noise], dtype=np.float32),
        names.NOISE_W: np.array([noise_w], dtype=np.float32),
    }
    check(inputs, VoiceDefaults())
