"""Sequence and optional inputs and outputs, end to end: compiled for the lengths the samples
show, run from lists and None, refused in one line for what they were not compiled for."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edgec
from edgec import runtime
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.errors import SamplesError


def _seq_model() -> onnx.ModelProto:
    """xs: sequence of float[n, 4]; y = ConcatFromSequence(xs + [Relu(xs[0])]), parts = Relu(xs[0]) split in columns of 2."""
    seq = helper.make_tensor_sequence_value_info
    graph = helper.make_graph(
        [helper.make_node("SequenceAt", ["xs", "zero"], ["first"]),
         helper.make_node("Relu", ["first"], ["relu"]),
         helper.make_node("SequenceInsert", ["xs", "relu"], ["more"]),
         helper.make_node("ConcatFromSequence", ["more"], ["y"], axis=0),
         helper.make_node("SplitToSequence", ["relu", "two"], ["parts"], axis=1)],
        "seq", [seq("xs", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["total", 4]),
         seq("parts", TensorProto.FLOAT, ["n", 2])],
        [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
         helper.make_tensor("two", TensorProto.INT64, [], [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _lists(seed: int, length: int, rows: int = 2) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((rows, 4)).astype(np.float32) for _ in range(length)]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    proto = _seq_model()
    model = from_proto(proto, "seq")
    samples = [Sample(f"s{i}", {"xs": _lists(i, 3)}) for i in range(3)]
    path = tmp_path_factory.mktemp("seq") / "seq.edgec"
    edgec.compile(model, samples).artifact.save(path)
    return proto, path


def test_sequence_inputs_and_outputs_match_onnxruntime(compiled):
    proto, path = compiled
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = _lists(7, 3)
    got = runtime.load(path).run({"xs": xs})
    want_y, want_parts = session.run(None, {"xs": xs})
    np.testing.assert_allclose(got["y"], want_y, rtol=1e-6)
    assert isinstance(got["parts"], list) and len(got["parts"]) == len(want_parts)
    for part, want in zip(got["parts"], want_parts):
        np.testing.assert_allclose(part, want, rtol=1e-6)


def test_a_length_not_compiled_for_is_a_one_line_error(compiled):
    _, path = compiled
    with pytest.raises(SamplesError) as info:
        runtime.load(path).run({"xs": _lists(8, 5)})
    message = str(info.value)
    assert "xs" in message and "\n" not in message


def test_samples_that_disagree_on_a_length_are_a_one_line_error():
    model = from_proto(_seq_model(), "seq")
    samples = [Sample("a", {"xs": _lists(0, 2)}), Sample("b", {"xs": _lists(1, 3)})]
    with pytest.raises(edgec.errors.EdgecError) as info:
        edgec.compile(model, samples)
    assert "xs" in str(info.value) and "\n" not in str(info.value)
