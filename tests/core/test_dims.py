"""Dims as exporters write them: each unknown dim its own, one name where the graph ties them."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgec
from edgec import runtime
from edgec.core.model import from_proto
from edgec.core.samples import Sample
from edgec.core.targets import load_target


def _model(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "dims", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _vi(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def _dims(proto):
    model = from_proto(proto, "m")
    return {s.name: s.dims for s in model.inputs}


def test_question_marks_negative_sizes_and_unnamed_dims_are_each_their_own():
    proto = _model([helper.make_node("Identity", ["a"], ["x"]), helper.make_node("Identity", ["b"], ["y"])],
                   [_vi("a", ["?", "?", 3]), _vi("b", [-1, None, 3])],
                   [_vi("x", ["?", "?", 3]), _vi("y", [-1, None, 3])])
    dims = _dims(proto)
    assert dims == {"a": ("a_dim0", "a_dim1", 3), "b": ("b_dim0", "b_dim1", 3)}


def test_names_exporters_share_stay_shared():
    proto = _model([helper.make_node("Identity", ["a"], ["x"]), helper.make_node("Identity", ["b"], ["y"])],
                   [_vi("a", ["batch", "seq"]), _vi("b", ["batch", 7])],
                   [_vi("x", ["batch", "seq"]), _vi("y", ["batch", 7])])
    assert _dims(proto) == {"a": ("batch", "seq"), "b": ("batch", 7)}


def test_dims_the_graph_adds_or_contracts_become_one():
    w = numpy_helper.from_array(np.ones((4, 5), np.float32), "w")
    proto = _model([helper.make_node("Add", ["a", "b"], ["s"]),
                    helper.make_node("MatMul", ["s", "c"], ["t"]),
                    helper.make_node("MatMul", ["t", "w"], ["u"])],
                   [_vi("a", ["unk__1", "unk__2"]), _vi("b", ["unk__3", "unk__4"]),
                    _vi("c", ["unk__5", 4])],
                   [_vi("u", ["unk__6", 5])], [w])
    assert _dims(proto) == {"a": ("unk__1", "unk__2"), "b": ("unk__1", "unk__2"),
                            "c": ("unk__2", 4)}


@pytest.mark.parametrize("free", ["?", -1])
def test_a_model_with_unknown_dims_compiles_and_matches(free, tmp_path):
    proto = _model([helper.make_node("Add", ["a", "b"], ["c"])],
                   [_vi("a", [free, free, 3]), _vi("b", [free, free, 3])], [_vi("c", [free, free, 3])])
    model = from_proto(proto, "m")
    rng = np.random.default_rng(0)
    samples = [Sample(f"s{i}", {"a": rng.standard_normal(s).astype(np.float32),
                                "b": rng.standard_normal(s).astype(np.float32)})
               for i, s in enumerate([(2, 5, 3), (1, 4, 3), (2, 5, 3)])]
    compiled = edgec.compile(model, samples, [load_target("x86_64")])
    loaded = runtime.load(compiled.artifact.save(tmp_path / "m.edgec"))
    for sample in samples:
        got = loaded.run(sample.arrays)["c"]
        np.testing.assert_allclose(got, sample.arrays["a"] + sample.arrays["b"], rtol=1e-6)
