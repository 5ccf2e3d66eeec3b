"""The stream model's gRPC wire format, written once: a request out, audio chunks in.

A stream is one `ModelInferRequest` of Triton's gRPC API (ModelStreamInfer) that carries
`TEXT` (BYTES [1]) and, where given, `SPEAKER_ID`, `LENGTH_SCALE`, `NOISE_SCALE` and `NOISE_W`,
and asks for the empty final response; each `ModelInferResponse` carries `AUDIO` (INT16 [-1])
and `SAMPLE_RATE` (INT32 [1]), the last one flagged `triton_final_response`. Tensor names and
types come from `engines.contract.names`. The streaming client (`engines.client.tts`), the
gateway's upstreams, the bench and the soak all speak through this module.

Tensors travel in `raw_input_contents` / `raw_output_contents`, little-endian; a BYTES
element is a 4-byte length, then the bytes (Triton's own serialisation).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.contract import names

# The request parameter that asks Triton for an empty final-flagged response, and that flag.
ENABLE_EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"
FINAL_RESPONSE = "triton_final_response"

# Triton's config types (`engines.contract.names.INPUTS`) as the gRPC API spells them.
_WIRE_TYPES = {"TYPE_STRING": "BYTES", "TYPE_INT32": "INT32", "TYPE_FP32": "FP32"}
DATATYPES: dict[str, str] = {name: _WIRE_TYPES[kind] for name, kind, _ in names.INPUTS}
_SCALAR_FORMATS = {"INT32": "<i", "FP32": "<f"}


def new_request(model: str, request_id: str = "", final_response: bool = True) -> Any:
    """An empty ModelInferRequest of `model`; `final_response`: ask for the empty
    final-flagged response, as every stream of the decoupled stream model should."""
    from tritonclient.grpc import service_pb2

    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    if final_response:
        request.parameters[ENABLE_EMPTY_FINAL_RESPONSE].bool_param = True
    return request


def add_bytes_input(
    request: Any, name: str, values: Sequence[bytes], shape: Sequence[int] | None = None
) -> None:
    """A BYTES input of `values` (shape [len(values)] unless given)."""
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = name, "BYTES"
    tensor.shape.extend(shape if shape is not None else [len(values)])
    request.raw_input_contents.append(b"".join(struct.pack("<I", len(v)) + v for v in values))


def add_scalar_input(request: Any, name: str, value: float, datatype: str | None = None) -> None:
    """A one-element INT32 or FP32 input; its type is the stream model's for `name` unless
    `datatype` says otherwise."""
    kind = datatype or DATATYPES[name]
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = name, kind
    tensor.shape.append(1)
    packed = int(value) if kind == "INT32" else float(value)
    request.raw_input_contents.append(struct.pack(_SCALAR_FORMATS[kind], packed))


def speech_request(
    voice: str,
    text: str | bytes,
    *,
    speaker_id: int | None = None,
    length_scale: float | None = None,
    noise_scale: float | None = None,
    noise_w: float | None = None,
    request_id: str | None = None,
    text_shape: Sequence[int] = (1,),
    final_response: bool = True,
) -> Any:
    """The request of one stream: `text` in `voice`, the optional inputs where given.

    `request_id` defaults to a fresh random id (None) so that Triton's logs tell streams
    apart; `text_shape` is [1, 1] for a model with a batch dimension (the bench's
    non-streaming baseline), and `final_response=False` for such a unary model."""
    request = new_request(
        voice, uuid.uuid4().hex if request_id is None else request_id, final_response
    )
    raw = text if isinstance(text, bytes) else text.encode("utf-8")
    add_bytes_input(request, names.TEXT, [raw], text_shape)
    for name, value in (
        (names.SPEAKER_ID, speaker_id),
        (names.LENGTH_SCALE, length_scale),
        (names.NOISE_SCALE, noise_scale),
        (names.NOISE_W, noise_w),
    ):
        if value is not None:
            add_scalar_input(request, name, value)
    return request


@dataclass(frozen=True)
class Chunk:
    """What one response of the stream model carries: int16 samples (none in an empty final
    response), their rate (0 where the response has none), and whether it ends the stream."""

    samples: np.ndarray
    sample_rate: int
    final: bool


def is_final(response: Any) -> bool:
    """Whether a ModelInferResponse is the last of its stream."""
    flags = response.parameters
    return FINAL_RESPONSE in flags and bool(flags[FINAL_RESPONSE].bool_param)


def decode_response(response: Any) -> Chunk:
    """The audio, sample rate and final flag of one ModelInferResponse."""
    samples = b""
    rate = 0
    contents = response.raw_output_contents
    for index, output in enumerate(response.outputs):
        if index >= len(contents):
            break
        if output.name == names.AUDIO:
            samples = contents[index]
        elif output.name == names.SAMPLE_RATE and len(contents[index]) >= 4:
            rate = struct.unpack("<i", contents[index][:4])[0]
    return Chunk(np.frombuffer(samples, dtype="<i2"), rate, is_final(response))
