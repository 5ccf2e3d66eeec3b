from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines.artifacts.split import SplitError, split_voice
from engines.runtimes.onnx import OnnxStages
from engines.text.frontend import text_to_sentences
from engines.text.voice import Voice


def test_chained_stages_reproduce_the_monolithic_voice(joe: Voice, engine_dir: Path) -> None:
    ids = text_to_sentences("Streaming speech, one window at a time.", joe.config)[0].ids
    feeds = {
        "input": np.array([ids], dtype=np.int64),
        "input_lengths": np.array([len(ids)], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),  # noise off: deterministic
    }
    whole = ort.InferenceSession(str(joe.model_path), providers=["CPUExecutionProvider"])
    expected = whole.run(None, feeds)[0].reshape(-1)
    stages = OnnxStages(engine_dir)
    prior, mask = stages.encode(feeds["input"], feeds["input_lengths"], feeds["scales"])
    audio = stages.vocode(stages.flow(prior, mask)).reshape(-1)
    assert audio.shape == expected.shape
    assert np.array_equal(audio, expected)


def test_a_graph_without_the_cut_points_is_refused(tmp_path: Path) -> None:
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph), str(path))
    with pytest.raises(SplitError, match="Piper VITS"):
        split_voice(path, tmp_path / "out")
