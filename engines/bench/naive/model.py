"""triton-naive: the monolithic Piper voice as a plain (non-streaming) Triton Python model.

What a team gets from a blog post: phonemise the text, pad the phoneme ids of every request
in Triton's dynamic batch to the longest, run the whole VITS graph once, and cut each output
to its own length. The length comes from the graph itself: piper's alignment patch exposes
the per-phoneme durations (`w_ceil`), whose sum times the hop is the item's sample count.
Nothing is sent before the whole sentence is synthesised.

Inputs `TEXT` BYTES [1] (batched); outputs `AUDIO` INT16 [-1], `SAMPLE_RATE` INT32 [1].
Parameters (config.pbtxt): `voice_model` (path of the .onnx, its .onnx.json beside it) and
`intra_op_threads` (0 = onnxruntime's default).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

_MAX_WAV_VALUE = 32767.0


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        import onnx
        import onnxruntime
        from piper import PiperVoice
        from piper.patch_voice_with_alignment import add_alignment_output

        config = json.loads(args["model_config"])
        parameters = {
            key: value["string_value"] for key, value in config.get("parameters", {}).items()
        }
        model_path = parameters["voice_model"]
        # PiperVoice gives the phonemiser and the voice's config; the session is our own so
        # that it returns durations next to the audio.
        self._voice = PiperVoice.load(model_path)
        graph = onnx.load(model_path)
        add_alignment_output(graph)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = int(parameters.get("intra_op_threads", "0") or 0)
        self._session = onnxruntime.InferenceSession(
            graph.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        voice_config = self._voice.config
        self._hop = int(voice_config.hop_length)
        self._sample_rate = np.array([voice_config.sample_rate], dtype=np.int32)
        self._scales = np.array(
            [voice_config.noise_scale, voice_config.length_scale, voice_config.noise_w_scale],
            dtype=np.float32,
        )

    def _phoneme_ids(self, text: str) -> list[int]:
        ids: list[int] = []
        for sentence in self._voice.phonemize(text):
            if sentence:
                ids.extend(self._voice.phonemes_to_ids(sentence))
        return ids

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        batch: list[tuple[int, list[int]]] = []
        for index, request in enumerate(requests):
            raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            text = raw[0].decode("utf-8") if isinstance(raw[0], bytes) else str(raw[0])
            ids = self._phoneme_ids(text)
            if not ids:
                responses[index] = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(
                        "TEXT has nothing to speak (empty or only punctuation)",
                        pb_utils.TritonError.INVALID_ARG,
                    )
                )
                continue
            batch.append((index, ids))
        if batch:
            longest = max(len(ids) for _, ids in batch)
            padded = np.zeros((len(batch), longest), dtype=np.int64)
            for row, (_, ids) in enumerate(batch):
                padded[row, : len(ids)] = ids
            lengths = np.array([len(ids) for _, ids in batch], dtype=np.int64)
            audio, durations = self._session.run(
                None, {"input": padded, "input_lengths": lengths, "scales": self._scales}
            )
            audio = audio.reshape(len(batch), -1)
            samples = durations.reshape(len(batch), -1).sum(axis=1).astype(np.int64) * self._hop
            for row, (index, _) in enumerate(batch):
                pcm = np.clip(audio[row, : samples[row]] * _MAX_WAV_VALUE, -32767, 32767)
                responses[index] = pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("AUDIO", pcm.astype(np.int16).reshape(1, -1)),
                        pb_utils.Tensor("SAMPLE_RATE", self._sample_rate.reshape(1, 1)),
                    ]
                )
        return responses
