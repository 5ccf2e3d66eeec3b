"""The wire codec against the stream model's own request decoding and response encoding."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import service_pb2
from tritonclient.utils import deserialize_bytes_tensor, triton_to_np_dtype

from engines.client import wire
from engines.contract import names
from engines.contract.plan import ServingPlan
from engines.pod.triton_model.requests import RequestError, VoiceDefaults, decode_request

PLAN = ServingPlan(name="amy", engine_dir="")
TWO_SPEAKERS = VoiceDefaults(num_speakers=2)


def _as_server_reads(request: Any) -> dict[str, np.ndarray]:
    """The input tensors as Triton hands them to the stream model."""
    tensors = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        if tensor.datatype == "BYTES":
            array = deserialize_bytes_tensor(raw)
        else:
            array = np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype))
        tensors[tensor.name] = array.reshape(list(tensor.shape))
    return tensors


def test_what_a_client_asks_for_is_what_the_stream_model_reads() -> None:
    request = wire.speech_request(
        "amy", "Grüß dich.", speaker_id=1, length_scale=1.25, noise_scale=0.5, noise_w=0.25
    )
    assert request.model_name == "amy" and request.id
    assert request.parameters[wire.ENABLE_EMPTY_FINAL_RESPONSE].bool_param
    text, params = decode_request(_as_server_reads(request), PLAN, TWO_SPEAKERS)
    assert text == "Grüß dich."
    assert (params.speaker_id, params.length_scale) == (1, 1.25)
    assert (params.noise_scale, params.noise_w) == (0.5, 0.25)


def test_options_left_out_take_the_voices_defaults() -> None:
    request = wire.speech_request("amy", b"Hello.")
    assert [t.name for t in request.inputs] == [names.TEXT]
    text, params = decode_request(_as_server_reads(request), PLAN, TWO_SPEAKERS)
    assert text == "Hello." and params.speaker_id == 0
    assert params.length_scale == TWO_SPEAKERS.length_scale


def test_a_bad_input_built_with_the_codec_is_refused_by_name() -> None:
    request = wire.new_request("amy")
    wire.add_bytes_input(request, names.TEXT, [b"One.", b"Two."])
    with pytest.raises(RequestError, match="TEXT must hold exactly one string, got 2"):
        decode_request(_as_server_reads(request), PLAN, TWO_SPEAKERS)


def test_responses_give_audio_rate_and_the_final_flag() -> None:
    response = service_pb2.ModelInferResponse(model_name="amy")
    for name, datatype, _ in names.OUTPUTS:
        output = response.outputs.add()
        output.name, output.datatype = name, datatype.removeprefix("TYPE_")
    samples = np.array([0, -3, 32767], dtype="<i2")
    response.raw_output_contents.extend([samples.tobytes(), np.int32(22050).tobytes()])
    chunk = wire.decode_response(response)
    assert chunk.samples.tolist() == [0, -3, 32767] and chunk.sample_rate == 22050
    assert not chunk.final

    final = service_pb2.ModelInferResponse(model_name="amy")
    final.parameters[wire.FINAL_RESPONSE].bool_param = True
    end = wire.decode_response(final)
    assert end.final and end.samples.size == 0 and end.sample_rate == 0
